"""Idempotent producers: each (producer id, partition) numbers its batches, and a batch sent
again answers the offset it got the first time instead of being stored twice. No I/O.

As Kafka keeps them: the last :data:`KEPT_BATCHES` batches per producer and partition. A batch
whose first sequence number is the next one expected is stored; one that repeats a kept batch
answers that batch's base offset (once stored); any other gets
OUT_OF_ORDER_SEQUENCE_NUMBER, and an older epoch INVALID_PRODUCER_EPOCH. The numbers are this
process's: after a restart a producer's first batch is taken as it comes.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Awaitable, Sequence
from typing import Final

from . import wire
from .records import RecordBatch

KEPT_BATCHES: Final = 5
#: Producers remembered at once (the least recently heard from are forgotten).
MAX_PRODUCERS: Final = 100_000
_SEQUENCE_SPAN: Final = 1 << 31

Answer = tuple[int, int, str | None]


class _Kept:
    """A batch of a producer on a partition: its sequence numbers and its base offset."""

    __slots__ = ("first", "last", "stored")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        #: The base offset once stored.
        self.stored: asyncio.Future[int] = asyncio.get_running_loop().create_future()


class _Producer:
    __slots__ = ("epoch", "kept", "next")

    def __init__(self, epoch: int, next_sequence: int) -> None:
        self.epoch = epoch
        self.next = next_sequence
        self.kept: list[_Kept] = []


class Sequenced:
    """What :meth:`ProducerStates.check` decided: ``answer`` when the batch is not to be
    stored; else the caller appends and then says :meth:`stored` or :meth:`failed`."""

    __slots__ = ("_kept", "_state", "answer")

    def __init__(
        self,
        answer: Awaitable[Answer] | None = None,
        state: _Producer | None = None,
        kept: _Kept | None = None,
    ) -> None:
        self.answer = answer
        self._state = state
        self._kept = kept

    def stored(self, base_offset: int) -> None:
        if self._kept is not None and not self._kept.stored.done():
            self._kept.stored.set_result(base_offset)

    def failed(self) -> None:
        """The batch was not stored: the producer may send it again with the same numbers."""
        kept, state = self._kept, self._state
        if kept is None or state is None:
            return
        if kept in state.kept:
            state.kept.remove(kept)
            state.next = kept.first
        if not kept.stored.done():
            kept.stored.set_exception(_NotStored())
            kept.stored.exception()  # nobody may be waiting


class _NotStored(Exception):
    pass


_NOT_SEQUENCED: Final = Sequenced()


class ProducerStates:
    def __init__(self) -> None:
        self._producers: OrderedDict[tuple[int, int], _Producer] = OrderedDict()
        self._next_id = random.getrandbits(40)

    def new_producer_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def check(self, partition_key: int, batches: Sequence[RecordBatch], count: int) -> Sequenced:
        """The decision for a Produce's batches on one partition (``count`` records in all),
        by the first batch's producer id, epoch and first sequence number."""
        first = batches[0]
        producer_id = first.producer_id
        if producer_id < 0 or first.base_sequence < 0:
            return _NOT_SEQUENCED
        key = (producer_id, partition_key)
        state = self._producers.get(key)
        sequence = first.base_sequence
        last = (sequence + count - 1) % _SEQUENCE_SPAN
        if state is None or first.producer_epoch > state.epoch:
            state = _Producer(first.producer_epoch, sequence)
            self._producers[key] = state
            while len(self._producers) > MAX_PRODUCERS:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(key)
        if first.producer_epoch < state.epoch:
            return Sequenced(_settled((wire.INVALID_PRODUCER_EPOCH, -1, None)))
        if sequence != state.next:
            for kept in state.kept:
                if kept.first == sequence and kept.last == last:
                    return Sequenced(_repeated(kept))
            message = f"expected sequence number {state.next}, got {sequence}"
            return Sequenced(_settled((wire.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, message)))
        kept = _Kept(sequence, last)
        state.kept.append(kept)
        del state.kept[:-KEPT_BATCHES]
        state.next = (last + 1) % _SEQUENCE_SPAN
        return Sequenced(None, state, kept)


async def _settled(answer: Answer) -> Answer:
    return answer


async def _repeated(kept: _Kept) -> Answer:
    try:
        base = await asyncio.shield(kept.stored)
    except _NotStored:
        return wire.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, "the first copy of this batch failed"
    return wire.NONE, base, None
