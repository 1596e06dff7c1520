"""``futoin-evt stream``: streams and their partitions in the database, without a server."""

from __future__ import annotations

import argparse
from typing import Any

from ..domain.partition import (
    DEFAULT_STREAM,
    MAX_PARTITIONS,
    StreamInfo,
    check_partition_count,
    check_stream_name,
)
from ..storage.base import Store
from .common import BadSetting, Commands, add_db, opened_store, print_json


def add_commands(commands: Commands) -> None:
    stream = commands.add_parser("stream", help="manage streams and partitions").add_subparsers(
        dest="stream_command", required=True, metavar="ACTION"
    )
    add = stream.add_parser("add", help="add a stream of partitions")
    add.add_argument("name")
    _add_partitions(add, required=False)
    add.add_argument(
        "--aggregate",
        metavar="SOURCE",
        help="a stream of one partition that every serving process fills with every event "
        "of every partition of SOURCE (new ids, each partition's order kept)",
    )
    add_db(add)
    add.set_defaults(run=_stream_add)
    listing = stream.add_parser("list", help="list streams")
    listing.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_db(listing)
    listing.set_defaults(run=_stream_list)
    info = stream.add_parser(
        "info", help="a stream's partitions: head, oldest id, consumers and their lag"
    )
    info.add_argument("name")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_db(info)
    info.set_defaults(run=_stream_info)
    grow = stream.add_parser("grow", help="add partitions to a stream (never fewer)")
    grow.add_argument("name")
    _add_partitions(grow)
    add_db(grow)
    grow.set_defaults(run=_stream_grow)
    drop = stream.add_parser("drop", help="remove a stream with its events and consumers")
    drop.add_argument("name")
    drop.add_argument("--yes", action="store_true", help="yes, delete its events")
    add_db(drop)
    drop.set_defaults(run=_stream_drop)


def _add_partitions(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--partitions", type=int, required=required, metavar="P", help=f"1 to {MAX_PARTITIONS}"
    )


def _checked(name: str, partitions: int | None = None) -> None:
    """Bad input exits 2 before the database is touched."""
    try:
        check_stream_name(name)
        if partitions is not None:
            check_partition_count(partitions)
    except ValueError as exc:
        raise BadSetting(f"{exc}.") from None


async def _stream_add(args: argparse.Namespace) -> int:
    partitions = args.partitions
    if args.aggregate is not None:
        if partitions is not None and partitions != 1:
            raise BadSetting(f"an aggregated stream has one partition, not {partitions}.")
        if args.aggregate == args.name:
            raise BadSetting(f"the stream {args.name} cannot aggregate itself.")
        partitions = 1
    elif partitions is None:
        raise BadSetting("the number of partitions is needed: --partitions P.")
    _checked(args.name, partitions)
    async with opened_store(args.db) as store:
        try:
            info = await store.add_stream(args.name, partitions, aggregate_of=args.aggregate)
        except KeyError:
            raise BadSetting(f"the stream {args.name} exists already.") from None
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None
    if info.aggregate_of is not None:
        print(f"added stream {info.name} aggregating {info.aggregate_of}")
    else:
        print(f"added stream {info.name} with {len(info.partitions)} partitions")
    return 0


async def _stream_grow(args: argparse.Namespace) -> int:
    if args.name != DEFAULT_STREAM:
        _checked(args.name, args.partitions)
    async with opened_store(args.db) as store:
        try:
            info = await store.grow_stream(args.name, args.partitions)
        except KeyError:
            raise BadSetting(f"no stream {args.name}.") from None
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None
    print(f"stream {info.name} has {len(info.partitions)} partitions")
    return 0


async def _stream_drop(args: argparse.Namespace) -> int:
    if args.name == DEFAULT_STREAM:
        raise BadSetting(f"the stream {DEFAULT_STREAM} cannot be dropped.")
    _checked(args.name)
    if not args.yes:
        raise BadSetting(f"dropping {args.name} deletes its events and consumers: add --yes.")
    async with opened_store(args.db) as store:
        try:
            dropped = await store.drop_stream(args.name)
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None
        if not dropped:
            raise BadSetting(f"no stream {args.name}.")
    print(f"dropped stream {args.name}")
    return 0


async def _stream_list(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        infos = await store.streams()
    if args.json:
        print_json(
            [
                {
                    "name": i.name,
                    "partitions": len(i.partitions),
                    "created_at": i.created_at,
                    "aggregate_of": i.aggregate_of,
                }
                for i in infos
            ]
        )
        return 0
    for info in infos:
        of = f"  aggregate of {info.aggregate_of}" if info.aggregate_of else ""
        print(f"{info.name}  partitions {len(info.partitions)}  created {info.created_at}{of}")
    return 0


async def _stream_info(args: argparse.Namespace) -> int:
    async with opened_store(args.db) as store:
        info = await store.stream(args.name)
        if info is None:
            raise BadSetting(f"no stream {args.name}.")
        partitions = [await _partition_state(store, info, n) for n in range(len(info.partitions))]
        sources = await _copied(store, info)
    if args.json:
        print_json(
            {
                "name": info.name,
                "created_at": info.created_at,
                "partitions": partitions,
                **({"aggregate_of": info.aggregate_of, "sources": sources} if sources else {}),
            }
        )
        return 0
    print(f"stream {info.name}: {len(info.partitions)} partitions, created {info.created_at}")
    for s in sources:
        print(f"copied from {info.aggregate_of}/{s['number']} up to id {s['copied_up_to']}")
    for p in partitions:
        oldest = p["oldest_id"] if p["oldest_id"] is not None else "-"
        print(f"partition {p['number']}: head {p['head']}, oldest {oldest}, {p['events']} events")
        for c in p["consumers"]:
            print(f"  {c['user']}/{c['component']}: position {c['position']}, behind {c['behind']}")
    return 0


async def _copied(store: Store, info: StreamInfo) -> list[dict[str, Any]]:
    """An aggregate's sources: how far each partition of its source is copied."""
    source = await store.stream(info.aggregate_of) if info.aggregate_of else None
    if source is None:
        return []
    numbers = {p.key: p.number for p in source.partitions}
    return [
        {"number": numbers[key], "copied_up_to": position}
        for key, position in await store.aggregate_sources(info.partitions[0])
        if key in numbers
    ]


async def _partition_state(store: Store, info: StreamInfo, number: int) -> dict[str, Any]:
    log = store.partition_log(info.partitions[number])
    bounds = await log.stream_bounds()
    consumers = await log.consumers()
    return {
        "number": number,
        "head": await log.last_given_id(),
        "oldest_id": bounds.first_id,
        "events": bounds.events,
        "consumers": [
            {"user": c.user, "component": c.component, "position": c.position, "behind": c.behind}
            for c in consumers
        ],
    }
