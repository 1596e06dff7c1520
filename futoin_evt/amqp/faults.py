"""The AMQP door's one table: the condition each kind of failure of the log is answered with
(:mod:`futoin_evt.log.errors`), its sentence the description."""

from __future__ import annotations

from typing import Final

from ..log.errors import Fault
from .engine.conditions import (
    INTERNAL_ERROR,
    INVALID_FIELD,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    UNAUTHORIZED,
)

AMQP_FAULTS: Final[dict[Fault, str]] = {
    Fault.UNAUTHENTICATED: UNAUTHORIZED,
    Fault.REFUSED: UNAUTHORIZED,
    Fault.BAD_INPUT: INVALID_FIELD,
    Fault.NOT_WRITABLE: NOT_ALLOWED,
    Fault.CONDITION_FAILED: PRECONDITION_FAILED,
    Fault.ID_CONFLICT: PRECONDITION_FAILED,
    Fault.UNAVAILABLE: INTERNAL_ERROR,
    Fault.DAMAGED: INTERNAL_ERROR,
}
