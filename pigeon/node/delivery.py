"""Delivery, performed: handing messages out (Pull, StreamingPull, Take, push leases) and taking them back (acks,
deadline changes, the dead-letter topic). Owns the rules of the node's side of delivery: a pull waits for messages
until shortly before its deadline and answers empty rather than late; a stream takes messages only within its flow
control, and one waiter woken for a subscription passes the wake-up on while more is ready; a delivery's messages
go out only once its lease is recorded (in a cluster, replicated: Delivery.recording); a message whose batch must
first be read from another node (node.reader.NotCached) is given back untaken, fetched in the background, and its
subscription's waiters woken once it is here — a take never waits; an ack is answered once durable, a stream's ack
with the next group commit (exactly-once: once durable). The choices are the broker's
(broker.subscription, broker.commands); every state change is a record committed through the executor."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from operator import itemgetter

from pigeon.broker import commands
from pigeon.broker.subscription import SubscriptionState
from pigeon.broker.topic import SHARD_MASK
from pigeon.core import limits
from pigeon.core.errors import AckIdFailure, FailedPrecondition, InvalidArgument, NotFound, PigeonError, Unavailable
from pigeon.node import hops
from pigeon.node.reader import NotCached
from pigeon.node.streams import Gate, Signal, Stream
from pigeon.storage import records as R

log = logging.getLogger("pigeon.delivery")


class Delivery:
    def __init__(self, executor):
        self.executor = executor  # node.engine.Engine: the state, the one commit, durability
        self._tasks: set[asyncio.Task] = set()  # dead letters on their way
        self._fetching: dict[int, asyncio.Task] = {}  # log address → its batch being fetched for a delivery
        self._unanswered: dict = {}  # ShardIndex → _Unanswered: its batches whose publishers wait for their answer
        self._answers: dict[int, Gate] = {}  # subscription uid → its last leases' wait for their publishers

    @property
    def dead_letters_in_flight(self) -> int:
        """Batches being published to a dead-letter topic now."""
        return len(self._tasks)

    def ack(self, s: SubscriptionState, nums: list[int]) -> None:
        """Acknowledge message numbers (logged; durable with the next group commit — callers that answer a
        client wait for it)."""
        if nums:
            self.executor.commit(R.Ack(s.uid, nums))
            self.executor.ack_latency.acked(s.uid, nums, self.executor.clock.now())

    def deliver(self, s: SubscriptionState, max_messages: int, max_bytes: int, owner, deadline_s: float) -> list[bytes]:
        """Lock up to `max_messages` messages; return each as an encoded `received_messages` entry (field 1 of
        PullResponse and StreamingPullResponse alike)."""
        now = self.executor.clock.now()
        picks = s.take(max_messages, now)
        if not picks:
            return []
        out: list[bytes] = []
        sizes: list[int] = []
        if picks.out:
            show_attempt = bool(s.config.dead_letter_policy.dead_letter_topic)
            try:
                out, sizes = self.executor.reader.received(s.topic, picks.out, s.uid, show_attempt, max_bytes,
                                                           s.overrides, s.generations)
            except NotCached as e:  # given back untaken; the waiters are woken once it was fetched
                s.untake(picks, 0)
                self._fetch(s, e.address)
                if not picks:
                    return []
            if len(out) < len(picks.out):  # the rest did not fit: given back before anything is leased
                s.untake(picks, len(out))
        self._commit_picks(s, picks, now + deadline_s, owner)
        if out:
            self.executor.ack_latency.delivered(s.uid, picks.out[0][0], now)
        if owner is not None and out:  # nothing ran since the commit: every leased message is the stream's
            if picks.fresh:
                owner.hold(map(itemgetter(0), picks.out), sizes)
            else:  # an ordered batch resent whole may hold acked members: those have no lease to release
                held = [(n, size) for (n, _), size in zip(picks.out, sizes) if s.leases.get(n, (0, 0, None))[2] is owner]
                owner.hold([n for n, _ in held], [size for _, size in held])
        return out

    def _commit_picks(self, s: SubscriptionState, picks, deadline: float, owner) -> None:
        """Log the picks' Deliver record — or, refused (a shard of the topic moved: its part is another log's, or
        being handed over), give every pick back untaken, so that the messages go out again from their owner."""
        try:
            self.executor.commit(picks.record(s.uid, deadline), owner)
        except Unavailable:
            s.untake(picks, 0, dead=True)
            raise
        if self._unanswered and picks.out and self.executor.logs.replicas is not None:
            self._wait_for_answers(s, picks.out)

    def recording(self, s: SubscriptionState, wake=None) -> asyncio.Future | None:
        """What the leases just taken for `s` wait for before their messages go out (take it right after them);
        None when there is nothing to wait for (one node). In a cluster, their Deliver record held by Qa members
        of the log's ensemble (Unavailable when the log moved meanwhile): the lease is then in the log every later
        owner of the bundle reads, before any ack of those messages — and an owner that lost its bundle without
        knowing it yet (paused, cut off) cannot have its Deliver record confirmed (the new owner fenced the
        ledger), so it hands out nothing, not even a message the new owner has seen acknowledged since. And the
        publishers of those messages answered (show_when_durable): a subscriber never gets a message before its
        publisher's answer is on its way. `wake()`, when given, is called once it is done (the stream to wake)."""
        recording = self.executor.logs.recording(s.log_id)
        gate = self._answers.pop(s.uid, None)
        if hops.ON and recording is not None:
            _mark_recording(recording, gate)
        if gate is None:
            if recording is not None and wake is not None:
                recording.add_done_callback(wake)
            return recording
        if recording is not None:
            gate.wait_future(recording)
        if wake is not None:
            gate.wakes.append(wake)
        gate.arm()
        return gate.fut

    async def recorded(self, s: SubscriptionState) -> None:
        """Until `recording(s)` is done (Unavailable when the log moved meanwhile)."""
        recording = self.recording(s)
        if recording is not None:
            await asyncio.shield(recording)

    def lease_left(self, until: float, lease_s: float) -> bool:
        """Whether leases of `lease_s` that run out at `until` may still go out, now that they are recorded. Not when
        they (nearly) ran out meanwhile: a node paused right after it sent a Deliver record finds the members'
        answers waiting when it runs again, and would hand the messages out long after their leases ended — after
        the log's next owner handed them out again and had them acknowledged, perhaps. (One node: no other owner.)"""
        if self.executor.logs.replicas is None:
            return True
        return self.executor.clock.now() < until - min(limits.lease_left_s_min, lease_s / 4)

    def _wait_for_answers(self, s: SubscriptionState, out) -> None:
        """Leases of messages whose publishers are not answered yet (a replicated log shows a batch before its
        publish is durable: show_when_durable) go out only once they are: `recording(s)` waits for it."""
        t = s.topic
        if t is None:  # (detached from a topic deleted: nothing of it is leased)
            return
        last: dict[int, int] = {}  # shard → the highest offset leased
        for num, _ in out:
            shard, offset = num & SHARD_MASK, num >> limits.shard_bits
            if last.get(shard, -1) < offset:
                last[shard] = offset
        for shard, offset in last.items():
            held = self._unanswered.get(t.shards[shard]) if shard < len(t.shards) else None
            if held is not None and held.bases and min(held.bases) <= offset:
                gate = self._answers.get(s.uid)  # (one an earlier take left, not waited on yet, takes these too)
                if gate is None:
                    gate = self._answers[s.uid] = Gate()
                gate.wait_answer()
                held.waiters.append((offset, gate.answer_in))

    def lease(self, s: SubscriptionState, max_messages: int, deadline_s: float, owner=None, per_key_max: int = 0):
        """Lock up to `max_messages` messages for `owner` (a push worker); messages past their delivery attempts
        go to the dead-letter topic instead. [(num, version)]"""
        now = self.executor.clock.now()
        picks = s.take(max_messages, now, per_key_max)
        if not picks:
            return [], []
        msgs = []
        if picks.out:
            try:
                msgs = self.executor.reader.messages(s.topic, [n for n, _ in picks.out], s.overrides)
            except NotCached as e:  # as in `deliver`
                s.untake(picks, 0)
                self._fetch(s, e.address)
                if not picks:
                    return [], []
        self._commit_picks(s, picks, now + deadline_s, owner)
        if picks.out:
            self.executor.ack_latency.delivered(s.uid, picks.out[0][0], now)
        return picks.out, msgs

    def show_when_durable(self, t, rec: R.Publish, end: int, answered=None) -> int:
        """Show the batch to the topic's subscriptions the moment it is durable (in a cluster: held by the
        ensemble too) — driven by the durability callbacks, never by the publisher's coroutine alone, so a
        publisher that goes away meanwhile (a deadline, a disconnect) does not hide it. `answered(callback)`, when
        given, calls `callback()` once the publisher's handler has its answer (or failed): until then no message
        from this batch on of its shard is handed out, so a subscriber never gets a message before its publisher's
        answer is on its way — on one connection, ahead of the message — as on Google's service and emulator, which clients' own tests rely on (publish,
        then wait for the message with that id). A batch somebody waits for is kept in the reader's cache now, so
        that delivery neither reads nor parses the record back; one nobody waits for costs no memory."""
        ex = self.executor
        log_id = t.log_id if not t.spread else ex.state.shard_logs(t, ex.config.bundles)[rec.shard]
        early = ex.logs.replicates(log_id)
        if early or any(sig.waiting for uid in t.subscriptions if (sig := ex.signals.get(uid)) is not None):
            pos = t.shards[rec.shard].pos[-1]  # apply has just indexed the batch
            ex.reader.remember_published(pos, rec.request, rec.publish_ms, end - pos)
        ix = t.shards[rec.shard]
        if answered is not None:
            self._unanswered.setdefault(ix, _Unanswered()).bases.append(rec.base)
            answered(lambda: self._answered(t, ix, rec.base))
        if early:
            # a replicated log: a delivery goes out only once its Deliver record is held by Qa members, and that
            # record, later in the same log, is held only after this batch is — so the batch may be leased now,
            # and a message waits for one quorum round trip, not two (the reader serves it from the cache;
            # dropped from it, a read of the journal waits until the batch is durable there). Its publisher's
            # answer, which comes with the batch's durability, is waited for by the delivery itself (recording)
            # rather than before the lease: that would put the lease's round trip after the publish's
            self._visible(t, ix, rec.base + rec.count, answered_first=False)
        # (a failed replication raises in the publisher's wait: the log's next owner shows the batch)
        ex.logs.on_durable(end, log_id, lambda: self._show(t, ix, rec))
        return log_id

    def _show(self, t, ix, rec: R.Publish) -> None:
        """The batch is durable: its messages may be handed out (`_visible`)."""
        ix.durable = max(ix.durable, rec.base + rec.count)
        self._visible(t, ix, rec.base + rec.count)

    def _answered(self, t, ix, base: int) -> None:
        """The publisher of the batch at `base` has had its answer: what it held back may be handed out."""
        held = self._unanswered[ix]
        held.bases.remove(base)
        if not held.bases:
            del self._unanswered[ix]
        if held.waiters:
            low = min(held.bases, default=1 << 62)  # the deliveries of messages below it may go out
            for w in [w for w in held.waiters if w[0] < low]:
                held.waiters.remove(w)
                w[1]()
        self._visible(t, ix, held.wanted)

    def shown(self, t, ix) -> None:
        """The shard's index now lets more out (a copy let go: TopicState.serve_copies): wake the subscriptions."""
        for uid in t.subscriptions:
            if (sig := self.executor.signals.get(uid)) is not None:
                sig.notify()

    def _visible(self, t, ix, end: int, answered_first: bool = True) -> None:
        """The shard's messages below `end` may be handed out — those below the first batch whose publisher is
        not answered yet, now, unless not `answered_first` (the delivery waits for the answer: recording): wake one
        waiter of each subscription. Not once the shard's index was replaced meanwhile (its log reset, the shard
        handed over): the new one says what it holds."""
        if ix not in t.shards or ix.held:  # (a copy of a shard its region serves: core.regions)
            return
        held = self._unanswered.get(ix) if answered_first else None
        if held is not None:
            held.wanted = max(held.wanted, end)
            end = min(end, min(held.bases))
        if ix.visible < end:
            ix.visible = end
            ex = self.executor
            for uid in t.subscriptions:
                sig = ex.signals.get(uid)
                if sig is not None:
                    sig.notify()

    async def read(self, s: SubscriptionState, nums: list[int]) -> list[tuple[bytes, bytes]]:
        """(stored message bytes, message id/publish time tail) as this subscription delivers them: a message
        updated in place through the queue extensions reads as updated."""
        return await self.executor.reader.messages_when_read(s.topic, nums, s.overrides)

    def _fetch(self, s: SubscriptionState, address: int) -> None:
        """Have the batch at log `address` fetched, then wake `s`'s waiters (after a pause when it failed: they
        try again, and fetch again)."""
        if address in self._fetching:
            return

        async def fetch() -> None:
            try:
                await self.executor.reader.fetch(address)
            except Exception as e:  # noqa: BLE001 — the bundle moved, no member answers: the waiters try again
                log.warning("reading a batch of %s from its ledger: %s", s.name, e)
                await asyncio.sleep(limits.fetch_retry_s)
            finally:
                self._fetching.pop(address, None)
                sig = self.executor.signals.get(s.uid)
                if sig is not None:
                    sig.notify_all()
        self._fetching[address] = asyncio.get_running_loop().create_task(fetch())

    def forward_dead_letters(self, s: SubscriptionState) -> None:
        nums, s.dead_letters = s.dead_letters, []
        task = asyncio.get_running_loop().create_task(self._dead_letter(s, nums))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dead_letter(self, s: SubscriptionState, nums: list[int]) -> None:
        """Publish to the dead-letter topic with the source attributes, then ack on the source. If the
        topic is missing or the publish fails, the held leases run out and the messages come back."""
        dlt = s.config.dead_letter_policy.dead_letter_topic
        try:
            commands.check_topic_exists(self.executor.state, dlt)
            stored = await self.executor.reader.messages_when_read(s.topic, nums)
            for key, request, count in commands.dead_letter_batches(s, nums, stored):
                await self.executor.publish_anywhere(dlt, request, count, key)  # (in a cluster: at its owner)
        except PigeonError as e:
            log.warning("dead-lettering %d messages of %s to %s failed: %s", len(nums), s.name, dlt, e.message)
            return
        if self.executor.state.subs_by_uid.get(s.uid) is s:  # not deleted while the publish waited
            self.ack(s, nums)
            await self.executor.durable(log_id=s.log_id)

    async def pull(self, name: str, max_messages: int, return_immediately: bool,
                   time_left_s: float | None = None) -> list[bytes]:
        """Messages to hand out, waiting for some while there are none: until shortly before the caller's
        deadline (`time_left_s`), at most limits.pull_wait_s_max. With nothing by then the answer is an empty
        list, which the caller sees as "no messages" rather than DEADLINE_EXCEEDED."""
        if max_messages <= 0:
            raise InvalidArgument("max_messages must be greater than 0.")
        s = self.executor.live_sub(name)
        s.last_activity = self.executor.clock.now()
        max_messages = min(max_messages, limits.pull_messages_max)
        wait = limits.pull_wait_s_max
        if time_left_s is not None:
            wait = min(wait, time_left_s - limits.pull_answer_before_deadline_s)
        loop = asyncio.get_running_loop()  # (its clock: virtual in the simulator, as the waits below are)
        give_up = loop.time() + wait
        while True:
            until = self.executor.clock.now() + s.ack_deadline_s
            out = self.deliver(s, max_messages, limits.response_bytes_max, None, s.ack_deadline_s)
            if out:
                self._pass_on(s)
                await self.recorded(s)
                if not self.lease_left(until, s.ack_deadline_s):
                    continue  # (its messages go out again as their leases run out)
                if s.transforms:  # subscription transforms (node.transforms): those filtered out are acked
                    out = await self.executor.transforms.deliver(self, s, out)
                if out:
                    return out
            left = give_up - loop.time()
            if return_immediately or left <= 0:
                return out
            await self._wait(s, left)
            s = self.executor.live_sub(name)

    async def _wait(self, s: SubscriptionState, cap: float, stream: Stream | None = None) -> None:
        """Wait for `s`'s messages (or `stream`'s own events), at most `cap` seconds; the subscription's
        timer wakes one waiter when something becomes ready by itself."""
        sig = self.executor.signal(s.uid)
        self.arm(s, sig)
        await sig.wait(cap, stream)

    def arm(self, s: SubscriptionState, sig: Signal) -> None:
        """Keep `sig`'s timer at the earliest time something of `s` becomes ready by itself."""
        d = s.next_deadline()
        if d is not None:
            sig.wake_at(asyncio.get_running_loop().time() + max(0.001, d - self.executor.clock.now()))

    def _pass_on(self, s: SubscriptionState) -> None:
        """A waiter took messages: if more are ready, wake the next one (the chain that replaces waking all)."""
        if s.has_ready(self.executor.clock.now()):
            sig = self.executor.signals.get(s.uid)
            if sig is not None:
                sig.notify()

    def open_stream(self, name: str, client_id: str, deadline_s: int, max_messages: int, max_bytes: int) -> Stream:
        s = self.executor.live_sub(name)
        commands.check_stream(deadline_s)
        self.executor.admission.open_stream()
        stream = Stream(s, client_id, deadline_s, max_messages, max_bytes)
        self.executor.streams.add(stream)
        return stream

    async def stream_next(self, stream: Stream) -> list[bytes] | None:
        """Wait until the stream may take messages and some are ready, or it has something in its outbox;
        return the messages (possibly none), or None once the client has half-closed. A subscription's transforms
        run on what goes out (node.transforms); when they filter out everything, the stream waits on."""
        while True:
            out = await self._stream_next(stream)
            if not out or not stream.sub.transforms:
                return out
            out = await self.executor.transforms.deliver(self, stream.sub, out)
            if out:
                return out

    async def _stream_next(self, stream: Stream) -> list[bytes] | None:
        s = stream.sub
        while True:
            self.executor.check_open()
            if stream.error is not None or stream.ended:
                self._pass_on(s)  # it may have been the waiter woken for messages: the next one takes them
                if stream.error is not None:
                    if stream.unsent and isinstance(stream.error, Unavailable):
                        out = await self._leased_before_the_end(stream)
                        if out is not None:
                            return out
                    raise stream.error
                return None
            if stream.outbox:
                return []
            if self.executor.state.subs_by_uid.get(s.uid) is not s:
                raise NotFound(f"Resource not found (resource={s.name.split('/')[-1]}).")
            if s.detached:
                raise FailedPrecondition(f"The subscription {s.name} is detached.")
            s.last_activity = self.executor.clock.now()  # an open stream keeps the subscription alive
            if stream.unsent:  # (a cluster) the oldest delivery goes out once its lease is recorded; meanwhile
                out, recording, until = stream.unsent[0]  # the next ones' leases go on their way
                if not recording.done():
                    if len(stream.unsent) < limits.stream_deliveries_ahead:
                        self._deliver_to(stream)
                        if stream.error is not None:
                            continue
                    if len(stream.unsent) < limits.stream_deliveries_ahead and stream.room() > 0:
                        # messages published meanwhile are leased as they come (their Deliver record rides
                        # with their Publish record), not once the oldest lease is recorded: a round trip less
                        await self._wait(s, limits.stream_idle_wake_s, stream)
                        continue
                    await asyncio.shield(recording)
                stream.unsent.popleft()
                recording.result()  # Unavailable: the bundle moved (its next owner holds the leases)
                if self.lease_left(until, stream.deadline_s):
                    return self._and_recorded_since(stream, out)
                continue  # (its messages go out again as their leases run out)
            if stream.room() > 0:
                out = self._deliver_to(stream)
                if out is not None:
                    return out
                if stream.error is not None:
                    continue
                if not stream.unsent:
                    await self._wait(s, limits.stream_idle_wake_s, stream)
                if hops.ON:
                    hops.mark("woken")
            else:  # flow control: only this stream's acks (or its own events) can change that
                await stream.wait(limits.stream_idle_wake_s)

    def _and_recorded_since(self, stream: Stream, out: list[bytes]) -> list[bytes]:
        """`out` and the stream's next deliveries whose leases are recorded by now too, as one response: gRPC writes
        a stream's responses one after the other, each once the one before is written, so on a busy owner each
        delivery recorded while one was being written waited for that write, and then for its own."""
        unsent, most = stream.unsent, limits.stream_response_messages_max
        while unsent:
            more, recording, until = unsent[0]
            if not recording.done() or recording.cancelled() or recording.exception() is not None or \
                    len(out) + len(more) > most:
                break  # (a failure is raised by the next call, as it was)
            unsent.popleft()
            if self.lease_left(until, stream.deadline_s):
                out = out + more
        return out

    def _deliver_to(self, stream: Stream) -> list[bytes] | None:
        """Lease what the stream may take now: the entries to send at once (one node), or None — nothing to
        send yet, or (in a cluster) a delivery queued in `stream.unsent` until its lease is recorded."""
        s = stream.sub
        room = stream.room()
        if room <= 0:
            return None
        try:
            out = self.deliver(s, min(room, limits.stream_response_messages_max),
                               max(1, min(stream.max_bytes - stream.held_bytes, self.executor.admission.share())),
                               stream, stream.deadline_s)
        except Unavailable as e:  # (a shard of its topic moved away: the stream ends, after what it leased before)
            stream.error = e
            return None
        if not out:
            return None
        self._pass_on(s)
        recording = self.recording(s, stream.wake)
        if recording is None:
            return out
        stream.unsent.append((out, recording, self.executor.clock.now() + stream.deadline_s))
        return None

    async def _leased_before_the_end(self, stream: Stream) -> list[bytes] | None:
        """A stream broken by a move (its subscription's bundle, or a shard of its topic, is another node's now —
        or on its way there): the oldest delivery it leased and has not sent, once its lease is recorded. That lease
        is in the log the next owner reads (a hand-over's image carries it), and nothing there sends the message
        before its deadline: sent now, its client acks it there at once, through the stream that follows the
        move. None once none is left. One whose record failed is not sent (its lease may not be in the log), nor
        one whose lease (nearly) ran out: they come again after their deadline, as any unacked message."""
        while stream.unsent:
            out, recording, until = stream.unsent.popleft()
            # (waited for no longer than the lease could still go out: a record the members do not answer —
            # cut off — does not hold up the stream's end)
            left = until - min(limits.lease_left_s_min, stream.deadline_s / 4) - self.executor.clock.now()
            try:
                await asyncio.wait_for(asyncio.shield(recording), max(0.0, left))
            except (PigeonError, asyncio.TimeoutError):
                continue
            if self.lease_left(until, stream.deadline_s):
                return out
        return None

    def close_stream(self, stream: Stream) -> None:
        """Messages it still holds stay leased until their deadline (the client may still ack them)."""
        stream.sub.disown(stream, list(stream.held))
        stream.held.clear()
        if stream in self.executor.streams:
            self.executor.streams.discard(stream)
            self.executor.admission.close_stream()

    def note_stalled_streams(self) -> int:
        """Log (once each) the streams whose client has left a response untaken past the stall limit: they hold
        that response until the client reads or goes (the server's keepalive closes a connection whose peer
        vanished; a live client that does not read keeps it). Their leases run out as any other's, so the
        messages go to other subscribers. Returns how many were found this time."""
        now = self.executor.clock.now()
        stalled = [st for st in self.executor.streams if st.sending_since is not None and not st.stall_noted
                   and now - st.sending_since > self.executor.admission.stall_s]
        for st in stalled:
            st.stall_noted = True
            log.warning("a StreamingPull client of %s (client id %r) has left a response of %d bytes untaken for "
                        "%.1f s; its stream holds it until the client reads or disconnects",
                        st.sub.name, st.client_id, st.sending_bytes, now - st.sending_since)
        self.executor.admission.stalled += len(stalled)
        return len(stalled)

    def ack_nowait(self, s: SubscriptionState, ack_ids) -> dict[str, str]:
        """Apply acks (logged, not yet durable). Returns exactly-once failures {ack_id: code}: with
        exactly-once delivery an ack id is valid only for the current, unexpired delivery."""
        now = self.executor.clock.now()
        s.last_activity = now
        nums, failures = commands.acks(s, ack_ids, now)
        self.ack(s, nums)
        return failures

    async def acknowledge(self, name: str, ack_ids) -> None:
        s = self.executor.live_sub(name)
        commands.require_ack_ids(ack_ids)
        failures = self.ack_nowait(s, ack_ids)
        await self.executor.durable(log_id=s.log_id)  # also covers an equal ack still in flight
        if failures:
            raise AckIdFailure(failures)

    async def modify_ack_deadline(self, name: str, ack_ids, seconds: int) -> None:
        """Answered once durable, as an ack is: a nack or an extension the client was told of survives a crash
        (delivery counts and lease deadlines after a restart are what the client saw)."""
        s = self.executor.live_sub(name)
        commands.require_ack_ids(ack_ids)
        failures = self.modify_deadlines(s, ack_ids, [seconds] * len(ack_ids))
        await self.executor.durable(log_id=s.log_id)
        if failures:
            raise AckIdFailure(failures)

    def modify_deadlines(self, s: SubscriptionState, ack_ids, seconds) -> dict[str, str]:
        """Extend or release (0) leases. Returns exactly-once failures {ack_id: code}."""
        now = self.executor.clock.now()
        s.last_activity = now
        recs, failures = commands.modacks(s, ack_ids, seconds, now)
        for rec in recs:
            self.executor.commit(rec)
        return failures

    def stream_acks(self, stream: Stream, ack_ids) -> tuple[asyncio.Future | None, dict[str, str]]:
        """Acks sent on a stream: (durability future with exactly-once delivery — the confirmation waits for
        it —, else None: the acks ride along with the next group commit; exactly-once failures)."""
        failures = self.ack_nowait(stream.sub, ack_ids)
        if not stream.sub.config.enable_exactly_once_delivery:
            return None, failures
        return asyncio.ensure_future(self.executor.durable(log_id=stream.sub.log_id)), failures


class _Unanswered:
    """A shard's batches whose publishers are not answered yet (their bases), and the highest end the shard's
    batches asked to show meanwhile."""

    __slots__ = ("bases", "wanted", "waiters")

    def __init__(self):
        self.bases: list[int] = []
        self.wanted = 0
        self.waiters: list[tuple[int, Callable[[], None]]] = []  # (offset, called once answered): a delivery of
        # the message at offset


def _mark_recording(recording: asyncio.Future, gate: Gate | None) -> None:
    """Hops of a cluster delivery: `leased` (its Deliver record appended), `lease-recorded` (held by Qa members),
    `answers-in` (its messages' publishers answered)."""
    hops.mark("leased")
    recording.add_done_callback(lambda _: hops.mark("lease-recorded"))
    if gate is None or not gate.answers:
        hops.mark("answers-in")
    else:
        gate.on_answers = lambda: hops.mark("answers-in")
