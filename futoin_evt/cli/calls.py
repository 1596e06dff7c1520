"""Calls on a running server: ``add``, ``poll``, ``tail``, ``events``, ``archive``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..client.aio import Event
from ..client.notify import Notifications
from ..client.receiver import LiveReceiver, Receiver, ReliableReceiver
from ..domain.stream import (
    LIVE_COMPONENT,
    check_component,
    check_event_key,
    check_event_type,
)
from ..ftn3.messages import decode_json
from ..log.archive import RemoteArchiver
from ..notify.message import NotifyError, Transformation
from ..notify.selector import compile_selector
from .common import (
    BadSetting,
    CliError,
    Commands,
    add_endpoint,
    connected_client,
    print_json,
    stream_url,
    user_credentials,
)


def add_commands(commands: Commands) -> None:
    add_event = commands.add_parser("add", help="add an event through a running server")
    add_event.add_argument("type", metavar="TYPE", help="event type, e.g. ORDER_PLACED")
    add_event.add_argument("data", metavar="DATA", help="event data as JSON, e.g. '{\"id\": 1}'")
    add_event.add_argument(
        "--key",
        metavar="KEY",
        help="the producer's key of the event (1-64 of A-Z a-z 0-9 . _ : -): run again with "
        "the same key within the server's dedup window, it stores nothing and prints the first "
        "event's id (default: none)",
    )
    add_endpoint(add_event, partitioned=True)
    add_event.set_defaults(run=_add_event)

    poll = commands.add_parser(
        "poll", help="print events of a consumer as JSON lines, acknowledging what was printed"
    )
    poll.add_argument(
        "component", metavar="COMPONENT", help="consumer component (registered if new), or LIVE"
    )
    poll.add_argument(
        "--want", metavar="T1,T2", help="comma-separated event types (default: every type)"
    )
    poll.add_argument(
        "--last-id",
        type=int,
        metavar="ID",
        help="LIVE only: start after this id (default: the newest event)",
    )
    poll.add_argument("--follow", action="store_true", help="keep polling for new events")
    add_endpoint(poll, partitioned=True)
    poll.set_defaults(run=_poll)

    tail = commands.add_parser(
        "tail", help="print events as they are pushed, as JSON lines, until interrupted"
    )
    tail.add_argument(
        "component",
        nargs="?",
        metavar="COMPONENT",
        help="consumer component (registered if new); or --live",
    )
    tail.add_argument("--live", action="store_true", help="new events only, no registration")
    tail.add_argument(
        "--want", metavar="T1,T2", help="comma-separated event types (default: every type)"
    )
    tail.add_argument(
        "--selector",
        metavar="SELECTOR",
        help="with --live: only the events (and server management events) a selector matches,"
        " e.g. \"eventType = 'ORDER_PLACED' AND total > 100\" (default: every event)",
    )
    tail.add_argument(
        "--fields",
        metavar="A,B",
        help="with --live: print only these attributes (comma-separated), in order "
        "(default: every attribute and the data)",
    )
    tail.add_argument(
        "--compact", action="store_true", help="with --fields: print each as a list of values"
    )
    add_endpoint(tail, partitioned=True)
    tail.set_defaults(run=_tail)

    events = commands.add_parser(
        "events", help="event types and their attributes, for selectors (GET-EVENTS)"
    )
    events.add_argument("--type", metavar="TYPE", help="only this event type (default: every type)")
    events.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_endpoint(events)
    events.set_defaults(run=_events)

    archive = commands.add_parser(
        "archive", help="copy every event from a running server to an archive SQLite file"
    )
    archive.add_argument(
        "--out", type=Path, required=True, metavar="PATH", help="the archive SQLite file"
    )
    archive.add_argument(
        "--component",
        default="ARCHIVE",
        metavar="COMPONENT",
        help="the archiver's consumer component on the server",
    )
    add_endpoint(archive)
    archive.set_defaults(run=_archive)


def _checked(check: Callable[[Any], Any], value: Any) -> None:
    """A name checked before anything is sent: its rule in one sentence, exit status 1 (as
    when the server refuses it)."""
    try:
        check(value)
    except ValueError as exc:  # EventRejected is one
        raise CliError(f"{exc}.") from None


def _wanted(args: argparse.Namespace) -> list[str] | None:
    """``--want``'s event types, each checked."""
    if not args.want:
        return None
    want = [t for t in args.want.split(",") if t]
    for event_type in want:
        _checked(check_event_type, event_type)
    return want


async def _add_event(args: argparse.Namespace) -> int:
    args.url = stream_url(args)
    _checked(check_event_type, args.type)
    if args.key is not None:
        _checked(check_event_key, args.key)
    try:
        data = decode_json(args.data)
    except ValueError as exc:
        raise CliError(f"event data is not valid JSON: {exc}") from None
    async with connected_client(args) as client:
        print(await client.add_event(args.type, data, args.key))
    return 0


async def _poll(args: argparse.Namespace) -> int:
    args.url = stream_url(args)
    _checked(check_component, args.component)
    want = _wanted(args)  # before the consumer is registered: a refused poll leaves none
    live = args.component == LIVE_COMPONENT
    if args.last_id is not None and not live:
        raise CliError("--last-id is for LIVE; a registered consumer resumes where it stopped.")
    async with connected_client(args) as client:
        if not live:
            await client.register_consumer(args.component)
        last_id = args.last_id
        delay = 0.05
        while True:
            events = await client.poll_events(args.component, last_id, want)
            for event in events:
                print_json({"id": event.id, "type": event.type, "data": event.data, "ts": event.ts})
            sys.stdout.flush()
            if events:
                last_id = events[-1].id
                delay = 0.05
                continue
            # The empty poll above acknowledged everything printed so far.
            if not args.follow:
                return 0
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


async def _tail(args: argparse.Namespace) -> int:
    args.url = stream_url(args)
    selecting = args.selector is not None or args.fields is not None or args.compact
    if selecting and not args.live:
        raise BadSetting(
            "--selector needs --live (--selector, --fields and --compact go with --live,"
            " without a COMPONENT)."
        )
    if args.live and args.component:
        raise CliError("give a COMPONENT or --live, not both.")
    if not args.live and not args.component:
        raise CliError("give a COMPONENT (a registered consumer) or --live (new events only).")
    if selecting:
        return await _tail_selected(args)
    if args.component:
        _checked(check_component, args.component)
    want = _wanted(args)
    credentials = user_credentials(args)

    async def show(events: list[Event]) -> None:
        for event in events:
            print_json({"id": event.id, "type": event.type, "data": event.data,
                         "ts": event.ts})  # fmt: skip
        sys.stdout.flush()

    receiver: Receiver
    if args.live:
        receiver = LiveReceiver(args.url, credentials=credentials, on_events=show, want=want)
    else:
        receiver = ReliableReceiver(
            args.url, credentials=credentials, component=args.component, on_events=show, want=want
        )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, receiver.stop)
    await receiver.run()
    return 0


async def _tail_selected(args: argparse.Namespace) -> int:
    """``tail --live --selector/--fields``: the notifications of a selector subscription."""
    if args.want:
        raise BadSetting(
            "--want and --selector do not go together: name the types in the selector."
        )
    if args.compact and args.fields is None:
        raise BadSetting("--compact needs --fields: the values are printed in their order.")
    fields = None
    if args.fields is not None:
        fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    try:
        if args.selector is not None:
            compile_selector(args.selector)
        if fields is not None:
            Transformation.parse({"requestedAttributes": fields})
    except NotifyError as exc:
        raise BadSetting(f"{exc}.") from None
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    async with connected_client(args) as client:
        notifications = Notifications(client.ftn3)
        queue = await notifications.subscribe(args.selector, fields, compact=args.compact)
        print("futoin-evt: subscribed; printing notifications until interrupted", file=sys.stderr)
        sys.stderr.flush()
        closed = asyncio.ensure_future(client.ftn3.wait_closed())
        stopping = asyncio.ensure_future(stopped.wait())
        while True:
            message = asyncio.ensure_future(queue.get())
            await asyncio.wait({message, closed, stopping}, return_when="FIRST_COMPLETED")
            if not message.done():
                message.cancel()
                break
            print_json(_printed(message.result(), fields, args.compact))
            sys.stdout.flush()
        stopping.cancel()
        if closed.done() and not stopped.is_set():
            raise CliError(f"lost the connection to {args.url}.")
    return 0


def _printed(message: dict[str, Any], fields: list[str] | None, compact: bool) -> Any:
    """A notification as printed: the requested attributes (with --compact their values
    alone), or every attribute and the event's data."""
    if compact:
        return message.get("body")
    properties = dict(message.get("properties") or {})
    if fields is None:
        return {**properties, "data": message.get("body")}
    return properties


async def _events(args: argparse.Namespace) -> int:
    async with connected_client(args) as client:
        types = await Notifications(client.ftn3).event_types(args.type)
    if args.json:
        print_json(types)
    elif args.type is not None and not types:
        raise CliError(f"no event type {args.type} is known.")
    else:
        for name, attributes in sorted(types.items()):
            print(f"{name}: {', '.join(attributes)}")
    return 0


async def _archive(args: argparse.Namespace) -> int:
    try:
        archiver = RemoteArchiver(args.url, user_credentials(args), args.out, args.component)
    except sqlite3.Error as exc:
        raise BadSetting(f"cannot open the archive {args.out}: {exc}") from None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, archiver.stop)
    await archiver.run()
    return 0
