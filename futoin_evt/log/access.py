"""Who may do what: the rules every door's calls into ``log/`` meet, in one place.

Every call a door makes into ``log/`` on a user's behalf (appends, reads, the consumer
lifecycle, the streams' administration) takes that user first, as ``who``; the rules about
users are kept here, and a door only maps :class:`Refused` (or the "no such" answer a call
gives) to its wire. Today: a user sees, drops and seeks their own consumers and an admin
anyone's; only admins add, grow and drop streams.
"""

from __future__ import annotations

from ..domain.principal import Principal
from ..domain.stream import UserId


class Refused(Exception):
    """The acting user may not make this call; one sentence for the user."""


def acts_for(who: Principal, owner: UserId | str) -> bool:
    """Whether ``who`` may see, drop and seek the consumers of ``owner`` (a user's id or
    name): their own, or anyone's for an admin."""
    return who.is_admin or owner in (who.user_id, who.name)


def consumers_shown_to(who: Principal) -> UserId | None:
    """Whose consumers a list shows ``who``: None for everyone's (an admin), else their own
    user id."""
    return None if who.is_admin else who.user_id


def check_admin(who: Principal, doing: str) -> None:
    """:class:`Refused` unless ``who`` is an admin; ``doing`` completes "only admin users"."""
    if not who.is_admin:
        raise Refused(f"only admin users {doing}")
