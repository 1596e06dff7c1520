"""``futoin-evt check``: scrub a database and say what is damaged in it."""

from __future__ import annotations

import argparse
from typing import Final

from ..storage import check_database
from ..storage.errors import StoreDamaged
from .common import CliError, Commands, add_db

#: Damaged events listed one by one; the rest are counted.
LISTED: Final = 1000


def add_commands(commands: Commands) -> None:
    check = commands.add_parser(
        "check",
        help="check every stored event against its checksum (and SQLite's file structure); "
        "exits 1 when something is damaged",
    )
    add_db(check)
    check.set_defaults(run=_check)


async def _check(args: argparse.Namespace) -> int:
    try:
        report = await check_database(args.db)
    except StoreDamaged as exc:  # too damaged for its schema to be read
        raise CliError(str(exc).rstrip(".") + ".") from None
    print(f"database: {report.description}")
    if report.integrity is not None:
        print(f"SQLite integrity_check: {'; '.join(report.integrity)}")
    for note in report.notes:
        print(note)
    print(f"events matching their checksums: {report.checked}")
    print(f"events stored before checksums (not checked): {report.unchecked}")
    for partition, event_id in report.damaged[:LISTED]:
        print(f"damaged: event {event_id} in partition {partition}")
    if len(report.damaged) > LISTED:
        print(f"damaged: {len(report.damaged) - LISTED} more events")
    for partition, reason in report.unreadable:
        print(f"unreadable: partition {partition}: {reason}")
    if report.sound:
        print("nothing damaged")
        return 0
    print(f"DAMAGED: {len(report.damaged)} events do not match their checksums"
          + ("; the file's structure is damaged" if report.integrity not in (None, ["ok"]) else "")
          + (f"; {len(report.unreadable)} partitions could not be read whole"
             if report.unreadable else ""))  # fmt: skip
    return 1
