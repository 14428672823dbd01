"""Wire-compatible "raw views" of Pub/Sub messages, parsed by the C protobuf runtime (upb).

Owns the rule: the hot path splits and probes protobuf bytes in C, never field by field in Python.
`PublishRequestRaw` is PublishRequest with `messages` declared as `repeated bytes`, so parsing it yields
each message's exact serialized bytes. `PublishProbe` declares every PubsubMessage field *except* data;
after DiscardUnknownFields its size tells whether any message carries attributes, an ordering key or
server-owned fields, without touching messages one by one."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from pigeon.core.errors import InvalidArgument

_POOL = descriptor_pool.DescriptorPool()


def _build():
    f = descriptor_pb2.FileDescriptorProto(name="pigeon/raw.proto", package="pigeon.raw", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields):
        m = f.message_type.add(name=name)
        for fname, num, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=num, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg("PublishRequestRaw", [("topic", 1, T.TYPE_STRING, opt, None), ("messages", 2, T.TYPE_BYTES, rep, None)])
    msg(
        "MessageProbe",
        [
            ("attributes", 2, T.TYPE_BYTES, rep, None),
            ("message_id", 3, T.TYPE_BYTES, opt, None),
            ("publish_time", 4, T.TYPE_BYTES, opt, None),
            ("ordering_key", 5, T.TYPE_BYTES, opt, None),
        ],
    )
    msg("PublishProbe", [("messages", 2, T.TYPE_MESSAGE, rep, ".pigeon.raw.MessageProbe")])
    _POOL.Add(f)
    get = lambda n: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"pigeon.raw.{n}"))  # noqa: E731
    return get("PublishRequestRaw"), get("PublishProbe")


PublishRequestRaw, PublishProbe = _build()


def parse_request(cls, raw: bytes | memoryview):
    """`cls.FromString(raw)` for bytes a client sent (a PublishRequest or one of its views): InvalidArgument when
    they are not one — the request-level parse passes messages whose own bytes are broken, so every parse of
    client bytes goes through here."""
    try:
        return cls.FromString(raw)
    except DecodeError as e:
        raise InvalidArgument(f"The request is not a valid google.pubsub.v1.PublishRequest: {e}.") from None


def split_publish(raw: bytes | memoryview) -> tuple[str, list[bytes]]:
    """(topic, serialized messages) of a PublishRequest; InvalidArgument when the bytes are not one."""
    r = parse_request(PublishRequestRaw, raw)
    return r.topic, list(r.messages)


def only_data(raw: bytes, count: int) -> bool:
    """True when no message of the PublishRequest has attributes, ordering key, id or publish time;
    InvalidArgument when a message's bytes are not a PubsubMessage."""
    p = parse_request(PublishProbe, raw)
    p.DiscardUnknownFields()
    return p.ByteSize() == 2 * count  # each message then serializes as an empty entry: tag + zero length
