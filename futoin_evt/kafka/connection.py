"""One Kafka client connection: size-prefixed frames in, answers out in the order the requests
came (Kafka's clients match them by order as well as correlation id).

A connection holds a handshake slot until it logs in with SASL (SaslHandshake, then
SaslAuthenticate, or after SaslHandshake v0 the bare SASL tokens, each answered with a
size-prefixed one): PLAIN with a password or, as ``$ConnectionString``, an Event Hubs
connection string, in one step; SCRAM-SHA-256 and SCRAM-SHA-512 in two. Before that only
ApiVersions and the SASL requests are served, as on a Kafka listener with SASL, and anything
else closes it.
Requests run concurrently (a Fetch waiting for records does not hold the answers before it
back from being computed), at most ``max_in_flight`` at once; a client that leaves more than
``max_unread_bytes`` of answers unread is not read from until it catches up. A frame larger
than ``max_request_bytes`` (before a login: :data:`MAX_BEFORE_LOGIN`), or one that is not a
request, closes the connection, as Kafka does.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, Final, Protocol, cast

from ..auth.connection_string import CONNECTION_STRING_USER
from ..auth.login_log import log_failed_login
from ..auth.plain import parse_plain
from ..auth.sasl_logins import ConnectionStringLogins, ScramLogin, ScramLogins
from ..auth.scram import MECHANISMS as SCRAM_MECHANISMS
from ..auth.users import Authenticator
from ..domain.principal import NotAuthenticated, Principal
from ..slots import TOO_MANY_CONNECTIONS, Slots
from ..stats import CONNECTION
from . import wire
from .broker import Broker
from .config import KafkaConfig

logger = logging.getLogger(__name__)

PLAIN: Final = "PLAIN"
#: The SASL mechanisms, when the listener has SCRAM logins (else PLAIN only).
MECHANISMS: Final = [PLAIN, *SCRAM_MECHANISMS]
#: The requests served before a login.
_BEFORE_LOGIN: Final = frozenset({wire.API_VERSIONS, wire.SASL_HANDSHAKE, wire.SASL_AUTHENTICATE})
_SIZE: Final = 4
#: The largest request before a login, as Kafka's ``sasl.server.max.receive.size``: a peer
#: without a user makes the door hold no more (max_request_bytes, when smaller).
MAX_BEFORE_LOGIN: Final = 512 * 1024
#: The largest request other than a Produce (max_request_bytes, when smaller): what no
#: client needs (a Metadata of every topic, a JoinGroup's protocols) is refused before it is
#: read, as decoding it would hold the loop and memory in proportion.
MAX_OTHER_REQUEST: Final = 8 * 1024 * 1024


class Door(Protocol):
    """What a connection needs of its listener."""

    @property
    def config(self) -> KafkaConfig: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def scram(self) -> ScramLogins | None: ...
    @property
    def connection_strings(self) -> ConnectionStringLogins | None: ...
    @property
    def slots(self) -> Slots[KafkaConnection]: ...

    def opened(self, connection: KafkaConnection) -> None: ...
    def logged_in(self, connection: KafkaConnection) -> None: ...
    def forget(self, connection: KafkaConnection) -> None: ...


class KafkaConnection(asyncio.Protocol):
    def __init__(self, listener: Door) -> None:
        self._listener = listener
        self._limits = listener.config.limits
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        #: The answers in request order: each a future of the framed answer (None: none).
        self._answers: collections.deque[asyncio.Future[bytes | None]] = collections.deque()
        self._reading = True
        self._writable = True
        self._closing = False
        self._mechanism: str | None = None
        #: After SaslHandshake v0: the next frame is the bare SASL token.
        self._bare_token = False
        #: A SCRAM login whose server-first message was sent.
        self._scram: ScramLogin | None = None
        #: A login under way (a SaslAuthenticate pipelined behind it is refused).
        self._logging_in = False
        #: The answer after which the connection closes (a failed login's).
        self._last_word: asyncio.Future[bytes | None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stop_watching: Callable[[], None] | None = None
        self.peer = ""
        self.principal: Principal | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- the transport ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # uvloop's is none by class
        self._transport = transport
        transport.set_write_buffer_limits(high=self._limits.max_unread_bytes)
        address = transport.get_extra_info("peername")
        if isinstance(address, tuple) and len(address) >= 2:
            self.peer = f"{address[0]}:{address[1]}"
            self.host = str(address[0])
        else:
            self.peer = self.host = str(address)
        self._listener.opened(self)
        self._arm(self._limits.login_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        if self._stop_watching is not None:
            self._stop_watching()
        for answer in self._answers:
            answer.cancel()
        self._answers.clear()
        self._listener.forget(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close once what is written has gone."""
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(seconds, self._silent)

    def _silent(self) -> None:
        if self._answers:  # waiting on a long request is not silence
            self._arm(self._limits.idle_timeout)
            return
        if self.principal is None:
            logger.info("Kafka: %s did not log in in time", self.peer)
        self.close()

    def pause_writing(self) -> None:
        self._writable = False
        self._pause()

    def resume_writing(self) -> None:
        self._writable = True
        self._resume()

    def _pause(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()

    def _resume(self) -> None:
        if (
            not self._reading
            and self._writable
            and len(self._answers) < self._limits.max_in_flight
            and self._transport is not None
            and not self._closing
        ):
            self._reading = True
            self._transport.resume_reading()
            self._take_frames()

    # -- requests -----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self._buffer += data
        if self.principal is not None:
            self._arm(self._limits.idle_timeout)
        self._take_frames()

    def _take_frames(self) -> None:
        buffer = self._buffer
        while not self._closing and self._reading and len(buffer) >= _SIZE:
            size = int.from_bytes(buffer[:_SIZE], "big", signed=True)
            most = self._limits.max_request_bytes
            if self.principal is None:
                most = min(most, MAX_BEFORE_LOGIN)
            elif size > MAX_OTHER_REQUEST and most > MAX_OTHER_REQUEST:
                if len(buffer) < _SIZE + 2:
                    return  # its API key first: only Produce carries records
                if int.from_bytes(buffer[_SIZE : _SIZE + 2], "big") != wire.PRODUCE:
                    most = MAX_OTHER_REQUEST
            if size < 0 or size > most:
                logger.warning(
                    "Kafka: %s sent a request of %d bytes (at most %d): closed",
                    self.peer, size, most,
                )  # fmt: skip
                self.close()
                return
            if len(buffer) < _SIZE + size:
                return
            frame = bytes(buffer[_SIZE : _SIZE + size])
            del buffer[: _SIZE + size]
            self._take(frame)
            if len(self._answers) >= self._limits.max_in_flight:
                self._pause()

    def _take(self, frame: bytes) -> None:
        if self._bare_token:
            self._bare_token = False
            self._queue(self._bare_login(frame))
            return
        try:
            header = wire.parse_header(frame)
        except wire.BadRequest as exc:
            self._refuse(str(exc))
            return
        key, version = header.api_key, header.api_version
        if self.principal is None and key not in _BEFORE_LOGIN:
            self._refuse(f"request {key} before a SASL login")
            return
        api = wire.APIS.get(key)
        if key == wire.API_VERSIONS:
            served = api is not None and api.min_version <= version <= api.max_version
            body = wire.api_versions_body(
                version if served else 0, wire.NONE if served else wire.UNSUPPORTED_VERSION
            )
            self._queue_now(wire.encode_response(body, header.correlation_id))
            return
        if api is None or not api.min_version <= version <= api.max_version:
            unsupported = wire.unsupported_body(key, version)
            if unsupported is None:
                self._refuse(f"request {key} v{version}, which no Kafka version has")
                return
            self._queue_now(wire.encode_response(unsupported, header.correlation_id))
            return
        try:
            request = wire.decode_body(api.request, frame, header)
        except wire.BadRequest as exc:
            self._refuse(str(exc))
            return
        if key == wire.SASL_HANDSHAKE:
            self._queue_now(wire.encode_response(self._handshake(request), header.correlation_id))
        elif key == wire.SASL_AUTHENTICATE:
            self._queue(self._authenticate(request, header.correlation_id))
        elif self.principal is not None:
            principal = self.principal
            answer = self._listener.broker.handlers[key](principal, request)
            silent = key == wire.PRODUCE and request.acks == 0
            self._queue(self._answer(answer, header.correlation_id, silent))

    def _refuse(self, reason: str) -> None:
        logger.info("Kafka: %s closed: %s", self.peer, reason)
        self.close()

    def _queue_now(self, framed: bytes) -> None:
        done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        done.set_result(framed)
        self._answers.append(done)
        self._flush()

    def _queue(self, answer: Any) -> None:
        task: asyncio.Future[bytes | None] = asyncio.ensure_future(answer)
        self._answers.append(task)
        task.add_done_callback(lambda _task: self._flush())

    def _flush(self) -> None:
        answers, transport = self._answers, self._transport
        while answers and answers[0].done():
            answer = answers.popleft()
            if answer.cancelled():
                continue
            failure = answer.exception()
            if failure is not None:
                logger.error("Kafka: a request of %s failed", self.peer, exc_info=failure)
                self.close()
                return
            framed = answer.result()
            if framed is not None and transport is not None and not self._closing:
                transport.write(framed)
            if answer is self._last_word:
                self.close()
                return
        self._resume()

    async def _answer(self, answer: Any, correlation_id: int, silent: bool) -> bytes | None:
        user = self.principal.name if self.principal is not None else None
        token = CONNECTION.set(("kafka", self.peer, user))
        try:
            response = await answer
        finally:
            CONNECTION.reset(token)
        return None if silent else wire.encode_response(response, correlation_id)

    # -- SASL ---------------------------------------------------------------------------------

    def _mechanisms(self) -> list[str]:
        return MECHANISMS if self._listener.scram is not None else [PLAIN]

    def _handshake(self, request: Any) -> Any:
        response = wire.APIS[wire.SASL_HANDSHAKE].response
        mechanisms = self._mechanisms()
        if request.mechanism not in mechanisms:
            return response(
                version=request.version,
                error_code=wire.UNSUPPORTED_SASL_MECHANISM,
                mechanisms=mechanisms,
            )
        self._mechanism = request.mechanism
        self._scram = None
        self._bare_token = request.version == 0
        return response(version=request.version, error_code=wire.NONE, mechanisms=mechanisms)

    async def _login(self, token: bytes) -> tuple[str | None, bytes]:
        """One step of the login: (None, what to answer), or (why not, b"") in one sentence.
        The connection is logged in once :attr:`principal` is set; SCRAM's first step answers
        the server-first message and leaves it unset."""
        if self.principal is not None:
            return "already logged in", b""
        if self._mechanism is None:
            return "a SaslHandshake must come first", b""
        if self._logging_in:
            return "a login is under way", b""
        context = CONNECTION.set(("kafka", self.peer, None))
        self._logging_in = True
        principal: Principal | None
        try:
            if self._mechanism == PLAIN:
                principal, answer = await self._plain(token), b""
            else:
                principal, answer = await self._scram_step(self._mechanism, token)
        except NotAuthenticated as exc:
            return str(exc), b""
        finally:
            self._logging_in = False
            CONNECTION.reset(context)
        if principal is None:
            return None, answer
        if self._closing:
            return "closed", b""
        if not self._listener.slots.establish(self):
            return TOO_MANY_CONNECTIONS, b""
        self.principal = principal
        self._stop_watching = self._listener.authenticator.watch_user(principal, self.close)
        self._listener.logged_in(self)
        self._arm(self._limits.idle_timeout)
        return None, answer

    async def _plain(self, token: bytes) -> Principal:
        """A PLAIN token's user: a password, or (as ``$ConnectionString``) an Event Hubs
        connection string."""
        credentials = parse_plain(token)
        if credentials is None:
            log_failed_login("kafka", "", self.host, "not a SASL PLAIN response")
            raise NotAuthenticated("Invalid credentials")
        name, password = credentials
        strings = self._listener.connection_strings
        if name == CONNECTION_STRING_USER and strings is not None:
            return await strings.authenticate(password, self.host)
        return await self._listener.authenticator.authenticate(f"{name}:{password}", self.host)

    async def _scram_step(self, mechanism: str, token: bytes) -> tuple[Principal | None, bytes]:
        """The client-first message: (None, the server-first); then the client-final one:
        (the user, the server-final)."""
        login, self._scram = self._scram, None
        if login is not None:
            return login.finish(token, self.host)
        logins = self._listener.scram
        assert logins is not None  # the handshake offers SCRAM only with them
        self._scram = await logins.begin(mechanism, token, self.host)
        return None, self._scram.server_first

    async def _authenticate(self, request: Any, correlation_id: int) -> bytes:
        response = wire.APIS[wire.SASL_AUTHENTICATE].response
        failure, answer = await self._login(bytes(request.auth_bytes))
        if failure is not None:
            self._last_word = asyncio.current_task()  # closed once this answer is written
            body = response(
                version=request.version,
                error_code=wire.SASL_AUTHENTICATION_FAILED,
                error_message=failure,
                auth_bytes=b"",
            )
        else:
            body = response(
                version=request.version,
                error_code=wire.NONE,
                auth_bytes=answer,
                session_lifetime_ms=0,
            )
        return wire.encode_response(body, correlation_id)

    async def _bare_login(self, token: bytes) -> bytes | None:
        """SaslHandshake v0's login: each bare token answered with a size-prefixed one (empty
        for PLAIN), or the connection closed."""
        failure, answer = await self._login(token)
        if failure is not None:
            asyncio.get_running_loop().call_soon(self.close)
            return None
        if self.principal is None:
            self._bare_token = True  # SCRAM's client-final message comes bare too
        return len(answer).to_bytes(_SIZE, "big") + answer
