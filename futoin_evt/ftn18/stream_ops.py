"""``futoinevt.ops``: the streams and their partitions, for ``futoin-evt stream --url``.

``listStreams`` lists the streams the caller holds some right on; ``describeStream`` needs
``read`` on the stream (and shows the caller's own consumers only, unless they may
``manage`` it); adding, growing and dropping need ``manage`` on the name, and adding an
aggregate (``aggregate_of``) ``read`` on its source as well. A caller without
the right is refused (``SecurityError``) whether the stream exists or not. A change is known
to this process at once and to every other serving process within the registry's poll
interval. ``listStreams`` lists what this process serves now (its registry), so a client may
connect to every partition it lists.
"""

from __future__ import annotations

from typing import Any, Final

from ..domain.principal import Principal
from ..ftn3.calls import CallContext
from ..ftn3.errors import SECURITY_ERROR, FTN3Error
from ..log.access import Refused
from ..log.streams import StreamRegistry, stream_summary

UNKNOWN_STREAM: Final = "UnknownStream"
STREAM_EXISTS: Final = "StreamExists"
INVALID_STREAM: Final = "InvalidStream"


class StreamAdmin:
    """The calls of the ops iface on the streams, over the registry this process serves."""

    def __init__(self, registry: StreamRegistry) -> None:
        self._registry = registry

    async def list_streams(self, ctx: CallContext[Principal], params: dict[str, Any]) -> list[Any]:
        infos = sorted(self._registry.visible_to(ctx.principal), key=lambda info: info.name)
        return [stream_summary(info) for info in infos]

    async def describe_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        described = await self._registry.describe(ctx.principal, params["name"])
        if described is None:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {params['name']}")
        return described

    async def add_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        name = params["name"]
        try:
            info = await self._registry.add(
                ctx.principal, name, params["partitions"], aggregate_of=params["aggregate_of"]
            )
        except KeyError:
            raise FTN3Error(STREAM_EXISTS, f"the stream {name} exists already") from None
        except (Refused, ValueError) as exc:
            raise _refusal(exc) from None
        return stream_summary(info)

    async def grow_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        name = params["name"]
        try:
            info = await self._registry.grow(ctx.principal, name, params["partitions"])
        except KeyError:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {name}") from None
        except (Refused, ValueError) as exc:
            raise _refusal(exc) from None
        return stream_summary(info)

    async def drop_stream(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        name = params["name"]
        try:
            dropped = await self._registry.drop(ctx.principal, name)
        except (Refused, ValueError) as exc:
            raise _refusal(exc) from None
        if not dropped:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {name}")
        return True


def _refusal(exc: Refused | ValueError) -> FTN3Error:
    """A refused call is a SecurityError, a bad name or count an InvalidStream."""
    return FTN3Error(SECURITY_ERROR if isinstance(exc, Refused) else INVALID_STREAM, str(exc))
