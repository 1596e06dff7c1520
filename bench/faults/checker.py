"""The checker: what a run's history says was lost, duplicated, reordered or made up.

A history is everything the clients saw: each add with its outcome (acknowledged with an id,
refused, or unknown: the reply never came), each read by each consumer (ids and payloads),
the positions the server confirmed for reliable consumers, the times of the faults, and a
final full read of every partition once the faults are over. The verdicts are Jepsen's, for
a log:

- **lost**: acknowledged, and not in the final read (nor discarded by retention after every
  reliable consumer had read it);
- **wrong id**: acknowledged with one id, stored under another;
- **duplicated**: one payload (or one producer key) stored under two ids;
- **reordered**: an add acknowledged before another was sent got the higher id, or a
  consumer read ids out of order within one session (where cuts may give the ids of lost
  events out again, ``History.ids_survive_cuts`` false, only events of the final read
  count for the first);
- **phantom**: read, but never added (or added and refused);
- **skipped**: a reliable consumer read past an event of the final read it never got;
- **delivered twice**: a reliable consumer got an event at or below a position the server had
  confirmed to it;
- **moved back**: a reliable consumer's confirmed position went below one confirmed before;
- **after takeover**: a push consumer's connection got events after a newer connection had
  taken the consumer over (its readyToReceive answered), except while the server of the old
  connection was stopped (SIGSTOP): a stopped process sends nothing, so what arrives then
  was in the kernels' buffers before it stopped (counted apart, as ``in_flight_at_pause``);
  nor a group its server reported it wrote after its claim lapsed (``late_write``: a pause
  struck between the claim's check and the write, which no check in the process can
  close; the history's ``late_writes``, from the servers' logs);
- **copied twice**, **not copied**: an aggregated stream holds a source event twice, or
  lacks one (the final read of the aggregate, once its copier caught up); an aggregate that
  changes the order of one source's events is **reordered**.

Payloads are told apart by a token each producer writes into its event (unique per add); an
add's id is the server's. Lost events are charged to the first fault after they were sent
(a reply may be read after the fault, but the add reached the server before it), with the
milliseconds of acknowledged history they span (:class:`CutLoss`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal

Outcome = Literal["ok", "refused", "unknown"]
#: A stored event as a read shows it: (id, token).
Seen = tuple[int, str]
DEFAULT_PARTITION: Final = "events/0"
#: Examples kept per verdict (the counts are complete).
EXAMPLES: Final = 5


@dataclass(frozen=True, slots=True)
class Add:
    """One addEvent: ``token`` identifies its payload; ``key`` is the producer's
    idempotency key, when it gave one (two adds of one key are one event)."""

    token: str
    invoked: float
    completed: float | None
    outcome: Outcome
    event_id: int | None = None
    partition: str = DEFAULT_PARTITION
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Read:
    """Events one consumer got in one reply (or one pushed group), in the order given."""

    consumer: str
    session: int
    time: float
    events: tuple[Seen, ...]
    partition: str = DEFAULT_PARTITION


@dataclass(frozen=True, slots=True)
class Ack:
    """The server confirmed ``position`` as a reliable consumer's (durably) at ``time``."""

    consumer: str
    time: float
    position: int
    partition: str = DEFAULT_PARTITION


@dataclass(frozen=True, slots=True)
class Claim:
    """Push connection ``session`` of ``consumer`` took it over at ``time``."""

    consumer: str
    session: int
    time: float


@dataclass
class History:
    adds: list[Add] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    #: The full read at the end, per partition, in id order.
    final: dict[str, list[Seen]] = field(default_factory=dict)
    #: Per partition, the highest id retention had discarded when the final read began.
    floors: dict[str, int] = field(default_factory=dict)
    #: Consumers that must get every event (registered ones).
    reliable: set[str] = field(default_factory=set)
    #: When each fault struck (the power cuts).
    cuts: list[float] = field(default_factory=list)
    #: When each push connection's readyToReceive answered: it holds its consumer from then.
    claims: list[Claim] = field(default_factory=list)
    #: Per push connection, the (SIGSTOP, SIGCONT) times of its server.
    paused: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=dict)
    #: Per aggregated stream: its source partitions, and its final read (id, token).
    copies: dict[str, tuple[list[str], list[Seen]]] = field(default_factory=dict)
    #: Per push consumer, the last ids of the groups a server reported it wrote after its
    #: claim had lapsed (a pause between the claim's check and the write: its log's warning).
    late_writes: dict[str, set[int]] = field(default_factory=dict)
    #: False where a power cut may take acknowledged events and give their ids out again
    #: (``--durability normal``): an event not in the final read (lost, or read and then
    #: discarded: after a cut the two look alike) does not set the order of later adds.
    ids_survive_cuts: bool = True

    def written_late(self, read: Read) -> bool:
        """``read`` is a group its server reported as written after its claim lapsed."""
        return bool(read.events) and read.events[-1][0] in self.late_writes.get(read.consumer, ())


@dataclass(frozen=True, slots=True)
class CutLoss:
    """What one fault took: acknowledged events, and the milliseconds from the oldest of
    them being acknowledged to the fault."""

    cut: int
    events: int
    ms: float


@dataclass
class Verdicts:
    adds: int = 0
    acknowledged: int = 0
    refused: int = 0
    unknown: int = 0
    #: Acknowledged events discarded by retention once read (not in the final read).
    discarded: int = 0
    lost: int = 0
    wrong_id: int = 0
    duplicated: int = 0
    reordered: int = 0
    phantom: int = 0
    skipped: int = 0
    delivered_twice: int = 0
    moved_back: int = 0
    after_takeover: int = 0
    copied_twice: int = 0
    not_copied: int = 0
    #: Groups a taken-over connection got while its server was stopped (not anomalies).
    in_flight_at_pause: int = 0
    #: Groups a server reported it wrote after its claim lapsed (a pause struck between
    #: the claim's check and the write); counted apart, not anomalies, by their reads.
    late_write: int = 0
    losses: list[CutLoss] = field(default_factory=list)
    #: A few examples of each verdict, by name.
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    ANOMALIES: ClassVar[tuple[str, ...]] = (
        "lost", "wrong_id", "duplicated", "reordered", "phantom", "skipped", "delivered_twice",
        "moved_back", "after_takeover", "copied_twice", "not_copied",
    )  # fmt: skip

    def note(self, verdict: str, example: str) -> None:
        setattr(self, verdict, getattr(self, verdict) + 1)
        if len(self.examples[verdict]) < EXAMPLES:
            self.examples[verdict].append(example)

    @property
    def valid(self) -> bool:
        """No anomaly at all."""
        return not any(getattr(self, name) for name in self.ANOMALIES)

    def counts(self) -> dict[str, int]:
        names = ("adds", "acknowledged", "refused", "unknown", "discarded", *self.ANOMALIES)
        return {name: getattr(self, name) for name in names}

    def describe(self) -> str:
        """The counts in one line, then the examples of each anomaly found."""
        lines = [", ".join(f"{name} {count}" for name, count in self.counts().items())]
        for name in self.ANOMALIES:
            for example in self.examples.get(name, ()):
                lines.append(f"  {name}: {example}")
        return "\n".join(lines)


def check(history: History) -> Verdicts:
    """The verdicts of ``history`` (see the module's docstring)."""
    verdicts = Verdicts()
    by_token: dict[str, list[Add]] = defaultdict(list)
    for add in history.adds:
        by_token[add.token].append(add)
        verdicts.adds += 1
        if add.outcome == "ok":
            verdicts.acknowledged += 1
        elif add.outcome == "refused":
            verdicts.refused += 1
        else:
            verdicts.unknown += 1
    final = {
        (partition, token): event_id
        for partition, events in history.final.items()
        for event_id, token in events
    }
    _phantoms(history, by_token, verdicts)
    _duplicates(history, by_token, verdicts)
    readers = _readers(history)
    stored = _acknowledged(history, final, readers, verdicts)
    if not history.ids_survive_cuts:
        stored = [add for add in stored if (add.partition, add.token) in final]
    _real_time_order(history, stored, verdicts)
    _consumers(history, readers, verdicts)
    _positions(history, verdicts)
    _takeovers(history, verdicts)
    _copies(history, verdicts)
    return verdicts


def _all_reads(history: History) -> Iterable[tuple[str, Seen]]:
    for read in history.reads:
        for seen in read.events:
            yield read.partition, seen
    for partition, events in history.final.items():
        for seen in events:
            yield partition, seen


def _phantoms(history: History, by_token: dict[str, list[Add]], verdicts: Verdicts) -> None:
    reported: set[str] = set()
    for partition, (event_id, token) in _all_reads(history):
        adds = by_token.get(token, ())
        if token in reported or any(a.outcome != "refused" for a in adds):
            continue
        reported.add(token)
        why = "refused when added" if adds else "never added"
        verdicts.note("phantom", f"{token} read at {partition} id {event_id}: {why}")


def _duplicates(history: History, by_token: dict[str, list[Add]], verdicts: Verdicts) -> None:
    """One identity (the key, else the token) under two ids, in any read."""
    places: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for partition, (event_id, token) in _all_reads(history):
        adds = by_token.get(token)
        identity = next((a.key for a in adds or () if a.key is not None), token)
        places[identity].add((partition, event_id))
    for identity, where in places.items():
        if len(where) > 1:
            ids = ", ".join(f"{p} id {i}" for p, i in sorted(where))
            verdicts.note("duplicated", f"{identity} stored as {ids}")


def _readers(history: History) -> dict[str, dict[str, set[str]]]:
    """Per partition, per reliable consumer: the tokens it read."""
    readers: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for read in history.reads:
        if read.consumer in history.reliable:
            readers[read.partition][read.consumer].update(token for _id, token in read.events)
    return readers


def _acknowledged(
    history: History,
    final: dict[tuple[str, str], int],
    readers: dict[str, dict[str, set[str]]],
    verdicts: Verdicts,
) -> list[Add]:
    """Lost and wrong-id verdicts; returns the acknowledged adds found stored (or
    discarded after every reliable consumer read them), and charges each loss to a cut."""
    stored: list[Add] = []
    lost_at: dict[int, list[float]] = defaultdict(list)
    for add in history.adds:
        if add.outcome != "ok":
            continue
        assert add.event_id is not None
        found = final.get((add.partition, add.token))
        if found is not None:
            if found != add.event_id:
                verdicts.note(
                    "wrong_id", f"{add.token} acknowledged as id {add.event_id}, stored as {found}"
                )
            stored.append(add)
            continue
        consumers = readers.get(add.partition, {})
        if add.event_id <= history.floors.get(add.partition, 0) and all(
            add.token in tokens for tokens in consumers.values()
        ):
            verdicts.discarded += 1
            stored.append(add)
            continue
        verdicts.note("lost", f"{add.token} acknowledged as {add.partition} id {add.event_id}")
        assert add.completed is not None
        cut = bisect.bisect_left(history.cuts, add.invoked)
        lost_at[cut].append(add.completed)
    for cut, times in sorted(lost_at.items()):
        when = history.cuts[cut] if cut < len(history.cuts) else max(times)
        verdicts.losses.append(CutLoss(cut, len(times), (when - min(times)) * 1000))
    return stored


def _real_time_order(history: History, stored: list[Add], verdicts: Verdicts) -> None:
    """An add acknowledged before another was sent must have the lower id (per partition)."""
    by_partition: dict[str, list[Add]] = defaultdict(list)
    for add in stored:
        by_partition[add.partition].append(add)
    for adds in by_partition.values():
        done = sorted(adds, key=lambda a: a.completed or 0.0)
        highest: Add | None = None
        i = 0
        for add in sorted(adds, key=lambda a: a.invoked):
            while i < len(done) and (done[i].completed or 0.0) < add.invoked:
                if highest is None or (done[i].event_id or 0) > (highest.event_id or 0):
                    highest = done[i]
                i += 1
            if highest is not None and (highest.event_id or 0) > (add.event_id or 0):
                verdicts.note(
                    "reordered",
                    f"{add.token} got id {add.event_id}, below id {highest.event_id} of "
                    f"{highest.token}, acknowledged before it was sent",
                )


def _consumers(
    history: History, readers: dict[str, dict[str, set[str]]], verdicts: Verdicts
) -> None:
    """Order within a session; skips and deliveries past a confirmed position."""
    last: dict[tuple[str, str, int], int] = {}
    highest: dict[tuple[str, str], int] = defaultdict(int)
    acks: dict[tuple[str, str], list[Ack]] = defaultdict(list)
    for ack in sorted(history.acks, key=lambda a: a.time):
        acks[(ack.partition, ack.consumer)].append(ack)
    confirmed: dict[tuple[str, str], int] = defaultdict(int)
    taken: dict[tuple[str, str], int] = defaultdict(int)
    for read in sorted(history.reads, key=lambda r: r.time):
        consumer = (read.partition, read.consumer)
        pending = acks.get(consumer, [])
        while taken[consumer] < len(pending) and pending[taken[consumer]].time <= read.time:
            confirmed[consumer] = max(confirmed[consumer], pending[taken[consumer]].position)
            taken[consumer] += 1
        session = (read.partition, read.consumer, read.session)
        late = history.written_late(read)
        for event_id, token in read.events:
            previous = last.get(session)
            if previous is not None and event_id <= previous:
                verdicts.note(
                    "reordered", f"{read.consumer} read id {event_id} after id {previous}"
                )
            last[session] = event_id
            highest[consumer] = max(highest[consumer], event_id)
            if read.consumer in history.reliable and event_id <= confirmed[consumer] and not late:
                verdicts.note(
                    "delivered_twice",
                    f"{read.consumer} got id {event_id} ({token}) after the server confirmed "
                    f"its position {confirmed[consumer]}",
                )
    for partition, consumers in readers.items():
        for name, tokens in consumers.items():
            top = highest[(partition, name)]
            for event_id, token in history.final.get(partition, ()):
                if event_id > top:
                    break
                if token not in tokens:
                    verdicts.note(
                        "skipped", f"{name} read past {partition} id {event_id} ({token})"
                    )


def _positions(history: History, verdicts: Verdicts) -> None:
    """A confirmed position never goes back."""
    highest: dict[tuple[str, str], int] = defaultdict(int)
    for ack in sorted(history.acks, key=lambda a: a.time):
        consumer = (ack.partition, ack.consumer)
        if ack.position < highest[consumer]:
            verdicts.note(
                "moved_back",
                f"{ack.consumer} confirmed at {ack.position} after {highest[consumer]}",
            )
        highest[consumer] = max(highest[consumer], ack.position)


def _takeovers(history: History, verdicts: Verdicts) -> None:
    """Reads of a push connection after a newer one took its consumer over."""
    taken: dict[tuple[str, int], float] = {}
    newest: dict[str, Claim] = {}
    for claim in sorted(history.claims, key=lambda c: c.time):
        previous = newest.get(claim.consumer)
        if previous is not None:
            taken[(claim.consumer, previous.session)] = claim.time
        newest[claim.consumer] = claim
    for read in history.reads:
        since = taken.get((read.consumer, read.session))
        if since is None or read.time < since:
            continue
        pauses = history.paused.get((read.consumer, read.session), [])
        if any(stop <= read.time <= cont for stop, cont in pauses):
            verdicts.in_flight_at_pause += 1
            continue
        if history.written_late(read):
            verdicts.late_write += 1
            continue
        ids = f"ids {read.events[0][0]}-{read.events[-1][0]}" if read.events else "no events"
        verdicts.note(
            "after_takeover",
            f"{read.consumer} connection {read.session} got {ids} "
            f"{(read.time - since) * 1000:.0f} ms after it was taken over",
        )


def _copies(history: History, verdicts: Verdicts) -> None:
    """Each event of the sources' final reads once in the aggregate, in its source's order."""
    for name, (sources, rows) in history.copies.items():
        where: dict[str, int] = {}
        for place, (event_id, token) in enumerate(rows):
            if token in where:
                verdicts.note("copied_twice", f"{token} copied into {name} twice (id {event_id})")
            else:
                where[token] = place
        for source in sources:
            previous: tuple[int, int] | None = None  # (place in the aggregate, source id)
            for event_id, token in history.final.get(source, ()):
                if token not in where:
                    verdicts.note("not_copied", f"{source} id {event_id} ({token}) not in {name}")
                    continue
                if previous is not None and where[token] < previous[0]:
                    verdicts.note(
                        "reordered",
                        f"{name} holds {source} id {event_id} before id {previous[1]}",
                    )
                previous = (where[token], event_id)
