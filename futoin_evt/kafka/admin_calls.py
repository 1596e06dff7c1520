"""The Kafka administration calls: topics made, dropped and grown (manage on the stream), a
topic's settings, the cluster."""

from __future__ import annotations

from typing import Any, Final

from ..domain.principal import Principal
from ..domain.rights import Right
from ..log.access import AccessDenied
from . import wire
from .topics import Topics


class AdminCalls:
    def __init__(self, topics: Topics) -> None:
        self._topics = topics
        self.handlers = {
            wire.CREATE_TOPICS: self.create_topics,
            wire.DELETE_TOPICS: self.delete_topics,
            wire.CREATE_PARTITIONS: self.create_partitions,
            wire.DESCRIBE_CONFIGS: self.describe_configs,
            wire.DESCRIBE_CLUSTER: self.describe_cluster,
        }

    async def create_topics(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.CREATE_TOPICS].response
        results = []
        for topic in request.topics:
            code, message = wire.NONE, None
            partitions = 1 if topic.num_partitions == -1 else topic.num_partitions
            if topic.replication_factor not in (-1, 1):
                code, message = wire.INVALID_REPLICATION_FACTOR, "one copy of each partition"
            elif topic.assignments:
                code, message = wire.INVALID_REQUEST, "replica assignments are not served"
            elif not request.validate_only:
                code, message = await self._create(who, topic.name, partitions)
            results.append(
                response.CreatableTopicResult(
                    name=topic.name, error_code=code, error_message=message
                )
            )
        return response(version=request.version, topics=results)

    async def _create(self, who: Principal, name: str, partitions: int) -> tuple[int, str | None]:
        try:
            await self._topics.streams.add(who, name, partitions)
        except AccessDenied:
            return wire.TOPIC_AUTHORIZATION_FAILED, None
        except KeyError:
            return wire.TOPIC_ALREADY_EXISTS, f"the stream {name} exists"
        except ValueError as exc:
            bad_count = "partition" in str(exc)
            code = wire.INVALID_PARTITIONS if bad_count else wire.INVALID_TOPIC_EXCEPTION
            return code, str(exc)
        return wire.NONE, None

    async def delete_topics(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.DELETE_TOPICS].response
        results = []
        for name in request.topic_names:
            code = wire.NONE
            try:
                if not self._topics.streams.holds_any(who, name):
                    code = wire.TOPIC_AUTHORIZATION_FAILED
                elif not await self._topics.streams.drop(who, name):
                    code = wire.UNKNOWN_TOPIC_OR_PARTITION
            except AccessDenied:
                code = wire.TOPIC_AUTHORIZATION_FAILED
            except ValueError:
                code = wire.POLICY_VIOLATION
            results.append(response.DeletableTopicResult(name=name, error_code=code))
        return response(version=request.version, responses=results)

    async def create_partitions(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.CREATE_PARTITIONS].response
        results = []
        for topic in request.topics:
            code, message = wire.NONE, None
            try:
                _error, info = self._topics.topic(who, topic.name, Right.MANAGE)
                if _error != wire.NONE:
                    code = _error
                elif topic.assignments:
                    code, message = wire.INVALID_REQUEST, "replica assignments are not served"
                elif info is not None and not request.validate_only:
                    await self._topics.streams.grow(who, topic.name, topic.count)
            except AccessDenied:
                code = wire.TOPIC_AUTHORIZATION_FAILED
            except ValueError as exc:
                code, message = wire.INVALID_PARTITIONS, str(exc)
            results.append(
                response.CreatePartitionsTopicResult(
                    name=topic.name, error_code=code, error_message=message
                )
            )
        return response(version=request.version, results=results)

    async def describe_configs(self, who: Principal, request: Any) -> Any:
        """A topic's settings as Kafka names them (what this server keeps is fixed per
        server for now); a broker's: none."""
        response = wire.APIS[wire.DESCRIBE_CONFIGS].response
        result_type = response.DescribeConfigsResult
        results = []
        for resource in request.resources:
            code, message, configs = wire.NONE, None, []
            if resource.resource_type == _TOPIC_RESOURCE:
                error, _info = self._topics.topic(who, resource.resource_name, Right.READ)
                code = error
                if error == wire.NONE:
                    configs = [
                        _config_entry(result_type, name, value)
                        for name, value in _TOPIC_CONFIGS
                        if resource.configuration_keys is None
                        or name in resource.configuration_keys
                    ]
            results.append(
                result_type(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        return response(version=request.version, results=results)

    async def describe_cluster(self, who: Principal, request: Any) -> Any:
        response = wire.APIS[wire.DESCRIBE_CLUSTER].response
        live = self._topics.brokers.live()
        return response(
            version=request.version,
            error_code=wire.NONE,
            cluster_id=self._topics.cluster_id,
            controller_id=live[0][0],
            brokers=[
                response.DescribeClusterBroker(broker_id=node, host=host, port=port)
                for node, host, port in live
            ],
        )


_TOPIC_RESOURCE: Final = 2
_DEFAULT_CONFIG: Final = 5
#: A topic's settings as DescribeConfigs gives them.
_TOPIC_CONFIGS: Final = (
    ("cleanup.policy", "delete"),
    ("message.timestamp.type", "LogAppendTime"),
    ("min.insync.replicas", "1"),
)


def _config_entry(result_type: Any, name: str, value: str) -> Any:
    return result_type.DescribeConfigsResourceResult(
        name=name,
        value=value,
        read_only=True,
        is_default=True,
        config_source=_DEFAULT_CONFIG,
        is_sensitive=False,
        synonyms=[],
    )
