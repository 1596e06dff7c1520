"""Rights on streams: what a user may do with a stream, granted by name, by prefix or for all.

A grant is (user, rights, pattern). The rights are ``read`` (every way of reading a stream and
its description), ``write`` (appending) and ``manage`` (growing and dropping the stream,
seeing and moving other users' consumers on it, its schemas). A pattern is a stream name, a
prefix ending in ``*`` (``orders*``) or ``*`` alone. Admins hold every right on every stream.

:class:`Rights` answers "may this user do that on this stream" in one dictionary lookup
after the first question about a stream, so that a check costs well under a microsecond on a
hot path; it is rebuilt, never changed, when grants change.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from ..quoting import quote_input
from .partition import STREAM_NAME_RE


class Right(enum.IntFlag):
    """One right, or a set of them (``Right.READ | Right.WRITE``)."""

    NONE = 0
    READ = 1
    WRITE = 2
    MANAGE = 4


ALL_RIGHTS: Final = Right.READ | Right.WRITE | Right.MANAGE
#: The names of the rights as commands and the wire spell them, in this order.
RIGHT_NAMES: Final = {"read": Right.READ, "write": Right.WRITE, "manage": Right.MANAGE}
#: Every stream.
ANY_STREAM: Final = "*"
#: A prefix pattern: a stream name's beginning (it may be empty only in ``*`` itself).
_PREFIX_RE: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,46}\*")


class BadGrant(ValueError):
    """A list of rights or a pattern that cannot be granted (its message is one sentence)."""


def parse_rights(text: str) -> Right:
    """``read,write`` as rights; raises :class:`BadGrant` for an empty list or a name that is
    not a right."""
    return parse_names(text, RIGHT_NAMES, "right")


def rights_text(rights: Right) -> str:
    """Rights as the comma list :func:`parse_rights` reads (``""`` for none)."""
    return names_text(rights, RIGHT_NAMES)


def parse_names(text: str, names: Mapping[str, Right], kind: str) -> Right:
    """A comma list of ``names`` (rights, or claims that stand for them) as rights; raises
    :class:`BadGrant` for an empty list or a name not in ``names``."""
    listed = [name.strip() for name in text.split(",")] if isinstance(text, str) else []
    known = list(names)
    if not [name for name in listed if name]:
        raise BadGrant(f"no {kind}s given: name one or more of {', '.join(known)}")
    rights = Right.NONE
    for name in listed:
        right = names.get(name)
        if right is None:
            choices = f"{', '.join(known[:-1])} or {known[-1]}"
            raise BadGrant(f"unknown {kind} {quote_input(name, 20)}: use {choices}")
        rights |= right
    return rights


def names_text(rights: Right, names: Mapping[str, Right]) -> str:
    """Rights as a comma list of ``names`` (``""`` for none)."""
    return ",".join(name for name, right in names.items() if rights & right)


def check_pattern(pattern: str) -> str:
    """The pattern when it is one (a stream name, a prefix ending in ``*``, or ``*``);
    raises :class:`BadGrant` otherwise."""
    if isinstance(pattern, str) and (
        pattern == ANY_STREAM
        or STREAM_NAME_RE.fullmatch(pattern) is not None
        or _PREFIX_RE.fullmatch(pattern) is not None
    ):
        return pattern
    raise BadGrant(
        f"bad stream pattern {quote_input(pattern, 60)}: give a stream name,"
        " a prefix ending in * (orders*), or *"
    )


def matches(pattern: str, stream: str) -> bool:
    """Whether ``pattern`` covers the stream named ``stream``."""
    if pattern.endswith(ANY_STREAM):
        return stream.startswith(pattern[:-1])
    return pattern == stream


@dataclass(frozen=True, slots=True)
class Grant:
    """Rights on the streams a pattern covers."""

    pattern: str
    rights: Right

    def __str__(self) -> str:
        return f"{rights_text(self.rights)} on {self.pattern}"


class Rights:
    """What one user may do, from their grants (or everything, for an admin). The answers
    for each stream asked about are kept: the grants never change under an instance."""

    __slots__ = ("_by_stream", "grants", "is_admin")

    def __init__(self, grants: Iterable[Grant] = (), *, is_admin: bool = False) -> None:
        self.grants: tuple[Grant, ...] = tuple(grants)
        self.is_admin = is_admin
        #: Stream -> the mask held on it, as a plain int (IntFlag arithmetic costs a
        #: microsecond; this is on every call's path).
        self._by_stream: dict[str, int] = {}

    def mask(self, stream: str) -> int:
        """The rights held on ``stream`` as an int mask (the fast path of the checks)."""
        held = self._by_stream.get(stream)
        if held is None:
            held = 0
            if self.is_admin:
                held = int(ALL_RIGHTS)
            else:
                for grant in self.grants:
                    if matches(grant.pattern, stream):
                        held |= int(grant.rights)
            if len(self._by_stream) < _MAX_REMEMBERED:
                self._by_stream[stream] = held
        return held

    def on(self, stream: str) -> Right:
        """The rights held on ``stream``."""
        return Right(self.mask(stream))

    def allows(self, right: Right | int, stream: str) -> bool:
        """Whether every right in ``right`` is held on ``stream``."""
        wanted = int(right)
        return self.mask(stream) & wanted == wanted

    def any_on(self, stream: str) -> bool:
        """Whether some right is held on ``stream`` (then its existence may be told)."""
        return bool(self.mask(stream))


#: Streams answered per :class:`Rights` (names a peer makes up are not remembered past it).
_MAX_REMEMBERED: Final = 4096

#: Rights of a caller with none (a user with no grants).
NO_RIGHTS: Final = Rights()
#: Rights of an admin.
ADMIN_RIGHTS: Final = Rights(is_admin=True)
