"""The Kafka door's one table: the error code each kind of failure of the log is answered
with (:mod:`futoin_evt.log.errors`), its sentence the error message where the answer has one."""

from __future__ import annotations

from typing import Final

from ..log.errors import Fault, fault_of
from . import wire

KAFKA_FAULTS: Final[dict[Fault, int]] = {
    Fault.UNAUTHENTICATED: wire.SASL_AUTHENTICATION_FAILED,
    Fault.REFUSED: wire.TOPIC_AUTHORIZATION_FAILED,
    Fault.BAD_INPUT: wire.INVALID_RECORD,
    # an aggregate: only the server writes it
    Fault.NOT_WRITABLE: wire.INVALID_TOPIC_EXCEPTION,
    Fault.CONDITION_FAILED: wire.INVALID_RECORD,
    Fault.ID_CONFLICT: wire.INVALID_RECORD,
    # retriable, as clients take a broker's storage error to be
    Fault.UNAVAILABLE: wire.KAFKA_STORAGE_ERROR,
    Fault.DAMAGED: wire.KAFKA_STORAGE_ERROR,
}


def kafka_error(exc: BaseException) -> int | None:
    """The error code of a failure of the log; None for anything else (a bug: the caller
    lets it go up, and the connection logs it and closes)."""
    fault = fault_of(exc)
    return None if fault is None else KAFKA_FAULTS[fault]
