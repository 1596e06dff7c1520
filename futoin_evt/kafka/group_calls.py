"""The Kafka group calls: the coordinator's, and the groups' offsets, which are the positions
of a registered consumer ``kafka:GROUP`` on each partition a group commits (so they are shown,
counted in the lag and hold back discarding as every consumer's position does)."""

from __future__ import annotations

from typing import Any, Final

from ..domain.principal import Principal
from ..domain.rights import Right
from ..log.access import Refused
from ..log.consumers import PositionPastHead
from ..log.eventlog import EventLog
from . import wire
from .shared_groups import Coordinator
from .topics import Topics

#: What a consumer group's position is registered as, on each partition it commits.
GROUP_CONSUMER_PREFIX: Final = "kafka:"


class GroupCalls:
    def __init__(self, topics: Topics, groups: Coordinator) -> None:
        self._topics = topics
        self._groups = groups
        self.handlers = {
            wire.FIND_COORDINATOR: self.find_coordinator,
            wire.JOIN_GROUP: self.join_group,
            wire.SYNC_GROUP: self.sync_group,
            wire.HEARTBEAT: self.heartbeat,
            wire.LEAVE_GROUP: self.leave_group,
            wire.DESCRIBE_GROUPS: self.describe_groups,
            wire.LIST_GROUPS: self.list_groups,
            wire.OFFSET_COMMIT: self.offset_commit,
            wire.OFFSET_FETCH: self.offset_fetch,
        }

    async def find_coordinator(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.FIND_COORDINATOR].response
        host, port = self._topics.address()
        return response(
            version=request.version,
            error_code=wire.NONE,
            node_id=self._topics.brokers.node_id,
            host=host,
            port=port,
        )

    async def join_group(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.JOIN_GROUP].response
        version = request.version
        rebalance_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        result = await self._groups.join(
            request.group_id,
            request.member_id,
            request.group_instance_id if version >= 5 else None,
            self._client_of(who),
            "",
            request.session_timeout_ms,
            rebalance_ms,
            request.protocol_type,
            [(protocol.name, bytes(protocol.metadata)) for protocol in request.protocols],
            require_known_member_id=version >= 4,
        )
        return response(
            version=version,
            error_code=result.error,
            generation_id=result.generation,
            protocol_name=result.protocol or "",
            leader=result.leader,
            member_id=result.member_id,
            members=[
                response.JoinGroupResponseMember(
                    member_id=member_id, group_instance_id=instance_id, metadata=metadata
                )
                for member_id, instance_id, metadata in result.members
            ],
        )

    @staticmethod
    def _client_of(who: Principal) -> str:
        return who.name

    async def sync_group(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.SYNC_GROUP].response
        error, assignment = await self._groups.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id if request.version >= 3 else None,
            {item.member_id: bytes(item.assignment) for item in request.assignments},
        )
        return response(version=request.version, error_code=error, assignment=assignment)

    async def heartbeat(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.HEARTBEAT].response
        error = await self._groups.heartbeat(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id if request.version >= 3 else None,
        )
        return response(version=request.version, error_code=error)

    async def leave_group(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.LEAVE_GROUP].response
        if request.version >= 3:
            members = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            members = [(request.member_id, None)]
        error, errors = await self._groups.leave(request.group_id, members)
        if request.version < 3 and error == wire.NONE:
            error = errors[0]  # one member: its answer is the request's
        return response(
            version=request.version,
            error_code=error,
            members=[
                response.MemberResponse(
                    member_id=member_id, group_instance_id=instance_id, error_code=code
                )
                for (member_id, instance_id), code in zip(members, errors, strict=True)
            ],
        )

    async def describe_groups(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.DESCRIBE_GROUPS].response
        described = []
        for group in request.groups:
            found = await self._groups.describe(group)
            described.append(
                response.DescribedGroup(
                    error_code=wire.NONE,
                    group_id=group,
                    group_state=found.state,
                    protocol_type=found.protocol_type,
                    protocol_data=found.protocol,
                    members=[
                        response.DescribedGroup.DescribedGroupMember(
                            member_id=member.member_id,
                            group_instance_id=member.instance_id,
                            client_id=member.client_id,
                            client_host=member.client_host,
                            member_metadata=member.metadata,
                            member_assignment=member.assignment,
                        )
                        for member in found.members
                    ],
                )
            )
        return response(version=request.version, groups=described)

    async def list_groups(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.LIST_GROUPS].response
        return response(
            version=request.version,
            error_code=wire.NONE,
            groups=[
                response.ListedGroup(group_id=group, protocol_type=protocol_type)
                for group, protocol_type in await self._groups.list_groups()
            ],
        )

    async def offset_commit(self, who: Principal, request: Any) -> Any:
        """A group's offsets are the positions of its registered consumer ``kafka:GROUP``
        on each partition (offset - 1: the last event it has read)."""
        response = wire.APIS[wire.OFFSET_COMMIT].response
        topic_type = response.OffsetCommitResponseTopic
        member_error = wire.NONE
        if request.generation_id_or_member_epoch >= 0:
            member_error = await self._groups.generation_of(
                request.group_id, request.member_id, request.generation_id_or_member_epoch
            )
        component = GROUP_CONSUMER_PREFIX + request.group_id
        topics = []
        for topic in request.topics:
            code, info = self._topics.topic(who, topic.name, Right.READ)
            parts = []
            for part in topic.partitions:
                error = code if member_error == wire.NONE else member_error
                log = None if info is None else self._topics.log(info, part.partition_index)
                if error == wire.NONE and log is None:
                    error = wire.UNKNOWN_TOPIC_OR_PARTITION
                if error == wire.NONE and log is not None:
                    error = await self._commit(who, log, component, part.committed_offset)
                parts.append(
                    topic_type.OffsetCommitResponsePartition(
                        partition_index=part.partition_index, error_code=error
                    )
                )
            topics.append(topic_type(name=topic.name, partitions=parts))
        return response(version=request.version, topics=topics)

    async def _commit(self, who: Principal, log: EventLog, component: str, offset: int) -> int:
        consumers = log.consumers
        try:
            await consumers.register(who, component, transport="kafka")
            moved = await consumers.seek(who, who.user_id, component, max(offset - 1, 0))
        except PositionPastHead:  # nothing there was read: no position may say so
            return wire.OFFSET_OUT_OF_RANGE
        except Refused:
            return wire.TOPIC_AUTHORIZATION_FAILED
        except ValueError:
            return wire.OFFSET_OUT_OF_RANGE
        return wire.NONE if moved else wire.UNKNOWN_TOPIC_OR_PARTITION

    async def offset_fetch(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.OFFSET_FETCH].response
        topic_type = response.OffsetFetchResponseTopic
        component = GROUP_CONSUMER_PREFIX + request.group_id
        asked = request.topics
        if asked is None:  # every topic the group committed: those the user may read
            asked = [
                _AllPartitions(info.name, list(range(len(info.partitions))))
                for info in self._topics.streams
                if self._topics.streams.access.allows(who, Right.READ, info.name)
            ]
        topics = []
        for topic in asked:
            code, info = self._topics.topic(who, topic.name, Right.READ)
            parts = []
            for number in topic.partition_indexes:
                log = None if info is None else self._topics.log(info, number)
                offset, error = -1, code
                if log is not None:
                    try:
                        position = await log.consumers.position(who, component)
                    except Refused:
                        error = wire.TOPIC_AUTHORIZATION_FAILED
                    else:
                        offset = -1 if position is None else position + 1
                elif info is not None:
                    error = wire.UNKNOWN_TOPIC_OR_PARTITION
                if request.topics is None and offset < 0:
                    continue
                parts.append(
                    topic_type.OffsetFetchResponsePartition(
                        partition_index=number,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        metadata="",
                        error_code=error,
                    )
                )
            if parts or request.topics is not None:
                topics.append(topic_type(name=topic.name, partitions=parts))
        return response(version=request.version, error_code=wire.NONE, topics=topics)

    async def close(self) -> None:
        await self._groups.close()


class _AllPartitions:
    """OffsetFetch's topic of every partition (when the request names no topics)."""

    def __init__(self, name: str, partition_indexes: list[int]) -> None:
        self.name = name
        self.partition_indexes = partition_indexes
