"""Event Hubs connection strings
(``Endpoint=sb://HOST/;SharedAccessKeyName=NAME;SharedAccessKey=KEY[;EntityPath=HUB]``), the
password of the Event Hubs login of Kafka clients (SASL PLAIN as ``$ConnectionString``). No
I/O: :class:`~.sasl_logins.ConnectionStringLogins` checks them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: The SASL PLAIN user name of a login with a connection string.
CONNECTION_STRING_USER: Final = "$ConnectionString"


@dataclass(frozen=True, slots=True)
class ConnectionString:
    """A connection string with a key (one with a ``SharedAccessSignature`` instead is
    refused: a Kafka login has no expiry to keep to)."""

    endpoint: str
    key_name: str
    key: str = field(repr=False)
    entity_path: str | None

    @classmethod
    def parse(cls, text: str) -> ConnectionString:
        """Raises ValueError (saying which part is missing, never the key)."""
        fields: dict[str, str] = {}
        for part in text.split(";"):
            name, equals, value = part.strip().partition("=")
            if equals:
                fields[name.strip().lower()] = value.strip()
        endpoint = fields.get("endpoint", "")
        if not endpoint.startswith("sb://"):
            raise ValueError("the connection string has no Endpoint=sb://...")
        name, key = fields.get("sharedaccesskeyname", ""), fields.get("sharedaccesskey", "")
        if not (name and key):
            raise ValueError("the connection string has no SharedAccessKeyName and SharedAccessKey")
        return cls(endpoint, name, key, fields.get("entitypath") or None)

    @property
    def resource(self) -> str:
        """What the token made from the key is for: the endpoint, and the hub when one is named."""
        base = self.endpoint if self.endpoint.endswith("/") else self.endpoint + "/"
        return base + (self.entity_path or "")
