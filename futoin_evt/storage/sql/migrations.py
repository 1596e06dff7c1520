"""What both backends' schemas share: the versions of the steps added since the first nine
(each named by the module of what it adds), and the columns of a partition's events table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from ..checksums import ATTRS_VERSION, CHECKSUMS_VERSION, add_attrs_sql, add_column_sql
from ..dedup import KEYED_ROWS_VERSION, KEYS_VERSION, WRITER_KEYS_VERSION
from .kafka import KAFKA_VERSION
from .schemas import SCHEMAS_VERSION
from .scram import SCRAM_VERSION
from .sessions import SESSIONS_VERSION
from .termini import TERMINI_VERSION

_Step = TypeVar("_Step")


def migrations(
    first: Sequence[_Step],
    *,
    termini: _Step,
    schemas: _Step,
    sessions: _Step,
    keys: _Step,
    checksums: _Step,
    writer_keys: _Step,
    attrs: _Step,
    scram: _Step,
    kafka: _Step,
    keyed_rows: _Step,
) -> dict[int, _Step]:
    """The steps by the version each makes: ``first`` from version 1, then the others at
    their versions."""
    return {
        **dict(enumerate(first, 1)),
        TERMINI_VERSION: termini,
        SCHEMAS_VERSION: schemas,
        SESSIONS_VERSION: sessions,
        KEYS_VERSION: keys,
        CHECKSUMS_VERSION: checksums,
        WRITER_KEYS_VERSION: writer_keys,
        ATTRS_VERSION: attrs,
        SCRAM_VERSION: scram,
        KAFKA_VERSION: kafka,
        KEYED_ROWS_VERSION: keyed_rows,
    }


#: The versions that add a column to every partition's events table, with that step for one
#: table: a version's own step adds it to ``events``/0's, the backend's schema to the others'.
EVERY_EVENTS_TABLE: Final[dict[int, Callable[[str], str]]] = {
    CHECKSUMS_VERSION: add_column_sql,
    ATTRS_VERSION: add_attrs_sql,
}


def events_table_sql(key: int, id_column: str, key_type: str = "TEXT") -> str:
    """Creates the events table of partition ``key`` (> 0) as the migrations left that of
    ``events``/0, every column included; ``id_column``: the backend's identity column,
    ``key_type``: its type of a producer's key (see :data:`..dedup.KEY_COLUMNS`)."""
    return (
        f"CREATE TABLE events_{key} (id {id_column}, type TEXT NOT NULL, data TEXT NOT NULL,"
        " ts TEXT NOT NULL, content_type TEXT, checksum BIGINT, attrs TEXT,"
        f" key_user_id BIGINT, key {key_type}, key_at BIGINT)"
    )
