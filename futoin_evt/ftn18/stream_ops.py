"""``futoinevt.ops``: the streams and their partitions, for ``futoin-evt stream --url``.

Anyone may list and describe streams (a user sees only their own consumers there, as
everywhere); adding, growing and dropping take an admin user. A change is known to this
process at once and to every other serving process within the registry's poll interval.
``listStreams`` lists what this process serves now (its registry), so a client may connect
to every partition it lists.
"""

from __future__ import annotations

from typing import Any, Final

from ..domain.partition import DEFAULT_STREAM, check_partition_count, check_stream_name
from ..domain.principal import Principal
from ..ftn3.calls import CallContext
from ..ftn3.errors import SECURITY_ERROR, FTN3Error
from ..log.streams import StreamRegistry, describe_stream, stream_summary
from ..storage.base import Streams

UNKNOWN_STREAM: Final = "UnknownStream"
STREAM_EXISTS: Final = "StreamExists"
INVALID_STREAM: Final = "InvalidStream"


def _admin_only(ctx: CallContext[Principal]) -> None:
    if not ctx.principal.is_admin:
        raise FTN3Error(SECURITY_ERROR, "only admin users add, grow and drop streams")


def _checked_name(name: str) -> str:
    try:
        return check_stream_name(name)
    except ValueError as exc:
        raise FTN3Error(INVALID_STREAM, str(exc)) from None


class StreamAdmin:
    def __init__(self, store: Streams, registry: StreamRegistry | None = None) -> None:
        """``registry``: the streams this process serves (None: the database's)."""
        self._store = store
        self._registry = registry

    async def list_streams(self, ctx: CallContext[Principal], params: dict[str, Any]) -> list[Any]:
        infos = list(self._registry) if self._registry is not None else await self._store.streams()
        return [stream_summary(info) for info in sorted(infos, key=lambda info: info.name)]

    async def _served(self) -> None:
        """This process serves a change it made at once (others within the poll interval)."""
        if self._registry is not None:
            await self._registry.refresh()

    async def describe_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        info = await self._store.stream(params["name"])
        if info is None:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {params['name']}")
        principal = ctx.principal
        return await describe_stream(
            self._store, info, None if principal.is_admin else principal.user_id
        )

    async def add_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        _admin_only(ctx)
        name = _checked_name(params["name"])
        aggregate_of = params["aggregate_of"]
        if aggregate_of == name:
            raise FTN3Error(INVALID_STREAM, f"the stream {name} cannot aggregate itself")
        try:
            info = await self._store.add_stream(
                name, check_partition_count(params["partitions"]), aggregate_of=aggregate_of
            )
        except KeyError:
            raise FTN3Error(STREAM_EXISTS, f"the stream {name} exists already") from None
        except ValueError as exc:
            raise FTN3Error(INVALID_STREAM, str(exc)) from None
        await self._served()
        return stream_summary(info)

    async def grow_stream(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> dict[str, Any]:
        _admin_only(ctx)
        name = params["name"]
        try:
            info = await self._store.grow_stream(name, params["partitions"])
        except KeyError:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {name}") from None
        except ValueError as exc:
            raise FTN3Error(INVALID_STREAM, str(exc)) from None
        await self._served()
        return stream_summary(info)

    async def drop_stream(self, ctx: CallContext[Principal], params: dict[str, Any]) -> bool:
        _admin_only(ctx)
        name = params["name"]
        if name == DEFAULT_STREAM:
            raise FTN3Error(INVALID_STREAM, f"the stream {DEFAULT_STREAM} cannot be dropped")
        try:
            dropped = await self._store.drop_stream(name)
        except ValueError as exc:
            raise FTN3Error(INVALID_STREAM, str(exc)) from None
        if not dropped:
            raise FTN3Error(UNKNOWN_STREAM, f"no stream {name}")
        await self._served()
        return True
