"""The names of one partition's tables, the same in every backend. No I/O.

``events``/0 (key 0) keeps the tables of a single-log database (``events``, ``dcb_events``,
``event_tags``), so a migration never rewrites a large log; partition key ``k`` has
``events_k``, ``dcb_events_k`` and ``event_tags_k``. Names are built from the integer key
only: nothing from a request is ever part of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..domain.partition import Partition, StreamInfo


@dataclass(frozen=True, slots=True)
class Tables:
    key: int
    events: str
    dcb_events: str
    event_tags: str

    @classmethod
    def of(cls, key: int) -> Tables:
        if not isinstance(key, int) or key < 0:
            raise ValueError(f"bad partition key {key!r}")
        suffix = f"_{key}" if key else ""
        return cls(key, f"events{suffix}", f"dcb_events{suffix}", f"event_tags{suffix}")


#: One statement of a transaction written as a generator (the h11 way: the backend runs
#: each in its transaction and sends the rows back): SQL and its parameters.
Step = tuple[str, Sequence[Any]]

#: The tables of ``events``/0.
DEFAULT_TABLES = Tables.of(0)


#: The registry's rows, one per partition (a backend adds WHERE and ORDER BY s.name, number).
STREAM_ROWS: Final = (
    "SELECT s.name, s.created_at, s.aggregate_of, p.number, p.key"
    " FROM streams s JOIN partitions p ON p.stream = s.name"
)


def stream_infos(rows: Iterable[Sequence[Any]]) -> list[StreamInfo]:
    """Rows of :data:`STREAM_ROWS`, ordered by stream and partition number."""
    infos: list[StreamInfo] = []
    for name, created_at, aggregate_of, number, key in rows:
        partition = Partition(str(name), int(number), int(key))
        if infos and infos[-1].name == name:
            last = infos[-1]
            infos[-1] = StreamInfo(
                last.name, (*last.partitions, partition), last.created_at, last.aggregate_of
            )
        else:
            infos.append(StreamInfo(str(name), (partition,), str(created_at), aggregate_of))
    return infos
