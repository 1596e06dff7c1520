"""A blocking FTN3 client, for code with no event loop (a Spark driver, scripts).

Same protocol core and the same calls as :class:`futoin_evt.client.aio.EventStreamClient`,
one call at a time. Requests the server sends on its own (pushes) are answered with
``UnknownInterface``: use the asyncio receivers for push delivery.
"""

from __future__ import annotations

import contextlib
import itertools
import ssl
from collections.abc import Sequence
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from ..ftn3.errors import ProtocolViolation
from ..ftn3.messages import (
    decode_frame,
    encode_error,
    encode_request,
    parse_response,
)
from .aio import (
    CLIENT_MAX_FRAME_BYTES,
    GEN,
    OPS,
    POLL,
    CommError,
    Event,
    RemoteError,
    add_event_call,
    normalize_url,
    poll_params,
)


class BlockingClient:
    """``with BlockingClient(url, credentials=...) as client: client.add_event(...)``"""

    def __init__(
        self,
        url: str,
        *,
        credentials: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._credentials = credentials
        self._timeout = timeout
        self._rids = itertools.count(1)
        url = normalize_url(url)
        self._stack = contextlib.ExitStack()
        try:
            self._ws: ClientConnection = self._stack.enter_context(
                connect(
                    url,
                    max_size=CLIENT_MAX_FRAME_BYTES,
                    compression=None,
                    open_timeout=timeout,
                    ssl=ssl_context if url.startswith("wss:") else None,
                )
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise CommError(f"cannot connect to {url}: {exc}") from exc

    def call(self, iface_version: str, func: str, params: dict[str, Any]) -> Any:
        """Call ``iface:ver:func`` and wait for its reply (RemoteError, CommError)."""
        rid = f"C{next(self._rids)}"
        try:
            self._ws.send(encode_request(rid, f"{iface_version}:{func}", params, self._credentials))
            while True:
                msg = decode_frame(self._ws.recv(timeout=self._timeout))
                if msg["rid"][0] == "S":
                    self._ws.send(encode_error(msg["rid"], "UnknownInterface", "Not served"))
                    continue
                if msg["rid"] != rid:
                    continue  # a late reply to an abandoned call
                response = parse_response(msg)
                if response.error is not None:
                    raise RemoteError(response.error, response.error_desc)
                return response.result
        except (ConnectionClosed, TimeoutError) as exc:
            raise CommError(f"no reply: {exc}") from None
        except ProtocolViolation as exc:
            raise CommError(f"the server sent something that is not FTN3: {exc}") from None

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the FTN18 calls ----------------------------------------------------------------------

    def ping(self, echo: int = 1) -> int:
        return int(self.call(GEN, "ping", {"echo": echo})["echo"])

    def add_event(self, event_type: str, data: Any, key: str | None = None) -> int:
        """As :meth:`~futoin_evt.client.aio.EventStreamClient.add_event`."""
        return int(self.call(*add_event_call(event_type, data, key)))

    def register_consumer(self, component: str, *, iface: str = POLL) -> bool:
        return bool(self.call(iface, "registerConsumer", {"component": component}))

    def poll_events(
        self,
        component: str,
        last_id: int | None = None,
        want: Sequence[str] | None = None,
        *,
        iface: str = POLL,
    ) -> list[Event]:
        raw = self.call(iface, "pollEvents", poll_params(component, last_id, want))
        return [Event.from_wire(item) for item in raw]

    # -- futoinevt.ops calls for bulk consumers --------------------------------------------

    def stream_info(
        self, stream: str | None = None, partition: int | None = None
    ) -> dict[str, Any]:
        """The information of the connection's partition, or of the one named (partition 0
        of ``stream``; ``partition`` of the connection's stream)."""
        params: dict[str, Any] = {}
        if stream is not None:
            params["stream"] = stream
        if partition is not None:
            params["partition"] = partition
        return dict(self.call(OPS, "streamInfo", params))

    def consumer_state(self, component: str) -> tuple[int, int]:
        """(position, newest event id): everything up to the position is acknowledged."""
        state = self.call(OPS, "consumerState", {"component": component})
        return int(state["position"]), int(state["head_id"])

    def acknowledge(self, component: str, last_id: int) -> int:
        """Move the consumer forward to ``last_id`` (never back); returns its position."""
        result = self.call(OPS, "acknowledge", {"component": component, "last_id": str(last_id)})
        return int(result) if result else 0

    def read_events(
        self,
        component: str,
        after_id: int,
        upto_id: int | None = None,
        want: Sequence[str] | None = None,
        *,
        data_as_text: bool = False,
    ) -> list[dict[str, Any]]:
        """One reply's worth of events in ``(after_id, upto_id]`` as sent (ids are strings);
        an empty list means the range is exhausted. The position does not move. With
        ``data_as_text``, each event's data is its JSON text, not decoded."""
        params: dict[str, Any] = {"component": component, "after_id": str(after_id)}
        if data_as_text:
            params["data_as_text"] = True
        if upto_id is not None:
            params["upto_id"] = str(upto_id)
        if want is not None:
            params["want"] = list(want)
        return list(self.call(OPS, "readEvents", params))
