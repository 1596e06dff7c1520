"""The FTN18 door per partition: which services a WebSocket path reaches.

Each partition's routes are built once, on its first connection, and shared by later ones:
``futoin.ping``, ``futoin.evt.gen``, ``poll`` and ``push`` on the partition, DCB, notification
and the ops iface. ``/`` (with any query) is ``events``/0. ``/NAME/P`` is partition ``P`` of
the stream ``NAME``; ``/NAME`` is its partition 0 when the stream has one partition. On a
stream with more, ``/NAME`` takes ``addEvent`` only: each connection's events go to one
partition, picked round robin over connections (so one producer's order holds), and consumer
calls are refused naming the ``/NAME/P`` endpoints. ``futoin.ping``, notification and the
stream administration calls of the ops iface are the same on every path; its consumer calls
(``streamInfo``, ``listConsumers``, ``dropConsumer``, ``seekConsumer``, ``consumerState``,
``acknowledge``, ``readEvents``, ``idBefore``) act on the path's partition; ``streamInfo``,
``listConsumers``, ``dropConsumer`` and ``seekConsumer`` act on another one when they name
its ``stream`` or ``partition`` (the path's stream, partition 0, for the one left out), on
any path: ``SecurityError`` without any right on the name, whether it exists or not, and
``UnknownStream`` when it is not there. DCB on ``/`` and
``/events/0`` serves ``events``/0; on any other path of a stream it serves that stream while
it has one partition, and on a stream of more each call is an ``InvalidRequest`` that says
why.

A path that is not of that form is refused at the upgrade (HTTP 404, one sentence); a
well-formed one is accepted whether its stream and partition exist or not, since the upgrade
carries no credentials: each call then answers as its caller may be told. A caller with no
right on the name is refused (``SecurityError`` naming the right the call needs and the
stream), exactly as on a stream that exists; a caller with some right on it is told that
there is no such stream or partition (``InvalidRequest``). A stream added later is served on
such a connection from then on. When a stream is dropped, its partitions' routes are swapped
in place for that refusal, so its open connections get an FTN3 error on their next call, and
its push streams stop (their connections drop).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..dcb.service import DcbService
from ..domain.partition import DEFAULT_PARTITION, DEFAULT_STREAM, STREAM_NAME_RE, Partition
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import STREAM_NAME_RULE
from ..ftn3.calls import CallContext, Handler, Routes
from ..ftn3.errors import INVALID_REQUEST, FTN3Error
from ..log.eventlog import EventLog
from ..log.retention import Discarder
from ..log.streams import StreamLogs, StreamRegistry
from ..quoting import quote_input
from .dcb import DcbCalls
from .grant_ops import GrantAdmin
from .notify import NotifyService
from .ops import OpsService
from .push import PushService
from .services import GenService, PollService, ping
from .stream_ops import UNKNOWN_STREAM, StreamAdmin

logger = logging.getLogger(__name__)

GEN: Final = "futoin.evt.gen"
POLL: Final = "futoin.evt.poll"
PUSH: Final = "futoin.evt.push"
DCB: Final = "futoin.evt.dcb"
NOTIFY: Final = "futoin.evt.notify"
OPS: Final = "futoinevt.ops"
#: The ops calls on a partition's consumers: function -> OpsService method.
_CONSUMER_OPS: Final = {
    "streamInfo": "stream_info",
    "listConsumers": "list_consumers",
    "dropConsumer": "drop_consumer",
    "seekConsumer": "seek_consumer",
    "acknowledge": "acknowledge",
    "idBefore": "id_before",
    "consumerState": "consumer_state",
    "readEvents": "read_events",
}
#: The consumer calls that may name another partition than the path's (params ``stream`` and
#: ``partition``).
_TARGETED: Final = frozenset({"streamInfo", "listConsumers", "dropConsumer", "seekConsumer"})
#: The right each call on a partition's routes needs (what a refusal names); ``ping`` none.
_NEEDS: Final[dict[str, dict[str, Right]]] = {
    GEN: {"addEvent": Right.WRITE},
    POLL: {"registerConsumer": Right.READ, "pollEvents": Right.READ},
    PUSH: {"registerConsumer": Right.READ, "pollEvents": Right.READ, "readyToReceive": Right.READ},
    DCB: {"append": Right.WRITE, "read": Right.READ, "readBackwards": Right.READ},
    OPS: dict.fromkeys(_CONSUMER_OPS, Right.READ),
}
#: Partition numbers in a path: 0, or up to 4 digits with no leading zero (at most 1024).
_MAX_PARTITION_DIGITS: Final = 4
#: Path characters quoted back in a refusal at most.
_QUOTED: Final = 60


@dataclass(slots=True)
class _PartitionDoor:
    """One partition's services and the routes that reach them (shared by its connections)."""

    partition: Partition
    ops: OpsService
    routes: dict[str, dict[str, Handler[Principal]]]
    #: The routes of ``/NAME`` pinned to this partition (built on first use).
    pinned: dict[str, dict[str, Handler[Principal]]] | None = None


class PartitionDoors:
    """Paths to routes. :meth:`refusal` checks a path at the upgrade; :meth:`open` gives an
    accepted connection its routes."""

    def __init__(
        self,
        streams: StreamRegistry,
        logs: StreamLogs,
        push: PushService,
        discarder: Discarder,
        notify: NotifyService,
        grants: GrantAdmin,
    ) -> None:
        self._streams = streams
        self._logs = logs
        self._push = push
        self._discarder = discarder
        admin = StreamAdmin(streams)
        #: Calls that are the same on every path: notification, the streams' administration.
        self._notify: dict[str, Handler[Principal]] = {
            "ping": ping,
            "subscribe": notify.subscribe,
            "unsubscribe": notify.unsubscribe,
            "getEvents": notify.get_events,
        }
        self._admin: dict[str, Handler[Principal]] = {
            "ping": ping,
            "listStreams": admin.list_streams,
            "describeStream": admin.describe_stream,
            "addStream": admin.add_stream,
            "growStream": admin.grow_stream,
            "dropStream": admin.drop_stream,
            "grantRights": grants.grant_rights,
            "revokeRights": grants.revoke_rights,
            "showUser": grants.show_user,
        }
        self._doors: dict[int, _PartitionDoor] = {}
        #: Stream name -> the round robin of its pinned connections.
        self._turns: dict[str, itertools.count[int]] = {}
        self._stop_listening = streams.listen(self._registry_changed)

    # -- paths ----------------------------------------------------------------------------

    def _find(self, path: str) -> tuple[str, int | None] | str:
        """(stream, partition number or None for ``/NAME``), or why the path is refused: for
        its form only, never for what exists (the upgrade is not authenticated)."""
        target = path.partition("?")[0]
        if target in ("", "/"):
            return DEFAULT_STREAM, 0
        if target.endswith("/"):
            target = target[:-1]
        parts = target[1:].split("/")
        if len(parts) > 2 or not target.startswith("/"):
            shown = quote_input(target, _QUOTED)
            return f"Not an event stream path: {shown} (use /NAME or /NAME/P)."
        name = parts[0]
        if STREAM_NAME_RE.fullmatch(name) is None:
            return f"No stream is named {quote_input(name, 40)}: {STREAM_NAME_RULE}."
        if len(parts) == 1:
            return name, None
        number = parts[1]
        if not (
            number.isascii()
            and number.isdigit()
            and len(number) <= _MAX_PARTITION_DIGITS
            and (number == "0" or not number.startswith("0"))
        ):
            shown = quote_input(number, _QUOTED)
            return f"Not a partition number: {shown} (use /NAME/P, P from 0)."
        return name, int(number)

    def refusal(self, path: str) -> str | None:
        """Why a WebSocket upgrade to ``path`` is refused (one sentence), or None."""
        found = self._find(path)
        return found if isinstance(found, str) else None

    def open(self, path: str) -> Routes[Principal]:
        """The routes of a connection to ``path`` (checked by :meth:`refusal` in the same turn
        of the loop)."""
        found = self._find(path)
        assert not isinstance(found, str), found
        name, number = found
        routes = self._existing(name, number)
        return routes if routes is not None else self._absent(name, number)

    def _existing(self, name: str, number: int | None) -> Routes[Principal] | None:
        """The routes of partition ``number`` of ``name`` (None: ``/NAME``), or None when
        there is no such stream or partition now."""
        info = self._streams.get(name)
        if info is None:
            return None
        if number is None:
            if len(info.partitions) == 1:
                number = 0
            else:
                turn = next(self._turns.setdefault(name, itertools.count()))
                return self._pinned(self._door(info.partitions[turn % len(info.partitions)]))
        if number >= len(info.partitions):
            return None
        return self._door(info.partitions[number]).routes

    def _absent(self, name: str, number: int | None) -> Routes[Principal]:
        """The routes of one connection to a stream or partition that does not exist: each
        call is refused as :meth:`_refusal` says, until the stream is there (then the
        connection is served as if it had come after)."""
        served: list[Routes[Principal]] = []

        def forward(iface: str, func: str, needed: Right) -> Handler[Principal]:
            refuse = self._refusal(name, needed, lambda: self._absence(name, number))

            def call(ctx: CallContext[Principal], params: dict[str, Any]) -> Any:
                if not served:
                    routes = self._existing(name, number)
                    if routes is None:
                        return refuse(ctx, params)
                    served.append(routes)
                return served[0][iface][func](ctx, params)

            return call

        absent: dict[str, dict[str, Handler[Principal]]] = {
            iface: {"ping": ping, **{f: forward(iface, f, right) for f, right in needs.items()}}
            for iface, needs in _NEEDS.items()
        }
        absent["futoin.ping"] = {"ping": ping}
        absent[NOTIFY] = self._notify
        absent[OPS] = {**self._admin, **self._targeting(name, absent[OPS])}
        return absent

    def _absence(self, name: str, number: int | None) -> str:
        """What is missing of ``/name/number`` (for a caller who may know)."""
        info = self._streams.get(name)
        if info is None:
            return f"There is no stream {name}."
        return f"The stream {name} has partitions 0 to {len(info.partitions) - 1}, not {number}."

    def _targeting(
        self, path_stream: str, funcs: dict[str, Handler[Principal]]
    ) -> dict[str, Handler[Principal]]:
        """``funcs`` (the ops routes of a path on ``path_stream``), where each call of
        :data:`_TARGETED` that names a ``stream`` or ``partition`` is served on that
        partition (the path's stream, partition 0, for the one it leaves out) instead."""

        def targeted(func: str, here: Handler[Principal]) -> Handler[Principal]:
            method = _CONSUMER_OPS[func]

            def call(ctx: CallContext[Principal], params: dict[str, Any]) -> Any:
                name, number = params.get("stream"), params.get("partition")
                if name is None and number is None:
                    return here(ctx, params)
                door = self._door(self._target(ctx.principal, name or path_stream, number or 0))
                return getattr(door.ops, method)(ctx, params)

            return call

        return {f: targeted(f, h) if f in _TARGETED else h for f, h in funcs.items()}

    def _target(self, who: Principal, name: str, number: int) -> Partition:
        """Partition ``number`` of ``name`` for a consumer call (read on the stream): refused
        as on a path (``SecurityError``) to a caller with no right on the name, whether it
        exists or not; ``UnknownStream`` to one with some right when it does not exist."""
        info = self._streams.reachable(who, name, Right.READ)
        if info is None or number >= len(info.partitions):
            raise FTN3Error(UNKNOWN_STREAM, self._absence(name, number))
        return info.partitions[number]

    def _refusal(self, name: str, needed: Right, desc: Callable[[], str]) -> Handler[Principal]:
        """A call on the stream ``name`` that cannot be served: ``SecurityError`` naming
        ``needed`` for a caller with no right on the stream, whether it exists or not;
        ``InvalidRequest`` with ``desc()`` for one with some right."""
        guard = self._logs.guard(name)

        def refuse(ctx: CallContext[Principal], params: dict[str, Any]) -> Any:
            guard.some_right(ctx.principal, needed)
            raise FTN3Error(INVALID_REQUEST, desc())

        return refuse

    # -- services per partition -----------------------------------------------------------

    def _door(self, partition: Partition) -> _PartitionDoor:
        door = self._doors.get(partition.key)
        if door is None:
            events = self._logs.partition(partition)
            ops = OpsService(events, self._push, self._discarder)
            door = _PartitionDoor(partition, ops, self._routes(partition, events, ops))
            self._doors[partition.key] = door
        return door

    def _routes(
        self, partition: Partition, events: EventLog, ops: OpsService
    ) -> dict[str, dict[str, Handler[Principal]]]:
        """The explicit map from wire names to the methods that serve them on ``partition``."""
        gen = GenService(events)
        poll = PollService(events)
        consumer: dict[str, Handler[Principal]] = {
            "ping": ping,
            "registerConsumer": poll.register_consumer,
            "pollEvents": poll.poll_events,
        }
        if partition == DEFAULT_PARTITION:
            dcb = DcbCalls(DcbService(events))
            dcb_routes = self._dcb_routes(lambda: dcb)
        else:
            dcb_routes = self._stream_dcb_routes(partition.stream)
        return {
            "futoin.ping": {"ping": ping},
            GEN: {"ping": ping, "addEvent": gen.add_event},
            POLL: consumer,
            PUSH: {**consumer, "readyToReceive": self._push.receiver(events)},
            DCB: dcb_routes,
            NOTIFY: self._notify,
            OPS: {
                **self._admin,
                **self._targeting(
                    partition.stream, {f: getattr(ops, m) for f, m in _CONSUMER_OPS.items()}
                ),
            },
        }

    def _stream_dcb_routes(self, name: str) -> dict[str, Handler[Principal]]:
        """DCB on the stream ``name``, looked up at each call: it may grow or be dropped. A
        caller with no right on it learns nothing of it (as on :meth:`_refusal`)."""
        guard = self._logs.guard(name)

        def calls(ctx: CallContext[Principal], needed: Right) -> DcbCalls:
            guard.some_right(ctx.principal, needed)
            return DcbCalls.of_stream(name, self._streams.get, self._logs.partition)

        return {
            "ping": ping,
            "append": lambda ctx, params: calls(ctx, Right.WRITE).append(ctx, params),
            "read": lambda ctx, params: calls(ctx, Right.READ).read(ctx, params),
            "readBackwards": lambda ctx, params: calls(ctx, Right.READ).read_backwards(ctx, params),
        }

    @staticmethod
    def _dcb_routes(calls: Callable[[], DcbCalls]) -> dict[str, Handler[Principal]]:
        return {
            "ping": ping,
            "append": lambda ctx, params: calls().append(ctx, params),
            "read": lambda ctx, params: calls().read(ctx, params),
            "readBackwards": lambda ctx, params: calls().read_backwards(ctx, params),
        }

    def _pinned(self, door: _PartitionDoor) -> Routes[Principal]:
        if door.pinned is None:
            name = door.partition.stream
            refuse = self._consumer_refusal(name)
            pinned = {iface: dict(funcs) for iface, funcs in door.routes.items()}
            for iface in (POLL, PUSH):
                pinned[iface] = {func: ping if func == "ping" else refuse for func in pinned[iface]}
            pinned[OPS] = {
                **pinned[OPS],
                **self._targeting(name, dict.fromkeys(_CONSUMER_OPS, refuse)),
            }
            pinned[DCB] = self._stream_dcb_routes(name)  # events/0's too: the stream has several
            door.pinned = pinned
        return door.pinned

    def _consumer_refusal(self, name: str) -> Handler[Principal]:
        def desc() -> str:
            info = self._streams.get(name)
            count = len(info.partitions) if info is not None else 0
            return (
                f"The stream {name} has {count} partitions: consume each at /{name}/P"
                f" (/{name}/0 to /{name}/{count - 1}); /{name} takes addEvent only"
            )

        return self._refusal(name, Right.READ, desc)

    # -- streams dropped --------------------------------------------------------------------

    def _registry_changed(self) -> None:
        for key, door in list(self._doors.items()):
            partition = door.partition
            if self._streams.partition(partition.stream, partition.number) == partition:
                continue
            del self._doors[key]
            self._close_door(door)
        for name in [name for name in self._turns if self._streams.get(name) is None]:
            del self._turns[name]

    def _close_door(self, door: _PartitionDoor) -> None:
        """Every call on the partition's routes is refused from now on, its pushes stop."""
        partition = door.partition
        logger.info("stream %s dropped: its connections are refused", partition)
        name = partition.stream
        for routes in (door.routes, door.pinned or {}):
            for iface in (GEN, POLL, PUSH):
                funcs = routes.get(iface, {})
                for func in funcs:
                    if func != "ping":
                        funcs[func] = self._refusal(
                            name, _NEEDS[iface][func], lambda: f"The stream {name} was dropped"
                        )
        self._push.forget_partition(partition)

    def close(self) -> None:
        self._stop_listening()
