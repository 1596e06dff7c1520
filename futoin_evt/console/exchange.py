"""A request to the console and its answer, as the server's HTTP endpoint carries them
(``server/console_http.py``), and what a page handler gets and gives."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ..domain.principal import Principal
from .sessions import Session

#: The console as the metrics' door label.
CONSOLE_DOOR: Final = "console"
SECURITY_HEADERS: Final = (
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
)


@dataclass(frozen=True, slots=True)
class ConsoleRequest:
    method: str
    #: The path and query, as sent.
    target: str
    #: Header names in lower case (only those the console reads).
    headers: Mapping[str, str]
    body: bytes
    #: The peer's address (without its port): password checks are limited per address.
    peer: str
    #: TLS, loopback or a trusted channel: passwords may be sent.
    secure_channel: bool
    #: TLS: the session cookie is ``Secure``.
    tls: bool

    def cookie(self, name: str) -> str | None:
        for part in self.headers.get("cookie", "").split(";"):
            key, sep, value = part.strip().partition("=")
            if sep and key == name:
                return value
        return None


@dataclass(slots=True)
class ConsoleResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: A streamed body (Server-Sent Events): chunks as they come.
    stream: AsyncGenerator[bytes, None] | None = None
    #: The user of the request's session, if it had one.
    user: str | None = None


class PageError(Exception):
    """A request answered with an error page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Call:
    """What a page handler gets."""

    request: ConsoleRequest
    path: str
    query: dict[str, str]
    form: dict[str, str]
    session: Session | None
    token: str | None

    @property
    def principal(self) -> Principal:
        assert self.session is not None
        return self.session.principal


Handler = Callable[[Call], Awaitable[ConsoleResponse]]
#: A page group's handlers by method and path (under the console's base).
Routes = dict[tuple[str, str], Handler]


def redirect(location: str, headers: list[tuple[str, str]] | None = None) -> ConsoleResponse:
    return ConsoleResponse(
        303, b"", "text/plain; charset=utf-8", [("Location", location), *(headers or [])]
    )
