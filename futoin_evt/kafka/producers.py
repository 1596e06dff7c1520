"""Idempotent producers: each (producer id, partition) numbers its batches, and a batch sent
again answers the offset it got the first time instead of being stored twice. No I/O.

As Kafka keeps them: the last :data:`KEPT_BATCHES` batches per producer and partition. A batch
whose first sequence number is the next one expected is stored; one that repeats a kept batch
answers that batch's base offset (once stored); any other gets
OUT_OF_ORDER_SEQUENCE_NUMBER, and an older epoch INVALID_PRODUCER_EPOCH.

With the database's :class:`~futoin_evt.log.kafka.KafkaShared`, producer ids come from it
(never given twice) and each producer's last batches on a partition are kept there once
stored, before the answer (after the events' commit, not in it: a crash between the two
forgets that batch's numbers). This process answers from what it remembers; it reads the
database for a producer it has not seen on the partition, and again for a batch out of order
once its own batches are kept (another process may have taken the partition over). Without
it, or for a producer the database does not know, a producer's first batch is taken as it
comes.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from ..log.kafka import KafkaShared
from . import wire
from .records import RecordBatch

KEPT_BATCHES: Final = 5
#: Producers remembered at once (the least recently heard from are forgotten).
MAX_PRODUCERS: Final = 100_000
_SEQUENCE_SPAN: Final = 1 << 31

Answer = tuple[int, int, str | None]

logger = logging.getLogger(__name__)


class _Kept:
    """A batch of a producer on a partition: its sequence numbers and its base offset."""

    __slots__ = ("first", "last", "stored")

    def __init__(self, first: int, last: int, base: int | None = None) -> None:
        self.first = first
        self.last = last
        #: The base offset once stored.
        self.stored: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if base is not None:
            self.stored.set_result(base)

    def row(self) -> tuple[int, int, int] | None:
        """(first, last, base offset) once stored."""
        stored = self.stored
        if not stored.done() or stored.exception() is not None:
            return None
        return self.first, self.last, stored.result()


class _Producer:
    __slots__ = ("epoch", "kept", "next")

    def __init__(self, epoch: int, next_sequence: int) -> None:
        self.epoch = epoch
        self.next = next_sequence
        self.kept: list[_Kept] = []


class Sequenced:
    """What :meth:`ProducerStates.check` decided: ``answer`` when the batch is not to be
    stored; else the caller appends and then says :meth:`stored` or :meth:`failed`."""

    __slots__ = ("_keep", "_kept", "_state", "answer")

    def __init__(
        self,
        answer: Awaitable[Answer] | None = None,
        state: _Producer | None = None,
        kept: _Kept | None = None,
        keep: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.answer = answer
        self._state = state
        self._kept = kept
        self._keep = keep

    async def stored(self, base_offset: int) -> None:
        """The batch is stored at ``base_offset``: returns once its numbers are kept."""
        if self._kept is not None and not self._kept.stored.done():
            self._kept.stored.set_result(base_offset)
        if self._keep is not None:
            await self._keep()

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


#: A producer on a partition: (producer id, partition key).
_Key = tuple[int, int]
#: What continues a Produce once its producer's state is known: appends and answers.
Continue = Callable[[Sequenced], Awaitable[Answer]]
#: A Produce's batches on a partition waiting for their producer's state: the batches, their
#: record count, what continues them, and their answer.
_Waiting = tuple[Sequence[RecordBatch], int, Continue, "asyncio.Future[Answer]"]


class ProducerStates:
    """The producers' states (see the module), ``shared`` in the database when given."""

    def __init__(self, shared: KafkaShared | None = None) -> None:
        self._shared = shared
        self._producers: OrderedDict[_Key, _Producer] = OrderedDict()
        self._next_id = random.getrandbits(40)
        #: Producers whose state is read from the database, each with the batches that came
        #: meanwhile (continued in their order once it is read).
        self._loading: dict[_Key, list[_Waiting]] = {}
        #: States to keep in the database, and who waits for the round that keeps them.
        self._dirty: dict[_Key, _Producer] = {}
        self._kept_round: asyncio.Future[None] | None = None
        self._keeping: asyncio.Task[None] | None = None

    async def new_producer_id(self) -> int:
        if self._shared is not None:
            return await self._shared.new_producer_id()
        self._next_id += 1
        return self._next_id

    def sequence(
        self, partition_key: int, batches: Sequence[RecordBatch], count: int, then: Continue
    ) -> Awaitable[Answer]:
        """Decide on a Produce's batches on one partition (``count`` records in all), by the
        first batch's producer id, epoch and first sequence number, and continue with
        ``then`` (at once when the producer's state is known here: appends are queued in
        the order requests come)."""
        first = batches[0]
        key = (first.producer_id, partition_key)
        waiting = self._loading.get(key)
        if waiting is not None:
            answer = asyncio.get_running_loop().create_future()
            waiting.append((batches, count, then, answer))
            return answer
        sequenced = self._check(key, batches, count, fresh=self._shared is None)
        if sequenced is not None:
            return then(sequenced)
        answer = asyncio.get_running_loop().create_future()
        self._loading[key] = [(batches, count, then, answer)]
        asyncio.get_running_loop().create_task(self._load(key))
        return answer

    async def _load(self, key: _Key) -> None:
        """Read a producer's state from the database, then continue the batches waiting."""
        assert self._shared is not None
        try:
            found = await self._shared.producer_batches(*key)
        except Exception as exc:  # taken as it comes, as without a database
            logger.warning("the Kafka producer %d's batches could not be read: %s", key[0], exc)
            found = None
        if found is not None:  # else what this process remembers, if anything, stays
            epoch, rows = found
            state = _Producer(epoch, (rows[-1][1] + 1) % _SEQUENCE_SPAN if rows else 0)
            state.kept = [_Kept(first, last, base) for first, last, base in rows]
            self._remember(key, state)
        for batches, count, then, answer in self._loading.pop(key):
            sequenced = self._check(key, batches, count, fresh=True)
            assert sequenced is not None
            _chain(then(sequenced), answer)

    def _check(
        self, key: _Key, batches: Sequence[RecordBatch], count: int, *, fresh: bool
    ) -> Sequenced | None:
        """The decision; None when the database is to be read first (unless ``fresh``)."""
        first = batches[0]
        if first.producer_id < 0 or first.base_sequence < 0:
            return _NOT_SEQUENCED
        state = self._producers.get(key)
        if state is None and not fresh:
            return None
        sequence = first.base_sequence
        last = (sequence + count - 1) % _SEQUENCE_SPAN
        if state is None or first.producer_epoch > state.epoch:
            state = _Producer(first.producer_epoch, sequence)
            self._remember(key, state)
        else:
            self._producers.move_to_end(key)
        if first.producer_epoch < state.epoch:
            return Sequenced(_settled((wire.INVALID_PRODUCER_EPOCH, -1, None)))
        if sequence != state.next:
            for kept in state.kept:
                if kept.first == sequence and kept.last == last:
                    return Sequenced(_repeated(kept))
            if not fresh and key not in self._dirty and all(k.stored.done() for k in state.kept):
                return None  # another process may have stored the producer's batches since
            message = f"expected sequence number {state.next}, got {sequence}"
            return Sequenced(_settled((wire.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, message)))
        kept = _Kept(sequence, last)
        state.kept.append(kept)
        del state.kept[:-KEPT_BATCHES]
        state.next = (last + 1) % _SEQUENCE_SPAN
        keep = None if self._shared is None else lambda: self._keep(key, state)
        return Sequenced(None, state, kept, keep)

    def _remember(self, key: _Key, state: _Producer) -> None:
        self._producers[key] = state
        while len(self._producers) > MAX_PRODUCERS:
            self._producers.popitem(last=False)

    def _keep(self, key: _Key, state: _Producer) -> Awaitable[None]:
        """Keep the producer's stored batches in the database, with those of the other
        producers stored meanwhile (one transaction a round)."""
        self._dirty[key] = state
        if self._kept_round is None:
            self._kept_round = asyncio.get_running_loop().create_future()
        if self._keeping is None:
            self._keeping = asyncio.get_running_loop().create_task(self._keep_rounds())
        return asyncio.shield(self._kept_round)

    async def _keep_rounds(self) -> None:
        assert self._shared is not None
        try:
            while self._dirty:
                dirty, self._dirty = self._dirty, {}
                done, self._kept_round = self._kept_round, None
                rows = [
                    (producer_id, partition_key, state.epoch, kept)
                    for (producer_id, partition_key), state in dirty.items()
                    if (kept := [row for k in state.kept if (row := k.row()) is not None])
                ]
                try:
                    await self._shared.keep_producer_batches(rows)
                except Exception as exc:  # stored all the same: answered as such
                    logger.warning("Kafka producers' batches could not be kept: %s", exc)
                if done is not None:
                    done.set_result(None)
        finally:
            self._keeping = None


def _chain(source: Awaitable[Answer], target: asyncio.Future[Answer]) -> None:
    async def forward() -> None:
        try:
            result = await source
        except BaseException as exc:
            if not target.done():
                target.set_exception(exc)
            raise
        if not target.done():
            target.set_result(result)

    asyncio.get_running_loop().create_task(forward())


async def _settled(answer: Answer) -> Answer:
    return answer


async def _repeated(kept: _Kept) -> Answer:
    try:
        base = await asyncio.shield(kept.stored)
    except _NotStored:
        return wire.OUT_OF_ORDER_SEQUENCE_NUMBER, -1, "the first copy of this batch failed"
    return wire.NONE, base, None
