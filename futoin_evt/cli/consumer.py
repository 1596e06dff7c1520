"""Consumers on a running server: ``info``, ``consumer list``, ``consumer drop``."""

from __future__ import annotations

import argparse
from typing import Any

from ..client.aio import OPS
from .common import (
    Commands,
    add_endpoint,
    connected_client,
    print_json,
)


def add_commands(commands: Commands) -> None:
    info = commands.add_parser("info", help="stream and consumer information (lag, who holds back)")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_endpoint(info)
    info.set_defaults(run=_info)

    consumer = commands.add_parser("consumer", help="list or drop consumers").add_subparsers(
        dest="consumer_command", required=True, metavar="ACTION"
    )
    listing = consumer.add_parser("list", help="your consumers (an admin sees all)")
    listing.add_argument("--json", action="store_true")
    add_endpoint(listing)
    listing.set_defaults(run=_consumer_list)
    drop = consumer.add_parser("drop", help="unregister a consumer")
    drop.add_argument("user")
    drop.add_argument("component")
    add_endpoint(drop)
    drop.set_defaults(run=_consumer_drop)


async def _info(args: argparse.Namespace) -> int:
    async with connected_client(args) as client:
        stream = await client.ftn3.call(OPS, "streamInfo", {})
        consumers = await client.ftn3.call(OPS, "listConsumers", {})
    if args.json:
        print_json({"stream": stream, "consumers": consumers})
        return 0
    held = stream.get("held_back_by")
    print(
        f"events {stream['events']}: ids {stream.get('first_id', '-')} .. "
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
    async with connected_client(args) as client:
        consumers = await client.ftn3.call(OPS, "listConsumers", {})
    if args.json:
        print_json(consumers)
    else:
        _print_consumers(consumers)
    return 0


async def _consumer_drop(args: argparse.Namespace) -> int:
    async with connected_client(args) as client:
        await client.ftn3.call(
            OPS, "dropConsumer", {"user": args.user, "component": args.component}
        )
    print(f"dropped consumer {args.component} of user {args.user}")
    return 0
