"""The call contract between an executor and the services it calls: who calls, what a handler
gets and returns, and the way back to a caller on a bidirectional connection.

No I/O: a transport passes its futures (asyncio's) in; they are seen here only as
:class:`Deferred`. The caller's identity is a type parameter, so this core knows that a call
comes from someone, not who.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeAlias, TypeVar

from .messages import Response

T_co = TypeVar("T_co", covariant=True)
#: Who calls (the server's authenticated principal).
P = TypeVar("P")


class Deferred(Protocol[T_co]):
    """A value that arrives later: what the executor and the services use of a future."""

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...

    def result(self) -> T_co: ...

    def exception(self) -> BaseException | None: ...

    def add_done_callback(self, fn: Callable[[Self], object], /) -> None: ...

    def __await__(self) -> Generator[Any, None, T_co]: ...


@dataclass(slots=True)
class Pending:
    """A result that arrives with ``future``; ``then`` turns its value into the result."""

    future: Deferred[Any]
    then: Callable[[Any], Any] | None = None


class PeerLink(Protocol):
    """Requests from us to the peer, over a bidirectional connection (``S`` rids)."""

    @property
    def closed(self) -> Deferred[None]:
        """Done when the connection is gone."""

    @property
    def is_open(self) -> bool:
        """False once the connection is closing."""

    @property
    def writable(self) -> bool:
        """False while the peer is not reading what was already sent."""

    def on_writable(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the peer has caught up again; returns how to stop."""

    def request(
        self, f: str, params_json: str, timeout: float, *, now: bool = False
    ) -> Deferred[Response]:
        """Send a request; the future gets the reply, or TimeoutError/ConnectionError.
        ``now``: written to the socket before this returns, not with the rest of this loop
        turn's output (what was decided on a condition leaves while it holds)."""

    def abort(self) -> None:
        """Drop the connection at once."""

    def close_refused(self, reason: str) -> None:
        """Close the connection for what the peer lost (a right revoked, a stream dropped),
        telling it ``reason`` (one sentence), once the calls in flight have replied."""


@dataclass(slots=True)
class CallContext(Generic[P]):
    """Who calls, what the reply may weigh, and the way back to the caller (if any)."""

    principal: P
    max_response_bytes: int
    link: PeerLink | None = None


#: A handler returns its result, a :class:`Pending` result, or a coroutine.
Handler: TypeAlias = Callable[[CallContext[P], dict[str, Any]], Any]
#: iface name -> wire function name -> handler
Routes: TypeAlias = Mapping[str, Mapping[str, Handler[P]]]
