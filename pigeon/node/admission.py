"""Admission: how much of the node's memory clients may hold at once. Owns the rules: publishes waiting to become
durable hold at most `publish_pending_bytes`; at most `streams_max` StreamingPull streams are open; and
responses on their way to StreamingPull clients share `stream_unsent_bytes`: a stream's next response carries
at most what the budget has left or, once that is spent, its fair part (the budget over the open streams; one
message at least). Streams whose clients stop reading — each holds the one response gRPC is writing — so hold
at most twice the budget and a message each, streams that read are never made to wait for them, and while
clients read (their responses leave at once) every response is full size. What passes a
limit is refused with RESOURCE_EXHAUSTED naming it (the official clients retry that with backoff), never
queued without bound."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from pigeon.core import limits
from pigeon.core.errors import ResourceExhausted

_MiB = 1024 * 1024


@dataclass(frozen=True)
class AdmissionStats:
    publish_pending_bytes: int
    streams: int
    stream_unsent_bytes: int  # responses handed to gRPC and not yet taken by their clients
    refused_publishes: int
    refused_streams: int
    stalled_streams: int  # streams whose client left a response untaken past the stall limit


class Admission:
    def __init__(self, publish_pending_bytes: int, streams_max: int, stream_unsent_bytes: int,
                 stream_write_stall_s: float):
        self.publish_pending_max = publish_pending_bytes
        self.streams_max = streams_max
        self.unsent_max = stream_unsent_bytes
        self.stall_s = stream_write_stall_s
        self.publish_pending = 0
        self.streams = 0
        self.unsent = 0
        self.refused_publishes = self.refused_streams = self.stalled = 0

    # --- publishes -------------------------------------------------------------------------------------
    @contextmanager
    def publishing(self, n: int):
        """Hold `n` bytes of a publish until it is durable (or failed); refuse it when they would pass the limit
        (one publish alone is always let through: a request is never bigger than the service allows)."""
        if self.publish_pending and self.publish_pending + n > self.publish_pending_max:
            self.refused_publishes += 1
            raise ResourceExhausted(
                f"Publishes waiting to be written already hold {self.publish_pending / _MiB:.0f} MiB, the server's "
                f"limit (publish_pending_bytes: {self.publish_pending_max / _MiB:.0f} MiB); retry with backoff.")
        self.publish_pending += n
        try:
            yield
        finally:
            self.publish_pending -= n

    # --- streams ---------------------------------------------------------------------------------------
    def open_stream(self) -> None:
        if self.streams >= self.streams_max:
            self.refused_streams += 1
            raise ResourceExhausted(
                f"This server has {self.streams} StreamingPull streams open, its limit (streams_max: "
                f"{self.streams_max}); retry later.")
        self.streams += 1

    def close_stream(self) -> None:
        self.streams -= 1

    def share(self) -> int:
        """The most bytes of messages a stream's next response may carry (the caller sends one message at least):
        what the budget has left, and once that is spent (by clients that do not read), a fair part of it."""
        fair = self.unsent_max // max(1, self.streams)
        return min(limits.response_bytes_max, max(self.unsent_max - self.unsent, fair))

    def sending(self, n: int) -> None:
        self.unsent += n

    def sent(self, n: int) -> None:
        self.unsent -= n

    def statistics(self) -> AdmissionStats:
        return AdmissionStats(self.publish_pending, self.streams, self.unsent, self.refused_publishes,
                              self.refused_streams, self.stalled)
