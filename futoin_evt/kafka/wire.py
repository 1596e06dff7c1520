"""Kafka's request framing: the request header, the APIs and versions served, the message
types (kafka-python's :mod:`kafka.protocol`, typed here once), and Kafka's error codes. No I/O.

A request is a size-prefixed frame: header (api key, api version, correlation id, client id,
and tagged fields in a flexible version), then the body of the API's request type. A response
is its correlation id (with tagged fields when flexible, but never for ApiVersions), then the
body. The versions served are the non-flexible ones of about Kafka 2.3 (what aiokafka,
kafkajs, kafka-python and librdkafka all speak), plus ApiVersions 3 and DescribeCluster 0,
which are flexible in every version.
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

from kafka.protocol import admin, consumer, metadata, producer, sasl

# -- error codes (Kafka's, as its clients know them) -----------------------------------------

NONE: Final = 0
OFFSET_OUT_OF_RANGE: Final = 1
CORRUPT_MESSAGE: Final = 2
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
INVALID_FETCH_SIZE: Final = 4
NOT_LEADER_OR_FOLLOWER: Final = 6
MESSAGE_TOO_LARGE: Final = 10
COORDINATOR_NOT_AVAILABLE: Final = 15
INVALID_TOPIC_EXCEPTION: Final = 17
RECORD_LIST_TOO_LARGE: Final = 18
INVALID_REQUIRED_ACKS: Final = 21
TOPIC_AUTHORIZATION_FAILED: Final = 29
GROUP_AUTHORIZATION_FAILED: Final = 30
CLUSTER_AUTHORIZATION_FAILED: Final = 31
INVALID_TIMESTAMP: Final = 32
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
UNSUPPORTED_VERSION: Final = 35
TOPIC_ALREADY_EXISTS: Final = 36
INVALID_PARTITIONS: Final = 37
INVALID_REPLICATION_FACTOR: Final = 38
INVALID_REQUEST: Final = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
POLICY_VIOLATION: Final = 44
OUT_OF_ORDER_SEQUENCE_NUMBER: Final = 45
DUPLICATE_SEQUENCE_NUMBER: Final = 46
INVALID_PRODUCER_EPOCH: Final = 47
INVALID_TXN_STATE: Final = 48
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
SECURITY_DISABLED: Final = 54
UNKNOWN_PRODUCER_ID: Final = 59
SASL_AUTHENTICATION_FAILED: Final = 58
KAFKA_STORAGE_ERROR: Final = 56
INVALID_RECORD: Final = 87
INVALID_CONFIG: Final = 40
UNKNOWN_SERVER_ERROR: Final = -1

#: The request types of the APIs served, by API key, with the versions served.
Message = Any


class Api(NamedTuple):
    name: str
    request: Message
    response: Message
    min_version: int
    max_version: int


def _api(request: Message, response: Message, low: int, high: int) -> Api:
    return Api(str(request.name).removesuffix("Request"), request, response, low, high)


PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
SASL_HANDSHAKE: Final = 17
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
DESCRIBE_CONFIGS: Final = 32
SASL_AUTHENTICATE: Final = 36
CREATE_PARTITIONS: Final = 37
DESCRIBE_CLUSTER: Final = 60

#: What ApiVersions announces: each API with the versions served.
APIS: Final[dict[int, Api]] = {
    PRODUCE: _api(producer.ProduceRequest, producer.ProduceResponse, 3, 8),
    FETCH: _api(consumer.FetchRequest, consumer.FetchResponse, 4, 11),
    LIST_OFFSETS: _api(consumer.ListOffsetsRequest, consumer.ListOffsetsResponse, 1, 5),
    METADATA: _api(metadata.MetadataRequest, metadata.MetadataResponse, 0, 8),
    OFFSET_COMMIT: _api(consumer.OffsetCommitRequest, consumer.OffsetCommitResponse, 2, 7),
    OFFSET_FETCH: _api(consumer.OffsetFetchRequest, consumer.OffsetFetchResponse, 1, 5),
    FIND_COORDINATOR: _api(metadata.FindCoordinatorRequest, metadata.FindCoordinatorResponse, 0, 2),
    JOIN_GROUP: _api(consumer.JoinGroupRequest, consumer.JoinGroupResponse, 0, 5),
    HEARTBEAT: _api(consumer.HeartbeatRequest, consumer.HeartbeatResponse, 0, 3),
    LEAVE_GROUP: _api(consumer.LeaveGroupRequest, consumer.LeaveGroupResponse, 0, 3),
    SYNC_GROUP: _api(consumer.SyncGroupRequest, consumer.SyncGroupResponse, 0, 3),
    DESCRIBE_GROUPS: _api(admin.DescribeGroupsRequest, admin.DescribeGroupsResponse, 0, 4),
    LIST_GROUPS: _api(admin.ListGroupsRequest, admin.ListGroupsResponse, 0, 2),
    SASL_HANDSHAKE: _api(sasl.SaslHandshakeRequest, sasl.SaslHandshakeResponse, 0, 1),
    API_VERSIONS: _api(metadata.ApiVersionsRequest, metadata.ApiVersionsResponse, 0, 3),
    CREATE_TOPICS: _api(admin.CreateTopicsRequest, admin.CreateTopicsResponse, 0, 4),
    DELETE_TOPICS: _api(admin.DeleteTopicsRequest, admin.DeleteTopicsResponse, 0, 3),
    INIT_PRODUCER_ID: _api(producer.InitProducerIdRequest, producer.InitProducerIdResponse, 0, 1),
    DESCRIBE_CONFIGS: _api(admin.DescribeConfigsRequest, admin.DescribeConfigsResponse, 0, 3),
    SASL_AUTHENTICATE: _api(sasl.SaslAuthenticateRequest, sasl.SaslAuthenticateResponse, 0, 1),
    CREATE_PARTITIONS: _api(admin.CreatePartitionsRequest, admin.CreatePartitionsResponse, 0, 1),
    DESCRIBE_CLUSTER: _api(admin.DescribeClusterRequest, admin.DescribeClusterResponse, 0, 0),
}


def _known() -> dict[int, tuple[Message, Message]]:
    """Every API kafka-python has the types of (those not served are answered with
    UNSUPPORTED_VERSION in their own response type)."""
    known: dict[int, tuple[Message, Message]] = {}
    for module in (admin, consumer, metadata, producer, sasl):
        for name in dir(module):
            request = getattr(module, name)
            if not name.endswith("Request") or not hasattr(request, "API_KEY"):
                continue
            response = getattr(module, name.removesuffix("Request") + "Response", None)
            if response is not None:
                known[int(request.API_KEY)] = (request, response)
    return known


#: The request and response types of every API key kafka-python knows.
KNOWN: Final = _known()


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Where the body starts in the frame.
    body_at: int


class BadRequest(Exception):
    """A frame that is not a request: the connection is closed (Kafka does the same)."""


_HEADER: Final = struct.Struct(">hhih")


def is_flexible(api_key: int, version: int) -> bool:
    """Whether the request and response of this version have tagged fields (for an API
    kafka-python does not know: False)."""
    types = KNOWN.get(api_key)
    return types is not None and bool(types[0].flexible_version_q(version))


def parse_header(frame: bytes) -> RequestHeader:
    """The header of a request frame (the size prefix taken off); raises BadRequest."""
    if len(frame) < _HEADER.size:
        raise BadRequest("a request shorter than its header")
    api_key, version, correlation_id, id_length = _HEADER.unpack_from(frame)
    at = _HEADER.size
    client_id: str | None = None
    if id_length >= 0:
        if at + id_length > len(frame):
            raise BadRequest("a client id longer than its request")
        try:
            client_id = frame[at : at + id_length].decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("a client id that is not UTF-8") from None
        at += id_length
    if version >= 0 and is_flexible(api_key, version):
        try:
            at = _skip_tagged_fields(frame, at)
        except BadRequest:
            if api_key != API_VERSIONS:
                raise
            # A version not served: the answer (in version 0) needs nothing of the rest.
    return RequestHeader(api_key, version, correlation_id, client_id, at)


def _uvarint(frame: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(frame) or shift > 28:
            raise BadRequest("a malformed varint in the request header")
        byte = frame[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _skip_tagged_fields(frame: bytes, at: int) -> int:
    count, at = _uvarint(frame, at)
    for _ in range(count):
        _tag, at = _uvarint(frame, at)
        size, at = _uvarint(frame, at)
        at += size
        if at > len(frame):
            raise BadRequest("a tagged field longer than its request")
    return at


def decode_body(api: Message, frame: bytes, header: RequestHeader) -> Any:
    """The request's body as kafka-python's type; raises BadRequest, also for a body whose
    last string or bytes ends past the frame (kafka-python's ``decode`` takes what there is)."""
    version = header.api_version
    flexible = api.flexible_version_q(version)
    try:
        decode = api._struct.compiled_decode_from(
            version, compact=flexible, tagged=flexible, data_class=api[None]
        )
        request, end = decode(memoryview(frame), header.body_at)
    except Exception as exc:  # kafka-python raises what its decoders meet
        raise BadRequest(f"a {api.name} v{version} body that does not decode") from exc
    if end > len(frame):
        raise BadRequest(f"a {api.name} v{version} body that ends early")
    if not _nulls_where_allowed(api._struct, request, version):
        raise BadRequest(f"a {api.name} v{version} body with a null where none is allowed")
    return request


def _nulls_where_allowed(struct: Any, value: Any, version: int) -> bool:
    """Whether ``value`` (of kafka-python's ``struct``) is null only in fields nullable in
    ``version``: kafka-python decodes a null string, bytes or array wherever one is sent,
    and the handlers take a name or a group id for a string."""
    for name, field in struct.fields.items():
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        item = getattr(value, name)
        if item is None:
            if not field.nullable_for_version_q(version):
                return False
        elif field.is_struct_array():
            if not all(_nulls_where_allowed(field.array_of, one, version) for one in item):
                return False
        elif field.is_struct():
            if not _nulls_where_allowed(field, item, version):
                return False
        elif field.is_array() and None in item:
            return False
    return True


def encode_response(response: Any, correlation_id: int) -> bytes:
    """The framed response (size prefix, header, body)."""
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


def api_versions_body(version: int, error: int = NONE) -> Any:
    """ApiVersions' answer in ``version`` (0 when the request's version is not served, as
    Kafka answers it: the client then asks again in a version the list offers)."""
    response_type = metadata.ApiVersionsResponse
    entries = [
        response_type.ApiVersion(
            api_key=key, min_version=api.min_version, max_version=api.max_version
        )
        for key, api in sorted(APIS.items())
    ]
    return response_type(version=version, error_code=error, api_keys=entries, throttle_time_ms=0)


def unsupported_body(api_key: int, version: int) -> Any | None:
    """An answer of UNSUPPORTED_VERSION in the API's own response type at ``version``, for an
    API (or version) not served; None when there is no such type (the connection is closed)."""
    types = KNOWN.get(api_key)
    if types is None or not 0 <= version <= types[1].max_version:
        return None
    response_type = types[1]
    if "error_code" not in set(response_type._struct.fields):
        return None  # no error it could say: Kafka closes such a connection too
    return response_type(version=version, error_code=UNSUPPORTED_VERSION)
