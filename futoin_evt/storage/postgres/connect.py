"""Connections to PostgreSQL: how a connection is made (its link timeouts at both ends),
what a broken one fails with, and the URL as logs may show it."""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import TupleRow

from ..errors import StoreUnavailable, StoreUnreachable

Connection = psycopg.AsyncConnection[TupleRow]

#: Seconds to wait for a connection when opening.
CONNECT_TIMEOUT: Final = 10.0


def safe_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def link_settings(link_timeout: float, options: str = "") -> dict[str, Any]:
    """The connection parameters that make a connection whose packets stop getting through
    (a cut cable, a firewall dropping them, a host paused) fail within about
    ``link_timeout`` seconds, at both ends, instead of the kernel's 15 minutes of
    retransmissions: libpq's keepalives and ``tcp_user_timeout`` here, and the same settings
    for the server's end of the session, with ``idle_in_transaction_session_timeout``, so a
    session whose client stopped inside a transaction gives up its locks (``options``: more
    server settings, as ``-c name=value``)."""
    idle = max(1, round(link_timeout / 2))
    interval = max(1, round(link_timeout / 6))
    count = 3
    ms = max(1, round(link_timeout * 1000))
    server = (
        f"-c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval}"
        f" -c tcp_keepalives_count={count} -c tcp_user_timeout={ms}"
        f" -c idle_in_transaction_session_timeout={ms}"
    )
    return {
        "connect_timeout": max(2, round(min(CONNECT_TIMEOUT, link_timeout))),
        "keepalives": 1,
        "keepalives_idle": idle,
        "keepalives_interval": interval,
        "keepalives_count": count,
        "tcp_user_timeout": ms,
        "options": f"{server} {options}".strip(),
    }


async def connect(
    url: str, *, autocommit: bool, link_timeout: float, options: str = ""
) -> Connection:
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=autocommit, **link_settings(link_timeout, options)
        )
    except (psycopg.Error, ValueError) as exc:
        unavailable = (
            StoreUnreachable if isinstance(exc, psycopg.OperationalError) else StoreUnavailable
        )
        raise unavailable(
            f"cannot connect to the PostgreSQL database {safe_url(url)}: {first_line(exc)}"
        ) from None


#: A connection that broke: the database went away or restarts, the link stopped carrying
#: packets, or the server ended a session it found idle inside a transaction (its client
#: was stopped or cut off longer than the link timeout).
LINK_LOST: Final = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.IdleInTransactionSessionTimeout,
)


def lost(exc: psycopg.Error) -> StoreUnreachable:
    """A connection that failed during a call: the database went away, or is restarting."""
    return StoreUnreachable(f"the database connection failed: {first_line(exc)}")
