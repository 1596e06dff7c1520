"""FTN3 errors.

Exception tree::

    FTN3Error               an error that goes to the peer under an FTN3 error name
    ProtocolViolation       the peer broke the message framing; the connection is closed
      RefusedMessage        valid JSON with a rid, but content no FTN3 peer may send;
                            a request is answered with an error, the connection stays

``FTN3Error.name`` is the wire name (``e``) and ``FTN3Error.desc`` the text (``edesc``).
"""

from __future__ import annotations

from typing import Final

UNKNOWN_INTERFACE: Final = "UnknownInterface"
NOT_IMPLEMENTED: Final = "NotImplemented"
NOT_SUPPORTED_VERSION: Final = "NotSupportedVersion"
UNAUTHORIZED: Final = "Unauthorized"
INTERNAL_ERROR: Final = "InternalError"
INVALID_REQUEST: Final = "InvalidRequest"
DEFENSE_REJECTED: Final = "DefenseRejected"
PLEASE_REAUTH: Final = "PleaseReauth"
SECURITY_ERROR: Final = "SecurityError"

#: Errors any function may raise without listing them in ``throws``.
STANDARD_ERRORS: Final = frozenset(
    {
        UNKNOWN_INTERFACE,
        NOT_IMPLEMENTED,
        NOT_SUPPORTED_VERSION,
        UNAUTHORIZED,
        INTERNAL_ERROR,
        INVALID_REQUEST,
        DEFENSE_REJECTED,
        PLEASE_REAUTH,
        SECURITY_ERROR,
    }
)


class FTN3Error(Exception):
    """An error reported to the peer as ``{"e": name, "edesc": desc}``."""

    def __init__(self, name: str, desc: str = "") -> None:
        super().__init__(f"{name}: {desc}" if desc else name)
        self.name = name
        self.desc = desc


class ProtocolViolation(Exception):
    """The peer sent something that is not an FTN3 message at all (no ``rid`` to answer)."""


class RefusedMessage(ProtocolViolation):
    """A message with a readable ``rid`` whose content is refused as a whole (an integer too
    long to keep, a lone surrogate): a request gets the FTN3 error ``name``."""

    def __init__(self, rid: str, name: str, desc: str) -> None:
        super().__init__(f"{name}: {desc}")
        self.rid = rid
        self.name = name
        self.desc = desc
