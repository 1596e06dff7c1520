"""One AMQP connection: our SASL layer, then our sans-I/O engine, driven by asyncio.

Bytes from the socket go to :class:`~.sasl.SaslServer` until the login is settled, then to an
:class:`~.engine.protocol.AmqpProtocol` whose events are dispatched here: links go to the node
table, which hands each a handler; messages, credit and outcomes go to the link's handler.
What the engine has to send leaves in one write per turn of the loop.

The connection acts as one user, logged in with SASL PLAIN or named by the SAS tokens put to
``$cbs``; each token adds its scope (its ``sr``), and a login with PLAIN has none to keep to.
A node asks :meth:`AmqpConnection.authorize` before it takes a link to a stream: the user's
right on the stream (:mod:`futoin_evt.log.access`) and, with tokens, a scope that covers the
address. The link is then detached with ``amqp:unauthorized-access`` once the right is
revoked, or the last token that covered it expires. The whole connection is closed so once
its user's password changes, the user is removed, or (a SAS policy) is made again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, cast

from .. import __version__
from ..auth.login_log import log_failed_login
from ..auth.plain import parse_plain
from ..auth.sas import TokenClaims, host_name, path_covers, scope_path
from ..auth.users import CREDENTIALS_CHANGED, Authenticator
from ..domain.partition import STREAM_NAME_RE
from ..domain.principal import NotAuthenticated, Principal
from ..domain.rights import Right
from ..log.access import Access, AccessDenied
from ..log.connections import Connections
from ..quoting import quote_input
from ..slots import LINGER_BYTES, LINGER_SECONDS, TOO_MANY_CONNECTIONS, Slots, half_close
from ..stats import CONNECTION
from .config import AmqpConfig
from .engine.conditions import RESOURCE_LIMIT, UNAUTHORIZED
from .engine.events import (
    ConnectionClosed,
    DeliveriesUpdated,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    MessageReceived,
    SessionEnded,
)
from .engine.protocol import AmqpProtocol
from .engine.session import Link
from .engine.types import Symbol
from .sasl import AMQP_HEADER, Outcome, SaslError, SaslInit, SaslServer
from .table import NO_USER, LinkHandler, LinkRefused, NodeTable

logger = logging.getLogger(__name__)

CAPABILITY: Final = "AMQP_EVENT_STREAMS_V1_0"
CONTAINER_ID: Final = "futoin-evt"
MECHANISMS: Final = ("PLAIN", "ANONYMOUS")
PROPERTIES: Final[dict[Any, Any]] = {
    Symbol("product"): "futoin-evt",
    Symbol("version"): __version__,
}
#: Why a link that only an expired token covered is detached.
EXPIRED_FOR_LINK: Final = "the token put to $cbs for this link has expired and was not renewed"
#: Each right, for "some right on a stream".
_RIGHTS: Final = (Right.READ, Right.WRITE, Right.MANAGE)
#: Links one connection may hold at once, refused ones not yet detached by the peer included:
#: beyond this many times the link limit, the connection is closed.
_HELD_LINKS_FACTOR: Final = 4


class Listener(Protocol):
    """What a connection needs of the listener that accepted it (the engine knows no server)."""

    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def access(self) -> Access: ...
    @property
    def config(self) -> AmqpConfig: ...
    @property
    def table(self) -> NodeTable: ...

    @property
    def slots(self) -> Slots[AmqpConnection]: ...

    @property
    def connections(self) -> Connections | None:
        """Where a connection is listed once its user is known (the console's page)."""

    def opened(self, connection: AmqpConnection) -> None:
        """A new connection takes a handshake slot (an older handshake may be cut for it)."""

    def forget(self, connection: AmqpConnection) -> None:
        """The connection is gone."""


class AmqpConnection(asyncio.Protocol):
    """The asyncio side of one connection."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._authenticator: Authenticator = listener.authenticator
        self._access: Access = listener.access
        self._limits = listener.config.limits
        self._sasl = SaslServer(MECHANISMS)
        self._socket: asyncio.Transport | None = None
        #: Once the server closed the connection: how much more input is dropped before a cut.
        self._linger_left: int | None = None
        self._peer: Any = None
        #: (door, peer, user) for log lines, set on each read.
        self._log_context: tuple[str, str, str | None] = ("amqp", "?", None)
        #: The user logged in with PLAIN or named by a token put to ``$cbs``; None before.
        self.principal: Principal | None = None
        #: The scopes of the tokens put to ``$cbs`` (scope path -> expiry, Unix seconds);
        #: None when no token was (a login with PLAIN is not scoped).
        self._scopes: dict[str, float] | None = None
        self._claims_timer: asyncio.TimerHandle | None = None
        #: How to stop watching the user's credentials (set once a user is known).
        self._unwatch_user: Callable[[], None] | None = None
        #: The links that depend on a right (and on the tokens' scopes): how to stop watching.
        self._guards: dict[Link, _Guard] = {}
        self._engine: AmqpProtocol | None = None
        self._handlers: dict[Link, LinkHandler] = {}
        #: Called when a session ends (by the session), or the connection (by None).
        self._endings: dict[object, list[Callable[[], None]]] = {}
        self._processing = False
        self._timer: asyncio.TimerHandle | None = None
        self._auth_task: asyncio.Task[None] | None = None
        self._wake_pending = False
        self.writable = True
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's are not subclasses of asyncio.Transport.
        self._socket = socket = cast(asyncio.Transport, transport)
        self._peer = socket.get_extra_info("peername")
        self._log_context = ("amqp", _peer(self._peer), None)
        logger.debug("AMQP connection from %s", _peer(self._peer))
        socket.set_write_buffer_limits(high=self._limits.max_unread_bytes)
        self._listener.opened(self)
        self._arm_login_timer()

    def data_received(self, data: bytes) -> None:
        if self._linger_left is not None:
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self.abort()
            return
        CONNECTION.set(self._log_context)
        if self._engine is not None:
            self._push(data)
            return
        try:
            init = self._sasl.receive(data)
        except SaslError as exc:
            logger.info("AMQP connection from %s: %s", _peer(self._peer), exc)
            self._write(self._sasl.data_to_send())
            self._close_socket()
            return
        self._write(self._sasl.data_to_send())
        if init is not None:
            self._auth_task = asyncio.ensure_future(self._login(init))
        elif self._sasl.done:  # the AMQP header followed a successful outcome
            self._start_engine(self._sasl.take_rest())

    def eof_received(self) -> bool | None:
        if self._engine is not None and self._linger_left is None:
            self._engine.receive_eof()
            self.process()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._listener.forget(self)
        for timer in (self._timer, self._claims_timer):
            if timer is not None:
                timer.cancel()
        if self._auth_task is not None:
            self._auth_task.cancel()
        if self._engine is not None:
            self._engine.lost()
        for handler in list(self._handlers.values()):
            handler.on_closed()
        self._handlers.clear()
        guards, self._guards = self._guards, {}
        for guard in guards.values():
            guard.stop_watching()
        if self._unwatch_user is not None:
            self._unwatch_user()
            self._unwatch_user = None
        self._engine = None
        endings, self._endings = self._endings, {}
        for callbacks in endings.values():
            for callback in callbacks:
                callback()
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        for handler in list(self._handlers.values()):
            handler.on_writable()

    # -- login ----------------------------------------------------------------------------------

    async def _login(self, init: SaslInit) -> None:
        if self._timer is not None:  # the peer has spoken: checking it is the server's time
            self._timer.cancel()
            self._timer = None
        if init.mechanism == "ANONYMOUS":
            # Allowed in, but the node refuses every link to a connection without a user,
            # and the connection keeps its handshake slot until a token names one.
            outcome = Outcome.OK
        else:
            outcome = await self._check_plain(init.initial_response)
            if outcome is Outcome.OK and not self._listener.slots.establish(self):
                outcome = Outcome.SYS_TEMP
        if self._socket is None or self._socket.is_closing():
            return
        try:
            self._sasl.outcome(outcome)
        except SaslError as exc:  # what the peer sent on after its init is not AMQP
            logger.info("AMQP connection from %s: %s", _peer(self._peer), exc)
            outcome = Outcome.AUTH
        self._write(self._sasl.data_to_send())
        if outcome is not Outcome.OK:
            self._close_socket()
            return
        if self._sasl.done:
            self._start_engine(self._sasl.take_rest())
        else:  # the peer's AMQP header is to come
            self._arm_login_timer()

    async def _check_plain(self, response: bytes) -> Outcome:
        credentials = parse_plain(response)
        if credentials is not None:
            user, password = credentials
            try:
                self.principal = await self._authenticator.authenticate(
                    f"{user}:{password}", _host(self._peer)
                )
            except NotAuthenticated:
                pass
            except Exception:  # the user store failed (the server is closing, say)
                logger.exception("AMQP login of %r could not be checked", user[:64])
                return Outcome.SYS_TEMP
            else:
                self._log_context = ("amqp", _peer(self._peer), self.principal.name)
                CONNECTION.set(self._log_context)
                self._watch_user(self.principal)
                return Outcome.OK
        if credentials is None:  # a failed check is logged by the authenticator
            log_failed_login("amqp", "", _host(self._peer), "not a SASL PLAIN response")
        return Outcome.AUTH

    @property
    def peer_name(self) -> str:
        """The peer's address, for log lines."""
        return _peer(self._peer)

    @property
    def container_id(self) -> str | None:
        """The peer's container id (its open's); None before the open."""
        engine = self._engine
        remote = engine.remote_open if engine is not None else None
        return remote.container_id if remote is not None else None

    def when_ended(
        self, link: Link, session: bool, callback: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``callback`` once ``link``'s session (``session``) or the connection ends;
        returns how to cancel that."""
        key: object = link.session if session else None
        self._endings.setdefault(key, []).append(callback)

        def cancel() -> None:
            callbacks = self._endings.get(key)
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del self._endings[key]

        return cancel

    @property
    def host(self) -> str:
        """The host the peer reached, as tokens name it: its open's hostname, else (a peer
        that sends none) the address of our end of the socket."""
        engine = self._engine
        remote = engine.remote_open if engine is not None else None
        if remote is not None and remote.hostname:
            return host_name(remote.hostname)
        local = self._socket.get_extra_info("sockname") if self._socket is not None else None
        return host_name(str(local[0])) if isinstance(local, tuple) and local else ""

    def grant_claims(self, claims: TokenClaims) -> tuple[int, str] | None:
        """A token put to ``$cbs``: None when the connection now acts as its user (within its
        scope, beside those of the user's earlier tokens), else the status and why not."""
        current = self.principal
        principal = claims.principal
        if current is not None and current.user_id != principal.user_id:
            return 403, f"this connection acts as user {current.name} already"
        if current is not None and self._scopes is None:
            return None  # logged in with PLAIN: no token is needed, and none expires it
        host = self.host
        if claims.scope.host != host:
            return 401, (
                f"the token's resource (sr) names host {quote_input(claims.scope.host, 80)},"
                f" not {quote_input(host, 80)} that this connection reached"
            )
        stream = claims.scope.path.partition("/")[0]
        if stream and not stream.startswith("$") and not self._holds_any(principal, stream):
            # as Event Hubs refuses a hub's policy for another hub: the SDKs say "unauthorized"
            return (
                401,
                f"the token's user {principal.name} holds no right on stream {_named(stream)}",
            )
        if not self._listener.slots.establish(self):
            return 503, TOO_MANY_CONNECTIONS
        if current is None:
            self._watch_user(principal)
        self.principal = principal
        scopes = self._scopes if self._scopes is not None else {}
        self._scopes = scopes
        path = claims.scope.path
        scopes[path] = max(scopes.get(path, 0.0), float(claims.expiry))
        self._arm_claims_timer()
        return None

    def _watch_user(self, principal: Principal) -> None:
        """Close the connection once ``principal``'s credentials change (a new password, a
        policy made again: its key, and so its tokens, changed too) or they are removed."""

        def ended() -> None:
            self._unwatch_user = None
            logger.info("AMQP connection from %s: %s", _peer(self._peer), CREDENTIALS_CHANGED)
            guards, self._guards = self._guards, {}
            for guard in guards.values():  # the close says why, not a detach per link
                guard.stop_watching()
            self.close(UNAUTHORIZED, CREDENTIALS_CHANGED)

        self._unwatch_user = self._authenticator.watch_user(principal, ended)
        listed = self._listener.connections  # once a user is known, as the watch
        if listed is not None:
            key = listed.add("AMQP 1.0", principal.name, _peer(self._peer), self._forced)
            self.closed.add_done_callback(lambda _closed: listed.remove(key))

    def _forced(self, reason: str) -> None:
        """An operator closes the connection (``amqp:connection:forced``)."""
        logger.info("AMQP connection from %s: %s", _peer(self._peer), reason)
        self.close("amqp:connection:forced", reason)

    def _holds_any(self, principal: Principal, stream: str) -> bool:
        allows = self._access.allows
        return any(allows(principal, right, stream) for right in _RIGHTS)

    def _arm_claims_timer(self) -> None:
        """Wake when the first of the tokens expires."""
        if self._claims_timer is not None:
            self._claims_timer.cancel()
        assert self._scopes
        delay = max(min(self._scopes.values()) - time.time(), 0.0)
        self._claims_timer = asyncio.get_running_loop().call_later(delay, self._claims_expired)

    def _claims_expired(self) -> None:
        """Tokens expired: their scopes go, and the links no other scope covers are detached;
        once none is left, the connection is closed."""
        self._claims_timer = None
        scopes = self._scopes
        assert scopes is not None
        now = time.time()
        for path in [path for path, expiry in scopes.items() if expiry <= now]:
            del scopes[path]
        if not scopes:
            logger.info("AMQP connection from %s: its token expired", _peer(self._peer))
            self.close(UNAUTHORIZED, "the token put to $cbs has expired and was not renewed")
            return
        for link, guard in list(self._guards.items()):
            if not self._scoped_in(guard.paths):
                self.detach(link, UNAUTHORIZED, EXPIRED_FOR_LINK)
        self._arm_claims_timer()

    def _scoped_in(self, paths: Sequence[str]) -> bool:
        """Whether the tokens' scopes (if the connection has any) cover one of ``paths``."""
        scopes = self._scopes
        if scopes is None:
            return True
        now = time.time()
        wanted = [scope_path(path) for path in paths]
        return any(
            expiry > now and any(path_covers(own, path) for path in wanted)
            for own, expiry in scopes.items()
        )

    def refusal(self, right: Right, stream: str, paths: Sequence[str]) -> str | None:
        """Why the connection may not use ``right`` on ``stream`` at one of the address
        ``paths`` (one sentence), or None when it may."""
        who = self.principal
        if who is None:
            return NO_USER
        if not self._scoped_in(paths):
            return f"no token put to $cbs on this connection covers {quote_input(paths[0], 80)}"
        if not self._access.allows(who, right, stream):
            return _denied(right, stream)
        return None

    def authorize(self, link: Link, right: Right, stream: str, paths: Sequence[str]) -> None:
        """:class:`LinkRefused` (``amqp:unauthorized-access``) when :meth:`refusal` gives a
        reason; else ``link`` is detached so once the right is revoked, or the tokens that
        cover it expire."""
        reason = self.refusal(right, stream, paths)
        if reason is not None:
            raise LinkRefused(UNAUTHORIZED, reason)
        who = self.principal
        assert who is not None
        previous = self._guards.pop(link, None)
        if previous is not None:
            previous.stop_watching()

        def revoked() -> None:
            if self._guards.get(link) is guard:
                self.detach(link, UNAUTHORIZED, _denied(right, stream))

        guard = _Guard(tuple(paths), self._access.watch(who, right, stream, revoked))
        self._guards[link] = guard

    def _start_engine(self, rest: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        limits = self._limits
        self._engine = AmqpProtocol(
            CONTAINER_ID,
            max_frame_size=limits.max_frame_bytes,
            idle_timeout=limits.idle_timeout,
            max_links=limits.max_links * _HELD_LINKS_FACTOR,
            properties=PROPERTIES,
            offered_capabilities=[CAPABILITY],
        )
        self._push(AMQP_HEADER + rest)

    def _arm_login_timer(self) -> None:
        # A peer that never finishes logging in does not keep its socket.
        self._timer = asyncio.get_running_loop().call_later(
            self._limits.idle_timeout, self._close_socket
        )

    # -- the engine -----------------------------------------------------------------------------

    def _push(self, data: bytes) -> None:
        engine = self._engine
        assert engine is not None
        engine.receive_data(data)
        self.process()

    def process(self) -> None:
        """Dispatch the engine's events and write what it has to send. Re-entrant calls (a
        handler that changes state while we dispatch) are folded into the running one."""
        engine = self._engine
        if self._processing or engine is None:
            return
        self._processing = True
        try:
            while events := engine.events():
                for event in events:
                    self._dispatch(event)
            self._flush()
        finally:
            self._processing = False

    def wake(self) -> None:
        """Process soon: handlers call this after changing links outside of dispatch, and the
        changes of one loop turn (a commit settles many deliveries) go out together."""
        if not self._wake_pending and self._engine is not None:
            self._wake_pending = True
            asyncio.get_running_loop().call_soon(self._woken)

    def _woken(self) -> None:
        self._wake_pending = False
        self.process()

    def _flush(self) -> None:
        engine = self._engine
        if engine is None:
            return
        out = engine.data_to_send()
        if out:
            self._write(out)
        if engine.finished:
            self._close_socket()
            return
        deadline = engine.tick()
        out = engine.data_to_send()  # an empty frame the tick sent, or its close
        if out:
            self._write(out)
        if engine.finished:
            self._close_socket()
            return
        self._schedule_tick(deadline)

    def _schedule_tick(self, deadline: float | None) -> None:
        """Tick at ``deadline`` (engine clock), or before: a timer that fires earlier is
        kept (its tick arms the next), so busy connections do not re-arm one per turn."""
        timer = self._timer
        if deadline is None:
            if timer is not None:
                timer.cancel()
                self._timer = None
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + max(deadline - time.monotonic(), 0.0)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._timer = loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.process()

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, MessageReceived):
            handler = self._handlers.get(event.link)
            if handler is not None:
                handler.on_delivery(event.delivery)
        elif isinstance(event, DeliveriesUpdated):
            handler = self._handlers.get(event.link)
            if handler is not None:
                handler.on_outcomes(event.deliveries)
        elif isinstance(event, LinkFlow):
            handler = self._handlers.get(event.link)
            if handler is not None:
                handler.on_flow()
        elif isinstance(event, LinkAttached):
            self._attach(event.link)
        elif isinstance(event, LinkDetached):
            self._detached(event.link, event.by_peer)
        elif isinstance(event, SessionEnded):
            # Its links end with it (AMQP 2.5.4), without detaches of their own.
            for link in event.links:
                self._forget_link(link)
            for callback in self._endings.pop(event.session, ()):
                callback()
        elif isinstance(event, ConnectionClosed) and event.error is not None:
            error = event.error
            logger.info(
                "AMQP connection from %s: %s: %s",
                _peer(self._peer),
                error.condition,
                error.description,
            )

    def _forget_link(self, link: Link) -> asyncio.Future[None] | None:
        guard = self._guards.pop(link, None)
        if guard is not None:
            guard.stop_watching()
        handler = self._handlers.pop(link, None)
        return handler.on_closed() if handler is not None else None

    def _detached(self, link: Link, by_peer: bool) -> None:
        finishing = self._forget_link(link)
        if not by_peer:
            return  # the engine detached it (a message too large): answered already
        if finishing is None or finishing.done():
            link.close()
        else:
            finishing.add_done_callback(lambda _done: self._close_link(link))

    def _attach(self, link: Link) -> None:
        if len(self._handlers) >= self._limits.max_links:
            limit = self._limits.max_links
            link.refuse(RESOURCE_LIMIT, f"at most {limit} links per connection")
            return
        try:
            handler = self._listener.table.attach(self, link)
        except LinkRefused as exc:
            guard = self._guards.pop(link, None)
            if guard is not None:
                guard.stop_watching()
            link.refuse(exc.condition, str(exc))
            return
        self._handlers[link] = handler

    def _close_link(self, link: Link) -> None:
        if self._engine is not None:
            link.close()
            self.wake()

    def detach(self, link: Link, condition: str, description: str) -> None:
        """Close one of our links with an error (the link's handler is told)."""
        self._forget_link(link)
        link.close(condition, description)
        self.wake()

    # -- closing --------------------------------------------------------------------------------

    def close(self, condition: str, description: str) -> None:
        """Close the connection with an error (the server is shutting down, say)."""
        if self._engine is None:
            self._close_socket()
            return
        self._engine.close(condition, description)
        self.process()

    def abort(self) -> None:
        """Cut the socket at once (its handshake slot is wanted for a newer connection)."""
        if self._socket is not None:
            self._socket.abort()

    def _write(self, data: bytes | bytearray) -> None:
        if data and self._socket is not None and not self._socket.is_closing():
            self._socket.write(data)

    def _close_socket(self) -> None:
        """Close once what is written has gone, reading and dropping what the peer still
        sends meanwhile (within ``LINGER_BYTES`` and ``LINGER_SECONDS``), so that a peer in the
        middle of a large frame gets the close frame rather than a reset."""
        socket = self._socket
        if socket is None or socket.is_closing() or self._linger_left is not None:
            return
        if half_close(socket):
            self._linger_left = LINGER_BYTES
            asyncio.get_running_loop().call_later(LINGER_SECONDS, self.abort)


def _denied(right: Right, stream: str) -> str:
    """:class:`AccessDenied`'s sentence."""
    return str(AccessDenied(right, _named(stream)))


def _named(stream: str) -> str:
    """A stream's name as a refusal says it: quoted when it can be no stream's (it is the
    peer's input, of any length)."""
    return stream if STREAM_NAME_RE.fullmatch(stream) else quote_input(stream, 80)


class _Guard:
    """A link that depends on a right: the address paths a token's scope must cover, and
    how to stop watching the right."""

    __slots__ = ("paths", "stop_watching")

    def __init__(self, paths: tuple[str, ...], stop_watching: Callable[[], None]) -> None:
        self.paths = paths
        self.stop_watching = stop_watching


def _host(address: Any) -> str:
    """The peer's address without its port: checks and log lines count per address."""
    if isinstance(address, tuple) and address:
        return str(address[0])
    return str(address)


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
