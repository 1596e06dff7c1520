"""SASL PLAIN (RFC 4616), as the AMQP and Kafka doors take it. No I/O."""

from __future__ import annotations


def parse_plain(response: bytes) -> tuple[str, str] | None:
    """``authzid NUL authcid NUL passwd`` (RFC 4616) as (user, password); None if malformed.

    An authorization identity other than the user's own is not supported.
    """
    parts = response.split(b"\0")
    if len(parts) != 3:
        return None
    try:
        authzid, user, password = (part.decode() for part in parts)
    except UnicodeDecodeError:
        return None
    if not user or (authzid and authzid != user):
        return None
    return user, password
