"""Consumers on a running server, through its ops iface: ``info``, ``consumer list``,
``consumer drop``, ``consumer seek``. Each acts on one partition: the one ``--stream`` and
``--partition`` name (partition 0 of the stream, or the partition of the stream of
``--url``'s path, for the one left out), else the one of ``--url``'s path (``events``/0 on
``/``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..client.aio import OPS
from ..domain.partition import check_stream_name
from .common import (
    BadSetting,
    Commands,
    add_endpoint,
    add_stream_target,
    checked_partition,
    connected_client,
    print_json,
)


def add_commands(commands: Commands) -> None:
    info = commands.add_parser("info", help="stream and consumer information (lag, who holds back)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_target(info)
    info.set_defaults(run=_info)

    consumer = commands.add_parser("consumer", help="list, drop or seek consumers").add_subparsers(
        dest="consumer_command", required=True, metavar="ACTION"
    )
    listing = consumer.add_parser("list", help="your consumers (an admin sees all)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_target(listing)
    listing.set_defaults(run=_consumer_list)
    drop = consumer.add_parser("drop", help="unregister a consumer")
    # dest "owner": "user" is --user's, who logs in
    drop.add_argument("owner", metavar="USER", help="the consumer's user")
    drop.add_argument("component", metavar="COMPONENT", help="the consumer's component")
    _add_target(drop)
    drop.set_defaults(run=_consumer_drop)
    seek = consumer.add_parser(
        "seek", help="move your consumer to the first event at or after a time (back or on)"
    )
    seek.add_argument("component", metavar="COMPONENT", help="your consumer's component")
    seek.add_argument("ts", metavar="TS", help="UTC, as YYYY-MM-DDTHH:MM:SSZ")
    _add_target(seek)
    seek.set_defaults(run=_consumer_seek)


def _add_target(parser: argparse.ArgumentParser) -> None:
    add_endpoint(parser)
    add_stream_target(
        parser,
        stream_help="the stream (default: that of --url's path, else events)",
        partition_help="the partition (default: 0 with --stream, else that of --url's path)",
    )


def _target(args: argparse.Namespace) -> dict[str, Any]:
    """The ``stream`` and ``partition`` params of the call, as given; bad ones exit 2 before
    the server is asked."""
    params: dict[str, Any] = {}
    if args.stream is not None:
        try:
            params["stream"] = check_stream_name(args.stream)
        except ValueError as exc:
            raise BadSetting(f"{exc}.") from None
    if args.partition is not None:
        params["partition"] = checked_partition(args.partition)
    return params


async def _info(args: argparse.Namespace) -> int:
    target = _target(args)
    async with connected_client(args) as client:
        stream = await client.ftn3.call(OPS, "streamInfo", target)
        consumers = await client.ftn3.call(OPS, "listConsumers", target)
    if args.json:
        print_json({"stream": stream, "consumers": consumers})
        return 0
    held = stream.get("held_back_by")
    print(
        f"{stream['stream']}/{stream['partition']}: events {stream['events']}: ids "
        f"{stream.get('first_id', '-')} .. "
        f"{stream.get('last_id', '-')} ({stream.get('first_ts', '-')} .. "
        f"{stream.get('last_ts', '-')})"
    )
    print(
        f"discarded {stream['discarded_total']}; may discard up to "
        f"{stream.get('discard_up_to', '-')}; held back by "
        f"{held['user'] + '/' + held['component'] if held else '-'}"
    )
    for expired in stream["expired_consumers"]:
        print(f"expired: {expired['user']}/{expired['component']}")
    print()
    _print_consumers(consumers)
    return 0


def _print_consumers(consumers: list[dict[str, Any]]) -> None:
    header = (
        "USER", "COMPONENT", "POSITION", "BEHIND", "OLDEST_UNREAD_S", "LAST_SEEN", "PUSH",
        "RETRYING",
    )  # fmt: skip
    rows = [header] + [_consumer_row(c) for c in consumers]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


def _consumer_row(c: dict[str, Any]) -> tuple[str, ...]:
    return (
        c["user"],
        c["component"],
        c.get("position", "-"),
        str(c["behind"]),
        str(c.get("oldest_unread_age", "-")),
        c["last_seen"],
        "connected" if c["push_connected"] else "-",
        str(c["push_retrying"]),
    )


async def _consumer_list(args: argparse.Namespace) -> int:
    target = _target(args)
    async with connected_client(args) as client:
        consumers = await client.ftn3.call(OPS, "listConsumers", target)
    if args.json:
        print_json(consumers)
    else:
        _print_consumers(consumers)
    return 0


async def _consumer_drop(args: argparse.Namespace) -> int:
    target = _target(args)
    async with connected_client(args) as client:
        await client.ftn3.call(
            OPS, "dropConsumer", {"user": args.owner, "component": args.component, **target}
        )
    print(f"dropped consumer {args.component} of user {args.owner}")
    return 0


async def _consumer_seek(args: argparse.Namespace) -> int:
    target = _target(args)
    try:
        time.strptime(args.ts, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise BadSetting(f"not a UTC time as YYYY-MM-DDTHH:MM:SSZ: {args.ts[:40]!r}.") from None
    async with connected_client(args) as client:
        position = await client.ftn3.call(
            OPS, "seekConsumer", {"component": args.component, "ts": args.ts, **target}
        )
    after = f"after event {position}" if position else "from the first event"
    print(f"consumer {args.component} reads on {after}")
    return 0
