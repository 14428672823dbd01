"""core.rawproto: the C-parsed views of a PublishRequest. Bytes that are not one — also when only a message inside
is broken, which the request-level parse does not see — are INVALID_ARGUMENT, never an unexpected error, on the
fast path (plain messages of 3 bytes or more) and on the message-by-message one (the fuzz runs against the server
found one in each)."""

from __future__ import annotations

import pytest
from google.pubsub_v1 import types

from pigeon.broker import commands
from pigeon.core import rawproto
from pigeon.core.errors import InvalidArgument

_PublishRequest, _PubsubMessage = types.PublishRequest.pb(), types.PubsubMessage.pb()


def test_plain_and_rich_messages_are_told_apart():
    plain = _PublishRequest(topic="projects/p/topics/t", messages=[_PubsubMessage(data=b"abc")] * 3)
    rich = _PublishRequest(topic="projects/p/topics/t", messages=[_PubsubMessage(data=b"abc", ordering_key="k")])
    assert rawproto.only_data(plain.SerializeToString(), 3)
    assert not rawproto.only_data(rich.SerializeToString(), 1)


@pytest.mark.parametrize("inner", [b"\xff\xff\xff", b"\x12\x05ab", b"\x0a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01",
                                   b"\xff", b"\x12\x05abcdefgh" * 2])
def test_a_message_that_is_not_a_pubsub_message_is_invalid_argument(inner):
    raw = rawproto.PublishRequestRaw(topic="projects/p/topics/t", messages=[inner]).SerializeToString()
    assert rawproto.split_publish(raw)[1] == [inner]  # the request itself parses: only the message is broken
    with pytest.raises(InvalidArgument, match="not a valid google.pubsub.v1.PublishRequest"):
        commands.check_publish(raw)
