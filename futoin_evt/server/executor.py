"""The FTN3 executor: from a checked request to a reply, with security and validation.

Order of checks: credentials, iface/version/function (masked as UnknownInterface for an
anonymous caller, so nobody probes without credentials), iface constraints (anonymous,
secure channel), request size, params. Errors a function does not declare go out as
InternalError and are logged with their traceback; a database that does not answer
is InternalError too, saying so, logged in one line. Every other failure of the log is
answered by its kind (:data:`FAULTS`, :mod:`futoin_evt.log.errors`) with its one sentence: a
call refused in ``log/`` for a right the caller lacks (:class:`~futoin_evt.log.access.Refused`)
is SecurityError, naming the right and the stream; before it answers, the
rights are read again (:attr:`Executor.recheck`), and when they changed the call is made once
more, so a right granted a moment ago is never refused.

Dispatch is synchronous wherever it can be: with credentials already verified, the checks
and the handler run inside the frame's ``data_received``; a handler that only waits for the
store returns a :class:`Pending` future and the reply is sent from its done-callback. Only
handlers written as coroutines, and first-time credentials, get a task. On a hot path such as
``addEvent`` that saves a task and a chain of coroutine frames per call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..auth.users import Authenticator
from ..domain.principal import Principal
from ..ftn3.calls import CallContext, Deferred, Handler, PeerLink, Pending, Routes
from ..ftn3.errors import (
    DEFENSE_REJECTED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    NOT_IMPLEMENTED,
    SECURITY_ERROR,
    UNKNOWN_INTERFACE,
    FTN3Error,
)
from ..ftn3.ifaces import (
    ALLOW_ANONYMOUS,
    BIDIRECT_CHANNEL,
    SECURE_CHANNEL,
    FuncSpec,
    IfaceRegistry,
    IfaceSpec,
)
from ..ftn3.messages import EncodedJson, Request, decode_json, encode_error, encode_result
from ..log.access import Refused
from ..log.errors import Fault, fault_of
from ..slots import TOO_MANY_CONNECTIONS
from ..stats import CONNECTION, UNKNOWN, Calls

logger = logging.getLogger(__name__)

#: The FTN3 error each kind of failure of the log is answered with (:mod:`futoin_evt.log.errors`).
FAULTS: Final[dict[Fault, str]] = {
    Fault.UNAUTHENTICATED: SECURITY_ERROR,
    Fault.REFUSED: SECURITY_ERROR,
    Fault.BAD_INPUT: INVALID_REQUEST,
    Fault.NOT_WRITABLE: INVALID_REQUEST,
    Fault.CONDITION_FAILED: "AppendConditionFailed",
    Fault.ID_CONFLICT: "EventIdConflict",
    Fault.UNAVAILABLE: INTERNAL_ERROR,
    Fault.DAMAGED: INTERNAL_ERROR,
}

#: Where the encoded reply of a call goes.
Respond = Callable[[bytes], None]
_NO_FUNCS: Mapping[str, Handler[Principal]] = {}
#: How many distinct functions called are remembered with what serves them.
_RESOLVED_MEMO = 1024


def peer_host(peer: str) -> str:
    """The address part of ``host:port`` (work is limited per address, not per port)."""
    return peer.rpartition(":")[0] or peer


@dataclass(frozen=True, slots=True)
class Channel:
    """What the executor needs to know about the connection a request came on."""

    peer: str
    secure: bool
    bidirect: bool = True
    link: PeerLink | None = None
    #: Told of every call a user made (after the credentials were checked): False refuses
    #: the call (the connection may not be served, and is closed by whoever said so).
    log_in: Callable[[], bool] | None = None
    #: The door, for the metrics and log lines.
    door: str = "websocket"
    #: What serves this connection's calls (the FTN18 door of its path's partition); None:
    #: nothing (every call is NotImplemented).
    routes: Routes[Principal] | None = None


class Executor:
    def __init__(
        self,
        registry: IfaceRegistry,
        authenticator: Authenticator,
        *,
        check_results: bool = False,
    ) -> None:
        self._registry = registry
        self._auth = authenticator
        self._check_results = check_results
        self._tasks: set[asyncio.Task[None]] = set()
        #: (iface, major, minor, func) of requests -> their definitions, once resolved.
        self._resolved: dict[tuple[str, int, int, str], tuple[IfaceSpec, FuncSpec]] = {}
        #: Calls by iface, function and outcome, with their latency (metrics).
        self.calls = Calls("websocket")
        #: Reads the rights again: True when they changed (a refused call is then made
        #: once more).
        self.recheck: Callable[[], Awaitable[bool]] | None = None

    def dispatch(self, request: Request, size: int, channel: Channel, respond: Respond) -> None:
        """Run one request; ``respond`` gets the encoded reply exactly once, now or later.

        Never raises: whatever fails becomes the error reply, so the caller's count of calls
        in flight always comes back down.
        """
        started = time.perf_counter()
        try:
            principal = self._auth.cached(request.sec) if request.sec else None
            CONNECTION.set((channel.door, channel.peer, principal.name if principal else None))
            if request.sec and principal is None:
                self._spawn(self._call_slowly(request, size, channel, respond, started))
                return
            func, outcome = self._start(request, size, channel, principal)
        except Exception as exc:
            if isinstance(exc, Refused) and self.recheck is not None:
                self._spawn(self._refused(request, size, channel, respond, started, None, exc))
                return
            respond(self._error_reply(request, None, exc, channel, started))
            return
        if isinstance(outcome, Pending):

            def pending_done(done: Deferred[Any]) -> None:
                if self.recheck is not None and not done.cancelled():
                    exc = done.exception()
                    if isinstance(exc, Refused):
                        self._spawn(
                            self._refused(request, size, channel, respond, started, func, exc)
                        )
                        return
                respond(self._pending_reply(request, func, outcome, done, channel, started))

            outcome.future.add_done_callback(pending_done)
        elif asyncio.iscoroutine(outcome):
            self._spawn(self._await_reply(request, size, func, outcome, channel, respond, started))
        else:
            respond(self._reply(request, func, outcome, channel, started))

    async def call(self, request: Request, size: int, channel: Channel) -> bytes:
        """:meth:`dispatch` as a coroutine (for callers that are not in a hurry)."""
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.dispatch(request, size, channel, reply.set_result)
        return await reply

    async def wait_idle(self) -> None:
        """Until every task the executor started has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the steps ----------------------------------------------------------------------------

    def _start(
        self, request: Request, size: int, channel: Channel, principal: Principal | None
    ) -> tuple[FuncSpec, Any]:
        key = (request.iface, request.major, request.minor, request.func)
        resolved = self._resolved.get(key)
        if resolved is None:
            resolved = self._resolve(request, principal)
            if len(self._resolved) < _RESOLVED_MEMO:
                self._resolved[key] = resolved
        iface, func = resolved
        routes = channel.routes
        handler = routes.get(iface.name, _NO_FUNCS).get(func.name) if routes is not None else None
        if principal is None and ALLOW_ANONYMOUS not in iface.requires:
            raise FTN3Error(SECURITY_ERROR, "Anonymous not allowed")
        if channel.log_in is not None and not channel.log_in():
            raise FTN3Error(DEFENSE_REJECTED, TOO_MANY_CONNECTIONS.capitalize())
        if SECURE_CHANNEL in iface.requires and not channel.secure:
            raise FTN3Error(SECURITY_ERROR, "Insecure channel")
        if BIDIRECT_CHANNEL in iface.requires and not channel.bidirect:
            raise FTN3Error(SECURITY_ERROR, "Bi-directional channel is required")
        if size > func.max_request_bytes:
            raise FTN3Error(INVALID_REQUEST, f"Request exceeds {func.max_request_bytes} bytes")
        params = func.check_params(request.params)
        if handler is None:
            raise FTN3Error(NOT_IMPLEMENTED, f"Not implemented: {request.f}")
        assert principal is not None  # no served iface allows anonymous callers
        if channel.link is not None:  # closed when the user's password changes
            self._auth.bind(principal, channel.link)
        ctx = CallContext(principal, func.max_response_bytes, channel.link)
        return func, handler(ctx, params)

    def _resolve(self, request: Request, principal: Principal | None) -> tuple[IfaceSpec, FuncSpec]:
        try:
            iface = self._registry.resolve(request.iface, request.major, request.minor)
            func = iface.funcs.get(request.func)
            if func is None:
                raise FTN3Error(INVALID_REQUEST, f"Not defined interface function: {request.f}")
        except FTN3Error as exc:
            if principal is None:
                raise FTN3Error(UNKNOWN_INTERFACE, f"Unknown interface: {request.iface}") from exc
            raise
        return iface, func

    async def _refused(
        self,
        request: Request,
        size: int,
        channel: Channel,
        respond: Respond,
        started: float,
        func: FuncSpec | None,
        exc: Refused,
    ) -> None:
        """A call refused for a right: when the rights changed since they were read, the
        call is made once more; else the refusal is the answer."""
        assert self.recheck is not None
        try:
            moved = await self.recheck()
        except Exception as failed:  # the database is away: the rights known answer
            logger.debug("the rights could not be read again: %s", failed)
            moved = False
        if moved:
            await self._call_slowly(request, size, channel, respond, started, again=True)
        else:
            respond(self._error_reply(request, func, exc, channel, started))

    async def _call_slowly(
        self,
        request: Request,
        size: int,
        channel: Channel,
        respond: Respond,
        started: float,
        *,
        again: bool = False,
    ) -> None:
        """First use of some credentials: verify them (slow by design), then run the call
        (``again``: a call refused once, made again after the rights changed)."""
        func: FuncSpec | None = None
        try:
            assert request.sec is not None
            principal = await self._auth.authenticate(request.sec, peer_host(channel.peer))
            CONNECTION.set((channel.door, channel.peer, principal.name))
            func, outcome = self._start(request, size, channel, principal)
            if isinstance(outcome, Pending):
                value = await outcome.future
                outcome = outcome.then(value) if outcome.then else value
            elif asyncio.iscoroutine(outcome):
                outcome = await outcome
        except Exception as exc:
            if isinstance(exc, Refused) and not again and self.recheck is not None:
                await self._refused(request, size, channel, respond, started, func, exc)
                return
            respond(self._error_reply(request, func, exc, channel, started))
            return
        respond(self._reply(request, func, outcome, channel, started))

    async def _await_reply(
        self,
        request: Request,
        size: int,
        func: FuncSpec,
        outcome: Coroutine[Any, Any, Any],
        channel: Channel,
        respond: Respond,
        started: float,
    ) -> None:
        try:
            result = await outcome
        except Exception as exc:
            if isinstance(exc, Refused) and self.recheck is not None:
                await self._refused(request, size, channel, respond, started, func, exc)
                return
            respond(self._error_reply(request, func, exc, channel, started))
            return
        respond(self._reply(request, func, result, channel, started))

    def _pending_reply(
        self,
        request: Request,
        func: FuncSpec,
        pending: Pending,
        done: Deferred[Any],
        channel: Channel,
        started: float,
    ) -> bytes:
        try:
            value = done.result()
            result = pending.then(value) if pending.then else value
        except BaseException as exc:  # a cancelled future, too
            return self._error_reply(request, func, exc, channel, started)
        return self._reply(request, func, result, channel, started)

    def _reply(
        self, request: Request, func: FuncSpec, result: Any, channel: Channel, started: float
    ) -> bytes:
        if self._check_results:
            value = decode_json(result.text) if isinstance(result, EncodedJson) else result
            problem = func.result_problem(value)
            if problem is not None:
                return self._error_reply(request, func, AssertionError(problem), channel, started)
        reply = encode_result(request.rid, result)
        if len(reply) > func.max_response_bytes:
            logger.error(
                "%s: reply of %d bytes exceeds %d", request.f, len(reply), func.max_response_bytes
            )
            self._count(request, func, INTERNAL_ERROR, started)
            return encode_error(request.rid, INTERNAL_ERROR, "Response too large")
        self._count(request, func, "ok", started)
        return reply

    def _count(self, request: Request, func: FuncSpec | None, outcome: str, started: float) -> None:
        """Count the call; labels only from what the ifaces define (``unknown`` else)."""
        if func is None:  # refused before its function was at hand: known when resolved once
            resolved = self._resolved.get(
                (request.iface, request.major, request.minor, request.func)
            )
            func = resolved[1] if resolved is not None else None
        if func is None:
            self.calls.observe(UNKNOWN, UNKNOWN, outcome, time.perf_counter() - started)
        else:
            self.calls.observe(request.iface, func.name, outcome, time.perf_counter() - started)

    def _error_reply(
        self,
        request: Request,
        func: FuncSpec | None,
        exc: BaseException,
        channel: Channel,
        started: float,
    ) -> bytes:
        if isinstance(exc, FTN3Error):
            if func is None or func.may_raise(exc.name):
                # an error name the executor or the iface declares: a bounded set
                self._count(request, func, exc.name, started)
                return encode_error(request.rid, exc.name, exc.desc)
            logger.error("%s raised undeclared %s: %s", request.f, exc.name, exc.desc)
        elif (fault := fault_of(exc)) is not None:
            name = FAULTS[fault]
            if fault is Fault.UNAVAILABLE:
                logger.warning("%s from %s: database unavailable: %s", request.f, channel.peer, exc)
                desc = f"Database unavailable: {exc}"
            else:
                desc = str(exc)
            self._count(request, func, name, started)
            return encode_error(request.rid, name, desc)
        else:
            logger.error("%s from %s failed", request.f, channel.peer, exc_info=exc)
        self._count(request, func, INTERNAL_ERROR, started)
        return encode_error(request.rid, INTERNAL_ERROR, "Internal error")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
