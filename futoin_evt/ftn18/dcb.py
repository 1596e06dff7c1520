"""The DCB API as FTN3 calls (iface ``futoin.evt.dcb:1.0``): params in, results out.

Input the iface types cannot express (the query and event rules) is checked by the model;
its errors, and the refusals of an append, are answered by the executor's table
(:data:`~futoin_evt.server.executor.FAULTS`): ``InvalidRequest`` naming the field,
``AppendConditionFailed``, ``EventIdConflict``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..dcb.model import parse_condition, parse_events, parse_query
from ..dcb.service import DcbService, DcbStreamRefused, ReadRequest, stream_dcb_log
from ..domain.partition import Partition, StreamInfo
from ..domain.principal import Principal
from ..ftn3.calls import CallContext, Pending
from ..ftn3.errors import INVALID_REQUEST, FTN3Error
from ..ftn3.messages import EncodedJson
from ..log.eventlog import EventLog
from .services import REPLY_ENVELOPE_BYTES

#: Room for the reply's ``head`` and ``next`` around the events.
_RESULT_ENVELOPE_BYTES: Final = 128


class DcbCalls:
    def __init__(self, service: DcbService) -> None:
        self._service = service

    @classmethod
    def of_stream(
        cls,
        name: str,
        stream: Callable[[str], StreamInfo | None],
        log_of: Callable[[Partition], EventLog],
    ) -> DcbCalls:
        """The calls on the stream ``name`` (see :func:`~futoin_evt.dcb.service.stream_dcb_log`);
        a stream DCB cannot serve is an ``InvalidRequest`` that says why."""
        try:
            return cls(DcbService(stream_dcb_log(name, stream, log_of)))
        except DcbStreamRefused as exc:
            raise FTN3Error(INVALID_REQUEST, exc.message) from None

    def append(self, ctx: CallContext[Principal], params: dict[str, Any]) -> Pending:
        """Answered from the commit's future (no task per call)."""
        events = parse_events(params["events"])
        condition = parse_condition(params["condition"])
        return Pending(self._service.append(ctx.principal, events, condition))

    async def read(self, ctx: CallContext[Principal], params: dict[str, Any]) -> EncodedJson:
        return await self._read(ctx, params, params["after"], False)

    async def read_backwards(
        self, ctx: CallContext[Principal], params: dict[str, Any]
    ) -> EncodedJson:
        return await self._read(ctx, params, params["before"], True)

    async def _read(
        self,
        ctx: CallContext[Principal],
        params: dict[str, Any],
        position: int | None,
        backwards: bool,
    ) -> EncodedJson:
        request = ReadRequest(
            query=parse_query(params["query"]),
            after=position,
            limit=params["limit"],
            backwards=backwards,
        )
        read = await self._service.read(ctx.principal, request)
        budget = ctx.max_response_bytes - REPLY_ENVELOPE_BYTES - _RESULT_ENVELOPE_BYTES
        parts: list[str] = []
        size = 0
        last_position = 0
        next_position: int | None = None
        async for page in read.pages():
            for event in page:
                text = event.to_json()
                size += len(text.encode()) + 1
                if parts and size > budget:
                    next_position = last_position  # more than fits: go on from here
                    break
                parts.append(text)
                last_position = event.position
            if next_position is not None:
                break
        more = f',"next":{next_position}' if next_position is not None else ""
        return EncodedJson(f'{{"events":[{",".join(parts)}],"head":{read.head}{more}}}')
