"""Who acts: the user a call is made for, as every door passes it down to the log."""

from __future__ import annotations

from dataclasses import dataclass

from .stream import UserId


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    user_id: UserId
    name: str
    is_admin: bool


class NotAuthenticated(Exception):
    """Credentials that are not accepted, or a peer that tried too many; the message is one
    sentence that tells nothing of which part was wrong."""
