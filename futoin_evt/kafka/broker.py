"""The Kafka APIs over the log: each request of a logged-in user answered from the streams,
their partitions and rights (no sockets here: :mod:`.connection` frames and orders them).

A topic is a stream and a Kafka partition the stream's partition; a record's offset is its
event's id, so the high watermark is the newest id plus one and the log start offset the
oldest id kept. A Metadata request never creates a topic. Rights: Metadata lists the topics
the user may read or write; Produce needs write, Fetch, ListOffsets and the group's offsets
read, CreateTopics, DeleteTopics and CreatePartitions manage. A name the user holds no right
on answers TOPIC_AUTHORIZATION_FAILED whether a stream has it or not (names cannot be probed).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from ..domain.partition import StreamInfo
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import EventDraft, EventRejected, StoredEvent, utc_timestamp
from ..log.eventlog import EventLog
from ..log.kafka import KafkaShared
from ..log.streams import StreamLogs, StreamRegistry
from . import wire
from .admin_calls import AdminCalls
from .brokers import Brokers
from .config import KafkaConfig
from .faults import kafka_error
from .group_calls import GroupCalls
from .mapping import event_records, record_event
from .producers import ProducerStates, Sequenced
from .records import CorruptBatch, UnsupportedMagic, decode_batches, encode_batch
from .shared_groups import Coordinator
from .topics import Topics

logger = logging.getLogger(__name__)

EARLIEST: Final = -2
LATEST: Final = -1
#: Events read per partition and Fetch at most (a page of the store).
MAX_EVENTS_PER_FETCH: Final = 2000
#: An event's record is about this much larger than its data (headers, varints).
RECORD_OVERHEAD: Final = 64

Handler = Callable[[Principal, Any], Awaitable[Any]]
#: The event type of a stream (by name) whose newest schema has an id.
SchemaTypeOf = Callable[[str, int], str | None]


class Broker:
    """Answers the requests of logged-in users (``who``) in kafka-python's message types:
    :attr:`handlers` by API key."""

    def __init__(
        self,
        logs: StreamLogs,
        streams: StreamRegistry,
        groups: Coordinator,
        config: KafkaConfig,
        address: Callable[[], tuple[str, int]],
        schemas: SchemaTypeOf | None = None,
        shared: KafkaShared | None = None,
    ) -> None:
        """``address``: the (host, port) clients are told to connect to; ``schemas``: the
        event type of a stream's newest schema by its id (values in Confluent's wire format
        name one); ``shared``: what the processes on the database share (producer ids and
        sequence numbers)."""
        self._schemas = schemas
        brokers = Brokers(address, shared, keep_row=config.group is not None)
        self._topics = topics = Topics(logs, streams, address, brokers)
        self._config = config
        self._producers = ProducerStates(shared)
        self._groups = GroupCalls(topics, groups)
        self.handlers: dict[int, Handler] = {
            wire.METADATA: self.metadata,
            wire.PRODUCE: self.produce,
            wire.FETCH: self.fetch,
            wire.LIST_OFFSETS: self.list_offsets,
            wire.INIT_PRODUCER_ID: self.init_producer_id,
            **self._groups.handlers,
            **AdminCalls(topics).handlers,
        }

    async def start(self) -> None:
        """Once listening: register as a broker on the shared database."""
        await self._topics.brokers.start()

    async def close(self) -> None:
        await self._groups.close()
        await self._topics.brokers.close()

    async def metadata(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.METADATA].response
        brokers = self._topics.brokers
        live = brokers.live()
        if request.topics is None:
            infos: list[tuple[str, int, StreamInfo | None]] = [
                (info.name, wire.NONE, info)
                for info in self._topics.streams
                if self._topics.may_see(who, info.name)
            ]
        else:
            infos = []
            for topic in request.topics:
                name = topic.name
                if not self._topics.may_see(who, name):
                    infos.append((name, wire.TOPIC_AUTHORIZATION_FAILED, None))
                    continue
                info = self._topics.streams.get(name)
                code = wire.NONE if info is not None else wire.UNKNOWN_TOPIC_OR_PARTITION
                infos.append((name, code, info))
        topics = [
            response.MetadataResponseTopic(
                error_code=code,
                name=name,
                is_internal=False,
                partitions=[]
                if info is None
                else [
                    response.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=wire.NONE,
                        partition_index=number,
                        leader_id=(leader := brokers.leader(name, number)),
                        leader_epoch=0,
                        replica_nodes=[leader],
                        isr_nodes=[leader],
                        offline_replicas=[],
                    )
                    for number in range(len(info.partitions))
                ],
            )
            for name, code, info in infos
        ]
        return response(
            version=request.version,
            brokers=[
                response.MetadataResponseBroker(node_id=node, host=host, port=port)
                for node, host, port in live
            ],
            cluster_id=self._topics.cluster_id,
            controller_id=live[0][0],
            topics=topics,
        )

    # -- produce ----------------------------------------------------------------------------

    async def produce(self, who: Principal, request: Any) -> Any:
        """Each partition's batches appended in one call; answered once durable (acks 1 and
        all: the server's durability; acks 0: the connection sends no answer)."""
        response = wire.APIS[wire.PRODUCE].response
        topic_type = response.TopicProduceResponse
        partition_type = topic_type.PartitionProduceResponse
        if request.transactional_id is not None:
            code = wire.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            return self._produce_refused(request, code, "transactions are not served")
        if request.acks not in (0, 1, -1):
            return self._produce_refused(request, wire.INVALID_REQUIRED_ACKS, None)
        waits: list[tuple[int, int, Awaitable[tuple[int, int, str | None]]]] = []
        for topic_at, topic in enumerate(request.topic_data):
            code, info = self._topics.topic(who, topic.name, Right.WRITE)
            for part in topic.partition_data:
                if info is None:
                    waits.append((topic_at, part.index, _settled((code, -1, None))))
                    continue
                log = self._topics.log(info, part.index)
                if log is None:
                    answer = (wire.UNKNOWN_TOPIC_OR_PARTITION, -1, None)
                    waits.append((topic_at, part.index, _settled(answer)))
                    continue
                waits.append((topic_at, part.index, self._append(who, log, part.records)))
        answers = await asyncio.gather(*(wait for _, _, wait in waits))
        now_ms = -1
        by_topic: dict[int, list[Any]] = {}
        for (topic_at, index, _), (code, base, message) in zip(waits, answers, strict=True):
            by_topic.setdefault(topic_at, []).append(
                partition_type(
                    index=index,
                    error_code=code,
                    base_offset=base,
                    log_append_time_ms=now_ms,
                    log_start_offset=-1,
                    error_message=message,
                )
            )
        return response(
            version=request.version,
            responses=[
                topic_type(name=topic.name, partition_responses=by_topic.get(at, []))
                for at, topic in enumerate(request.topic_data)
            ],
        )

    def _produce_refused(self, request: Any, code: int, message: str | None) -> Any:
        response = wire.APIS[wire.PRODUCE].response
        topic_type = response.TopicProduceResponse
        return response(
            version=request.version,
            responses=[
                topic_type(
                    name=topic.name,
                    partition_responses=[
                        topic_type.PartitionProduceResponse(
                            index=part.index, error_code=code, base_offset=-1, error_message=message
                        )
                        for part in topic.partition_data
                    ],
                )
                for topic in request.topic_data
            ],
        )

    def _append(
        self, who: Principal, log: EventLog, records: bytes | None
    ) -> Awaitable[tuple[int, int, str | None]]:
        """Queue the partition's batches (in the order requests came: nothing is awaited
        before the append is queued); the answer is (error, base offset, message)."""
        if not records:
            return _settled((wire.CORRUPT_MESSAGE, -1, "no record batch"))
        limits = self._config.limits
        schema_types = None
        if self._schemas is not None:
            schema_types = functools.partial(self._schemas, log.partition.stream)
        try:
            batches = decode_batches(
                records, max_records=limits.max_records, max_bytes=limits.max_batch_bytes
            )
        except UnsupportedMagic as exc:
            return _settled((wire.UNSUPPORTED_FOR_MESSAGE_FORMAT, -1, str(exc)))
        except CorruptBatch as exc:
            return _settled((wire.CORRUPT_MESSAGE, -1, str(exc)))
        drafts: list[EventDraft] = []
        keys: list[object] = []
        for batch in batches:
            if batch.is_transactional or batch.is_control:
                return _settled((wire.INVALID_TXN_STATE, -1, "transactions are not served"))
            for record in batch.records:
                try:
                    draft, key = record_event(record, schema_types)
                except EventRejected as exc:
                    return _settled((wire.INVALID_RECORD, -1, str(exc)))
                drafts.append(draft)
                keys.append(key)
        if not drafts:
            return _settled((wire.CORRUPT_MESSAGE, -1, "a batch without records"))
        given_keys = keys if any(key is not None for key in keys) else None

        def append(sequenced: Sequenced) -> Awaitable[tuple[int, int, str | None]]:
            if sequenced.answer is not None:
                return sequenced.answer
            try:
                appended = log.append(who, drafts, keys=given_keys)
            except Exception as exc:
                sequenced.failed()
                code = kafka_error(exc)
                if code is None:
                    raise
                return _settled((code, -1, str(exc)))
            return _appended(appended, len(drafts), sequenced)

        return self._producers.sequence(log.partition.key, batches, len(drafts), append)

    async def init_producer_id(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.INIT_PRODUCER_ID].response
        if request.transactional_id is not None:
            return response(
                version=request.version,
                error_code=wire.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            producer_id = await self._producers.new_producer_id()
        except Exception as exc:
            logger.warning("no Kafka producer id could be given: %s", exc)
            return response(
                version=request.version,
                error_code=wire.COORDINATOR_NOT_AVAILABLE,
                producer_id=-1,
                producer_epoch=-1,
            )
        return response(
            version=request.version, error_code=wire.NONE, producer_id=producer_id, producer_epoch=0
        )

    # -- fetch ------------------------------------------------------------------------------

    async def fetch(self, who: Principal, request: Any) -> Any:
        """The records after each partition's offset, waiting up to the request's
        ``max_wait_ms`` for its ``min_bytes`` when there are none yet."""
        limit = min(request.max_bytes, self._config.limits.max_fetch_bytes)
        wanted: list[tuple[str, int, int, int, int, EventLog | None]] = []
        for topic in request.topics:
            code, info = self._topics.topic(who, topic.topic, Right.READ)
            for part in topic.partitions:
                log = None if info is None else self._topics.log(info, part.partition)
                if info is not None and log is None:
                    code = wire.UNKNOWN_TOPIC_OR_PARTITION
                wanted.append(
                    (topic.topic, part.partition, code, part.fetch_offset,
                     part.partition_max_bytes, log)
                )  # fmt: skip
        answers = await self._fetch_once(who, wanted, limit)
        if sum(len(records) for _, _, records in answers) < max(request.min_bytes, 1) and (
            request.max_wait_ms > 0
        ):
            logs = [log for *_, log in wanted if log is not None]
            heads = [log.head for log in logs]
            if logs and all(answer[0] == wire.NONE for answer in answers):
                waits = [
                    asyncio.ensure_future(log.wait_beyond(head))
                    for log, head in zip(logs, heads, strict=True)
                ]
                try:
                    await asyncio.wait(
                        waits,
                        timeout=request.max_wait_ms / 1000,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for waiting in waits:
                        waiting.cancel()
                if any(waiting.done() and not waiting.cancelled() for waiting in waits):
                    answers = await self._fetch_once(who, wanted, limit)
        response = wire.APIS[wire.FETCH].response
        topic_type = response.FetchableTopicResponse
        by_topic: dict[str, list[Any]] = {}
        for (name, number, *_), (code, high, records) in zip(wanted, answers, strict=True):
            by_topic.setdefault(name, []).append(
                topic_type.PartitionData(
                    partition_index=number,
                    error_code=code,
                    high_watermark=high,
                    last_stable_offset=high,
                    log_start_offset=-1,
                    aborted_transactions=[],
                    preferred_read_replica=-1,
                    records=records,
                )
            )
        return response(
            version=request.version,
            error_code=wire.NONE,
            session_id=0,
            responses=[
                topic_type(topic=name, partitions=parts) for name, parts in by_topic.items()
            ],
        )

    async def _fetch_once(
        self,
        who: Principal,
        wanted: Sequence[tuple[str, int, int, int, int, EventLog | None]],
        limit: int,
    ) -> list[tuple[int, int, bytes]]:
        """(error, high watermark, records) of each partition, within ``limit`` bytes in all
        (the first partition with records gets at least one batch, as Kafka does)."""
        answers: list[tuple[int, int, bytes]] = []
        left = limit
        for _name, _number, code, offset, partition_max, log in wanted:
            if log is None:
                answers.append((code, -1, b""))
                continue
            head = log.head
            if offset > head:
                # nothing this process knows of: what another process added may not have
                # reached it yet (its notice lost, or this log made after it came)
                await log.catch_up()
                head = log.head
            if offset > head + 1 or offset < 0:
                answers.append((wire.OFFSET_OUT_OF_RANGE, head + 1, b""))
                continue
            room = min(partition_max, left)
            if room <= 0 or offset > head:
                answers.append((wire.NONE, head + 1, b""))
                continue
            count = max(1, min(MAX_EVENTS_PER_FETCH, room // RECORD_OVERHEAD))
            try:
                events = await log.read_after(who, offset - 1, count)
            except Exception as exc:
                failed = kafka_error(exc)
                if failed is None:
                    raise
                answers.append((failed, -1, b""))
                continue
            records = _encode_within(events, room, first=left == limit)
            left -= len(records)
            high = max(head, events[-1].id if events else 0) + 1
            answers.append((wire.NONE, high, records))
        return answers

    async def list_offsets(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.LIST_OFFSETS].response
        topic_type = response.ListOffsetsTopicResponse
        topics = []
        for topic in request.topics:
            code, info = self._topics.topic(who, topic.name, Right.READ)
            parts = []
            for part in topic.partitions:
                log = None if info is None else self._topics.log(info, part.partition_index)
                found = (code if info is None else wire.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
                if log is not None:
                    found = await self._offset_at(who, log, part.timestamp)
                error, offset, timestamp = found
                parts.append(
                    topic_type.ListOffsetsPartitionResponse(
                        partition_index=part.partition_index,
                        error_code=error,
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=0,
                    )
                )
            topics.append(topic_type(name=topic.name, partitions=parts))
        return response(version=request.version, topics=topics)

    async def _offset_at(
        self, who: Principal, log: EventLog, timestamp: int
    ) -> tuple[int, int, int]:
        """(error, offset, timestamp) of ListOffsets: the high watermark for LATEST, the log
        start for EARLIEST, else the first event stored at or after ``timestamp``."""
        try:
            bounds = await log.bounds(who)
        except Exception as exc:
            code = kafka_error(exc)
            if code is None:
                raise
            return code, -1, -1
        high = (bounds.last_id or await log.last_given_id(who)) + 1
        if timestamp == LATEST:
            return wire.NONE, high, -1
        if timestamp == EARLIEST:
            return wire.NONE, bounds.first_id if bounds.first_id is not None else high, -1
        if timestamp < 0:
            return wire.INVALID_REQUEST, -1, -1
        second = -(-timestamp // 1000)
        before = await log.id_before(who, utc_timestamp(second))
        if before is None:
            if bounds.first_id is None:
                return wire.NONE, -1, -1
            before = bounds.first_id - 1
        found = await log.read_after(who, before, 1)
        if not found:
            return wire.NONE, -1, -1
        return wire.NONE, found[0].id, found[0].timestamp_ms


def _encode_within(events: Sequence[StoredEvent], room: int, *, first: bool) -> bytes:
    """The events' record batches, as many whole batches as fit ``room`` bytes (the first
    one whatever its size when ``first``: a consumer must be able to make progress)."""
    out = bytearray()
    for base, timestamp_ms, records in event_records(events):
        batch = encode_batch(base, records, timestamp_ms=timestamp_ms)
        if out and len(out) + len(batch) > room:
            break
        if not out and len(batch) > room and not first:
            break
        out += batch
    return bytes(out)


async def _settled(value: tuple[int, int, str | None]) -> tuple[int, int, str | None]:
    return value


async def _appended(
    appended: Awaitable[int], count: int, sequenced: Sequenced
) -> tuple[int, int, str | None]:
    try:
        last_id = await appended
    except Exception as exc:
        sequenced.failed()
        code = kafka_error(exc)
        if code is None:
            raise
        logger.warning("a Kafka produce was not stored: %s", exc)
        return code, -1, str(exc)
    base = last_id - count + 1
    await sequenced.stored(base)
    return wire.NONE, base, None
