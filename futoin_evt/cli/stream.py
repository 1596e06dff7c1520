"""``futoin-evt stream``: streams and their partitions, in the database (``--db``) or on a
running server (``--url``, through the ops iface, with the user's rights: a change needs
``manage`` on the name, an aggregate ``read`` on its source too)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Protocol

from ..domain.partition import (
    DEFAULT_STREAM,
    MAX_PARTITIONS,
    check_partition_count,
    check_stream_name,
)
from ..ftn18.stream_ops import INVALID_STREAM, STREAM_EXISTS, UNKNOWN_STREAM
from ..log.streams import describe_stream, stream_summary
from ..storage.base import Store
from .common import BadSetting, Commands, OnServer, acting_where, add_where, print_json


def add_commands(commands: Commands) -> None:
    stream = commands.add_parser("stream", help="manage streams and partitions").add_subparsers(
        dest="stream_command", required=True, metavar="ACTION"
    )
    add = stream.add_parser("add", help="add a stream of partitions")
    add.add_argument("name", metavar="NAME", help="the stream's name")
    _add_partitions(add, required=False)
    add.add_argument(
        "--aggregate",
        metavar="SOURCE",
        help="a stream of one partition that every serving process fills with every event "
        "of every partition of SOURCE (new ids, each partition's order kept; with --url it "
        "needs manage on NAME and read on SOURCE; default: none, a stream of its own)",
    )
    add_where(add)
    add.set_defaults(run=_stream_add)
    listing = stream.add_parser("list", help="list streams")
    listing.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_where(listing)
    listing.set_defaults(run=_stream_list)
    info = stream.add_parser(
        "info", help="a stream's partitions: head, oldest id, consumers and their lag"
    )
    info.add_argument("name", metavar="NAME", help="the stream's name")
    info.add_argument(
        "--partition",
        type=int,
        metavar="P",
        help="show this partition only (default: every partition)",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_where(info)
    info.set_defaults(run=_stream_info)
    grow = stream.add_parser("grow", help="add partitions to a stream (never fewer)")
    grow.add_argument("name", metavar="NAME", help="the stream's name")
    _add_partitions(grow)
    add_where(grow)
    grow.set_defaults(run=_stream_grow)
    drop = stream.add_parser("drop", help="remove a stream with its events and consumers")
    drop.add_argument("name", metavar="NAME", help="the stream's name")
    drop.add_argument("--yes", action="store_true", help="yes, delete its events")
    add_where(drop)
    drop.set_defaults(run=_stream_drop)


def _add_partitions(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    parser.add_argument(
        "--partitions",
        type=int,
        required=required,
        metavar="P",
        help=f"1 to {MAX_PARTITIONS}"
        + ("" if required else " (default: none: needed unless --aggregate)"),
    )


class StreamTarget(Protocol):
    """Where the commands act: the database, or a server. Errors are :class:`BadSetting`."""

    async def add(
        self, name: str, partitions: int, aggregate_of: str | None = None
    ) -> dict[str, Any]: ...

    async def grow(self, name: str, partitions: int) -> dict[str, Any]: ...

    async def drop(self, name: str) -> None: ...

    async def list(self) -> list[dict[str, Any]]: ...

    async def describe(self, name: str) -> dict[str, Any]: ...


class _InDatabase:
    def __init__(self, store: Store) -> None:
        self._store = store

    async def add(
        self, name: str, partitions: int, aggregate_of: str | None = None
    ) -> dict[str, Any]:
        try:
            info = await self._store.add_stream(name, partitions, aggregate_of=aggregate_of)
        except KeyError:
            raise BadSetting(f"the stream {name} exists already.") from None
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None
        return stream_summary(info)

    async def grow(self, name: str, partitions: int) -> dict[str, Any]:
        try:
            return stream_summary(await self._store.grow_stream(name, partitions))
        except KeyError:
            raise BadSetting(f"no stream {name}.") from None
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None

    async def drop(self, name: str) -> None:
        try:
            dropped = await self._store.drop_stream(name)
        except ValueError as exc:  # an aggregate of it exists
            raise BadSetting(f"{exc}.") from None
        if not dropped:
            raise BadSetting(f"no stream {name}.")

    async def list(self) -> list[dict[str, Any]]:
        return [stream_summary(info) for info in await self._store.streams()]

    async def describe(self, name: str) -> dict[str, Any]:
        info = await self._store.stream(name)
        if info is None:
            raise BadSetting(f"no stream {name}.")
        return await describe_stream(self._store, info)


class _OnServer(OnServer):
    """Through the ops iface; the server's refusals of a name or count exit 2, as here."""

    bad_input = (UNKNOWN_STREAM, STREAM_EXISTS, INVALID_STREAM)

    async def add(
        self, name: str, partitions: int, aggregate_of: str | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "partitions": partitions}
        if aggregate_of is not None:
            params["aggregate_of"] = aggregate_of
        result: dict[str, Any] = await self.call("addStream", params)
        return result

    async def grow(self, name: str, partitions: int) -> dict[str, Any]:
        result: dict[str, Any] = await self.call(
            "growStream", {"name": name, "partitions": partitions}
        )
        return result

    async def drop(self, name: str) -> None:
        await self.call("dropStream", {"name": name})

    async def list(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self.call("listStreams", {})
        return result

    async def describe(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("describeStream", {"name": name})
        return result


def _admin(args: argparse.Namespace) -> contextlib.AbstractAsyncContextManager[StreamTarget]:
    return acting_where(args, _OnServer, _InDatabase)


def _checked(name: str, partitions: int | None = None) -> None:
    """Bad input exits 2 before the database or the server is touched."""
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
        _checked(args.name, 1)
        async with _admin(args) as admin:
            await admin.add(args.name, 1, args.aggregate)
        print(f"added stream {args.name} aggregating {args.aggregate}")
        return 0
    if partitions is None:
        raise BadSetting("the number of partitions is needed: --partitions P.")
    _checked(args.name, partitions)
    async with _admin(args) as admin:
        added = await admin.add(args.name, partitions)
    print(f"added stream {added['name']} with {added['partitions']} partitions")
    return 0


async def _stream_grow(args: argparse.Namespace) -> int:
    if args.name != DEFAULT_STREAM:
        _checked(args.name, args.partitions)
    async with _admin(args) as admin:
        grown = await admin.grow(args.name, args.partitions)
    print(f"stream {grown['name']} has {grown['partitions']} partitions")
    return 0


async def _stream_drop(args: argparse.Namespace) -> int:
    if args.name == DEFAULT_STREAM:
        raise BadSetting(f"the stream {DEFAULT_STREAM} cannot be dropped.")
    _checked(args.name)
    if not args.yes:
        raise BadSetting(f"dropping {args.name} deletes its events and consumers: add --yes.")
    async with _admin(args) as admin:
        await admin.drop(args.name)
    print(f"dropped stream {args.name}")
    return 0


async def _stream_list(args: argparse.Namespace) -> int:
    async with _admin(args) as admin:
        summaries = await admin.list()
    if args.json:
        print_json(summaries)
        return 0
    for s in summaries:
        print(f"{s['name']}  partitions {s['partitions']}  created {s['created_at']}")
    return 0


async def _stream_info(args: argparse.Namespace) -> int:
    if args.partition is not None and args.partition < 0:
        raise BadSetting(f"--partition must be 0 or more, not {args.partition}.")
    async with _admin(args) as admin:
        info = await admin.describe(args.name)
    count = len(info["partitions"])
    if args.partition is not None:
        if args.partition >= count:
            raise BadSetting(
                f"the stream {args.name} has partitions 0 to {count - 1}, not {args.partition}."
            )
        info["partitions"] = [info["partitions"][args.partition]]
    if args.json:
        print_json(info)
        return 0
    print(f"stream {info['name']}: {count} partitions, created {info['created_at']}")
    for p in info["partitions"]:
        oldest = p.get("oldest_id", "-")
        print(f"partition {p['number']}: head {p['head']}, oldest {oldest}, {p['events']} events")
        for c in p["consumers"]:
            print(f"  {c['user']}/{c['component']}: position {c['position']}, behind {c['behind']}")
    return 0
