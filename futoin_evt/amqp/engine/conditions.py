"""The error conditions of AMQP 1.0 (part 2.8.15 and the connection, session and link errors
of 2.8.16 to 2.8.18) that this server sends, each named once."""

from __future__ import annotations

from typing import Final

INTERNAL_ERROR: Final = "amqp:internal-error"
NOT_FOUND: Final = "amqp:not-found"
UNAUTHORIZED: Final = "amqp:unauthorized-access"
DECODE_ERROR: Final = "amqp:decode-error"
RESOURCE_LIMIT: Final = "amqp:resource-limit-exceeded"
NOT_ALLOWED: Final = "amqp:not-allowed"
INVALID_FIELD: Final = "amqp:invalid-field"
RESOURCE_LOCKED: Final = "amqp:resource-locked"
PRECONDITION_FAILED: Final = "amqp:precondition-failed"

FORCED: Final = "amqp:connection:forced"
FRAMING_ERROR: Final = "amqp:connection:framing-error"

WINDOW_VIOLATION: Final = "amqp:session:window-violation"
HANDLE_IN_USE: Final = "amqp:session:handle-in-use"
UNATTACHED_HANDLE: Final = "amqp:session:unattached-handle"

DETACH_FORCED: Final = "amqp:link:detach-forced"
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"
LINK_STOLEN: Final = "amqp:link:stolen"
