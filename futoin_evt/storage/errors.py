"""The storage errors: what a store call raises, each a :class:`StoreError`.

::

    StoreError
    ├── StoreClosed        the store was closed before a write could commit
    ├── NotWritable        events go into an aggregated stream only by its copying
    ├── SchemaChanged      a subject's newest schema moved on during a registration
    ├── DamagedEvent       an event read does not match its checksum (never served)
    ├── StoreDamaged       SQLite's quick check found the database file malformed
    ├── StoreUnavailable   the database cannot be opened (bad URL, unreachable, no driver)
    │   └── StoreUnreachable   it does not answer now (refused, lost, no pooled connection
    │                          in time): trying again later may succeed; raised by calls too
    └── SchemaTooNew       the database was written by a newer futoin-evt
"""

from __future__ import annotations

from ..domain.partition import Partition


class StoreError(Exception):
    """Root of the storage errors."""


class StoreClosed(StoreError, RuntimeError):
    """The store was closed before the write could be committed."""


class NotWritable(StoreError, ValueError):
    """An append to a partition of an aggregated stream: only the copying from its source
    adds events there (:meth:`~.base.Aggregates.copy_into_aggregate`)."""

    def __init__(self, partition: Partition, source: str | None = None) -> None:
        of = f" of {source}" if source else ""
        super().__init__(
            f"the stream {partition.stream} is an aggregate{of}: events go into its source"
        )
        self.partition = partition


class DamagedEvent(StoreError):
    """An event read from the database does not match its checksum: its type, data, time or
    content type changed after it was stored (a damaged disk or file, a hand edit). The read
    fails; the event is never served with changed content."""

    def __init__(self, partition: Partition, event_id: int) -> None:
        super().__init__(
            f"event {event_id} in partition {partition} is damaged"
            " (its stored content does not match its checksum)"
        )
        self.partition = partition
        self.event_id = event_id


class StoreDamaged(StoreError):
    """The database file is malformed (SQLite's ``quick_check`` says so); one sentence."""


class StoreUnavailable(StoreError):
    """The database cannot be opened; the message is one sentence for the user."""


class StoreUnreachable(StoreUnavailable):
    """The database does not answer now: the connection is refused or was lost, or no
    pooled connection came free within the bound. Trying again later may succeed."""


class SchemaTooNew(StoreError):
    """The database schema is newer than this futoin-evt knows."""

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the database has schema version {found}, newer than this futoin-evt knows "
            f"({known}); upgrade futoin-evt"
        )
        self.found = found
        self.known = known


class SchemaChanged(StoreError):
    """A subject's newest live version moved on while a new one was being checked (another
    registration came first): check against the new newest and try again."""
