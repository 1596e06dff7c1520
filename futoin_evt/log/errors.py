"""What a call on the log can fail with, in a few kinds every door maps to its own wire.

A call fails with an exception of :mod:`~futoin_evt.domain`, :mod:`~futoin_evt.storage` or
``log/``; :func:`fault_of` says which :class:`Fault` it is, and each door holds one table from
:class:`Fault` to its own error (FTN3's error names, AMQP's conditions, HTTP's statuses), so a
new rule or a new door needs no new ``except`` clauses. The message of the exception is one
sentence for the caller in every kind but :attr:`Fault.UNAVAILABLE`, whose text is for the
operator's log as much as for the caller.
"""

from __future__ import annotations

import enum
from typing import Final

from ..domain.dcb import AppendConditionFailed, EventIdConflict
from ..domain.principal import NotAuthenticated
from ..domain.stream import BadInput
from ..storage.errors import DamagedEvent, NotWritable, StoreClosed, StoreUnavailable
from .access import Refused
from .consumers import PositionPastHead


class Fault(enum.Enum):
    """The kinds of failure a door tells apart."""

    #: Credentials that are not accepted (or too many tries from one peer).
    UNAUTHENTICATED = "unauthenticated"
    #: A right the acting user lacks; the refusal names only what they may know.
    REFUSED = "refused"
    #: Input no rule allows: a bad event (type, key, size, JSON, its schema), a bad name,
    #: a position past the head.
    BAD_INPUT = "bad-input"
    #: A stream only the server writes (an aggregate, which its copying fills).
    NOT_WRITABLE = "not-writable"
    #: Events stored since the position a DCB append condition names match its query.
    CONDITION_FAILED = "condition-failed"
    #: A DCB event id stored already with other content (or, for a writer who may not read,
    #: stored already).
    ID_CONFLICT = "id-conflict"
    #: The database cannot be reached, or the server is closing: try again later.
    UNAVAILABLE = "unavailable"
    #: A stored event fails its checksum: served to nobody.
    DAMAGED = "damaged"


#: The first class an exception is an instance of gives its kind (a subclass before its base).
_KINDS: Final[tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], Fault], ...]] = (
    (NotAuthenticated, Fault.UNAUTHENTICATED),
    (PositionPastHead, Fault.BAD_INPUT),
    (Refused, Fault.REFUSED),
    (BadInput, Fault.BAD_INPUT),
    (NotWritable, Fault.NOT_WRITABLE),
    (AppendConditionFailed, Fault.CONDITION_FAILED),
    (EventIdConflict, Fault.ID_CONFLICT),
    ((StoreUnavailable, StoreClosed), Fault.UNAVAILABLE),
    (DamagedEvent, Fault.DAMAGED),
)


def fault_of(exc: BaseException) -> Fault | None:
    """The kind of ``exc``; None for anything else (a bug: logged by the door, answered as an
    internal error)."""
    for kinds, fault in _KINDS:
        if isinstance(exc, kinds):
            return fault
    return None
