"""Calls on a running server: ``add``, ``poll``, ``tail``, ``events``, ``archive``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

from ..client.aio import Event
from ..client.notify import Notifications
from ..client.receiver import LiveReceiver, Receiver, ReliableReceiver
from ..domain.stream import LIVE_COMPONENT
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
    user_credentials,
)


def add_commands(commands: Commands) -> None:
    add_event = commands.add_parser("add", help="add an event through a running server")
    add_event.add_argument("type", help="event type, e.g. USER_CREATED")
    add_event.add_argument("data", help="event data as JSON")
    add_event.add_argument(
        "--key",
        help="the producer's key of the event (1-64 of A-Z a-z 0-9 . _ : -): run again with "
        "the same key within the server's dedup window, it stores nothing and prints the first "
        "event's id",
    )
    add_endpoint(add_event)
    add_event.set_defaults(run=_add_event)

    poll = commands.add_parser(
        "poll", help="print events of a consumer as JSON lines, acknowledging what was printed"
    )
    poll.add_argument("component", help="consumer component (registered if new), or LIVE")
    poll.add_argument("--want", help="comma-separated event types")
    poll.add_argument("--last-id", type=int, help="LIVE only: start after this id")
    poll.add_argument("--follow", action="store_true", help="keep polling for new events")
    add_endpoint(poll)
    poll.set_defaults(run=_poll)

    tail = commands.add_parser(
        "tail", help="print events as they are pushed, as JSON lines, until interrupted"
    )
    tail.add_argument("component", nargs="?", help="consumer component (registered if new)")
    tail.add_argument("--live", action="store_true", help="new events only, no registration")
    tail.add_argument("--want", help="comma-separated event types")
    tail.add_argument(
        "--selector",
        help="with --live: only the events (and server management events) a selector matches,"
        " e.g. \"eventType = 'ORDER_PLACED' AND total > 100\"",
    )
    tail.add_argument(
        "--fields", help="with --live: print only these attributes (comma-separated), in order"
    )
    tail.add_argument(
        "--compact", action="store_true", help="with --fields: print each as a list of values"
    )
    add_endpoint(tail)
    tail.set_defaults(run=_tail)

    events = commands.add_parser(
        "events", help="event types and their attributes, for selectors (GET-EVENTS)"
    )
    events.add_argument("--type", help="only this event type")
    events.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_endpoint(events)
    events.set_defaults(run=_events)

    archive = commands.add_parser(
        "archive", help="copy every event from a running server to an archive SQLite file"
    )
    archive.add_argument("--out", type=Path, required=True, metavar="PATH")
    archive.add_argument("--component", default="ARCHIVE")
    add_endpoint(archive)
    archive.set_defaults(run=_archive)


async def _add_event(args: argparse.Namespace) -> int:
    try:
        data = decode_json(args.data)
    except ValueError as exc:
        raise CliError(f"event data is not valid JSON: {exc}") from None
    async with connected_client(args) as client:
        print(await client.add_event(args.type, data, args.key))
    return 0


async def _poll(args: argparse.Namespace) -> int:
    want = [t for t in args.want.split(",") if t] if args.want else None
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
                print_json(
                    {"id": str(event.id), "type": event.type, "data": event.data, "ts": event.ts}
                )
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
    if args.live == bool(args.component):
        raise CliError("give a COMPONENT, or --live, but not both.")
    if args.selector is not None or args.fields is not None or args.compact:
        return await _tail_selected(args)
    want = [t for t in args.want.split(",") if t] if args.want else None
    credentials = user_credentials(args)

    async def show(events: list[Event]) -> None:
        for event in events:
            print_json({"id": str(event.id), "type": event.type, "data": event.data,
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
    if not args.live:
        raise BadSetting("--selector, --fields and --compact go with --live.")
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
