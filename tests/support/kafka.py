"""Kafka's own clients against the Kafka door: their settings for a server and user, and a
raw connection that speaks the protocol frame by frame (for what no client sends)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from futoin_evt.server.app import EventServer

from .servers import USERS


def bootstrap(server: EventServer) -> str:
    assert server.kafka is not None
    return f"127.0.0.1:{server.kafka.port}"


def confluent_conf(server: EventServer, user: str = "alice", **more: Any) -> dict[str, Any]:
    """confluent-kafka (librdkafka) settings for ``user``."""
    return {
        "bootstrap.servers": bootstrap(server),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS.get(user, "wrong"),
        **more,
    }


def python_conf(server: EventServer, user: str = "alice", **more: Any) -> dict[str, Any]:
    """kafka-python and aiokafka settings for ``user``."""
    return {
        "bootstrap_servers": bootstrap(server),
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user,
        "sasl_plain_password": USERS.get(user, "wrong"),
        **more,
    }


class RawKafka:
    """A blocking socket that sends request frames and reads answers (run it in a thread)."""

    def __init__(self, server: EventServer) -> None:
        assert server.kafka is not None
        self.sock = socket.create_connection(("127.0.0.1", server.kafka.port), timeout=10)
        self.correlation = 0

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request(self, api_key: int, version: int, body: bytes, client_id: str = "raw") -> None:
        self.correlation += 1
        encoded = client_id.encode()
        header = struct.pack(">hhih", api_key, version, self.correlation, len(encoded)) + encoded
        self.send_frame(header + body)

    def read_frame(self) -> bytes:
        """The next answer's bytes after its size; b"" when the server closed."""
        size = self._read(4)
        if len(size) < 4:
            return b""
        return self._read(struct.unpack(">i", size)[0])

    def _read(self, count: int) -> bytes:
        chunks = b""
        while len(chunks) < count:
            chunk = self.sock.recv(count - len(chunks))
            if not chunk:
                break
            chunks += chunk
        return chunks

    def closed_by_server(self) -> bool:
        """Whether the server closed the connection (reading until it does or answers)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()
