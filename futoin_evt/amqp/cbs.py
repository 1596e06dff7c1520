"""``$cbs``: claims-based security, as Event Hubs clients log in.

Such a client opens the connection with SASL ANONYMOUS and puts a SAS token to ``$cbs``
(``operation: put-token``, ``type: servicebus.windows.net:sastoken``, ``name``: the audience,
body: the token). A token that :class:`~futoin_evt.auth.sas.SasVerifier` accepts makes the
connection act as the user it names, under the token's resource (``sr``) only, until the token
expires. Each token a connection puts adds its scope (the SDKs put one per audience); a token
for another host than the connection reached is refused. The client puts a fresh token before
one expires, or the links only it covered are detached with ``amqp:unauthorized-access``, and
the connection is closed so once none is left.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from ..auth.sas import InvalidToken, SasVerifier
from ..quoting import quote_input
from .engine.message import Message
from .management import RequestReplyNode
from .table import ConnectionView as Connection

logger = logging.getLogger(__name__)

CBS: Final = "$cbs"
PUT_TOKEN: Final = "put-token"
SAS_TOKEN_TYPE: Final = "servicebus.windows.net:sastoken"


class CbsNode(RequestReplyNode):
    """Checks tokens and tells the connection who it acts as."""

    def __init__(self, verifier: SasVerifier | None) -> None:
        super().__init__()
        self._verifier = verifier

    async def answer(self, conn: Connection, request: Message) -> tuple[int, str, Any]:
        properties: dict[str, Any] = dict(request.properties or {})
        if properties.get("operation") != PUT_TOKEN:
            return 400, f"unsupported operation: {quote_input(properties.get('operation'))}", None
        if properties.get("type") != SAS_TOKEN_TYPE:
            return 400, f"only {SAS_TOKEN_TYPE} tokens are accepted", None
        audience = properties.get("name")
        if not isinstance(audience, str):
            return 400, "put-token needs the audience as the name property", None
        if self._verifier is None:
            return 401, "this server has no SAS secret: log in with SASL PLAIN", None
        try:
            claims = await self._verifier.verify(request.body, audience)
        except InvalidToken as exc:
            logger.warning("AMQP token refused from %s: %s", conn.peer_name, exc.detail)
            return 401, str(exc), None
        refusal = conn.grant_claims(claims)
        if refusal is not None:
            return *refusal, None
        return 200, "OK", None
