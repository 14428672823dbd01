"""Every limit in one place, units last. Owns the rule: no other module hard-codes a limit.
Pub/Sub's documented limits come first (https://cloud.google.com/pubsub/quotas#resource_limits), Pigeon's own after."""

from __future__ import annotations

# --- Pub/Sub v1 documented limits -------------------------------------------------------------
name_chars_min = 3
name_chars_max = 255
publish_messages_max = 1_000
publish_request_bytes_max = 10_000_000
message_data_bytes_max = 10_000_000
attributes_max = 100
attribute_key_bytes_max = 256
attribute_value_bytes_max = 1_024
ordering_key_bytes_max = 1_024
ack_deadline_s_min = 10
ack_deadline_s_max = 600
ack_deadline_s_default = 10
modify_deadline_s_max = 600
retention_s_min = 600
retention_s_max = 31 * 86_400
subscription_retention_s_default = 7 * 86_400
expiration_ttl_s_min = 86_400
expiration_ttl_s_default = 31 * 86_400
pull_messages_max = 1_000
ack_ids_per_request_max = 2_500
snapshot_lifetime_s_max = 7 * 86_400
snapshot_lifetime_s_min = 3_600
labels_max = 64
label_chars_max = 63
list_page_size_max = 1_000
list_page_size_default = 100
stats_page_size_max = 10_000  # pigeon.v1.Monitoring: subscriptions or topics with their figures per page
stats_page_size_default = 1_000
hot_keys_exported = 100  # /metrics: the hottest ordering keys over every topic, one series each
# quotas (Pub/Sub's defaults): a create past one is RESOURCE_EXHAUSTED naming it
topics_per_project_max = 10_000
subscriptions_per_project_max = 10_000
snapshots_per_project_max = 5_000
schemas_per_project_max = 10_000

# single message transforms (JavaScript UDFs): Pub/Sub's limits for UDFs on a topic or a subscription
transforms_per_resource_max = 5
transform_code_bytes_max = 20_000
transform_message_s_max = 0.5  # JavaScript time one message may take through a resource's transforms

# --- Pigeon's own -----------------------------------------------------------------------------
# JavaScript transforms run in one V8 isolate per node (node.transforms): a batch is one call, given the per-message
# time for each of its messages up to this much; its heap is capped; compiled chains kept (the oldest dropped past it)
transform_batch_s_max = 2.0
transform_heap_bytes_max = 256 << 20
transform_chains_max = 1_000
assert transform_message_s_max <= transform_batch_s_max

response_bytes_max = 4 * 1024 * 1024 - 64 * 1024  # stay under the client's default 4 MiB receive limit
grpc_receive_bytes_max = 20 * 1024 * 1024
shards_per_topic_max = 64
shards_per_topic_default = 4
shard_bits = 6  # message number = offset << shard_bits | shard
topic_offset_bits = 40  # message id = (topic uid << topic_offset_bits | offset) << shard_bits | shard
bundles_default = 16  # bundles (hash ranges of topic names, one log each) of a node or cluster
bundles_max = 4096
region_slots_default = 4  # regions a deployment of regions may hold (docs/regions.md): fixed by its first node
region_gateways_s = 2.0  # how often a region's node reads the other regions' gateways from the global store
region_gateway_ttl_s = 10  # a gateway's key outlives its node's last word to the global store this long
region_answer_s = 1.0  # a Pull's ask of another region that returns at once: no answer by then, no share of it
region_silent_s = 5.0  # … and the Pulls of the next this many seconds do not ask it (one then tries again)
region_reopen_s = 0.5  # a merge opens another region's stream again this long after it ended, at first …
region_reopen_s_max = 5.0  # … doubling up to this
copy_poll_s = 0.2  # a copy shard caught up with its region reads again this long after (the copy's lag, idle)
copy_floors_s = 1.0  # how often a copy follows its subscriptions' ack state in their region
copy_follow_calls = 16  # … asking about this many subscriptions at once
copy_retry_s = 1.0  # a copy whose region did not answer asks again this long after
copy_call_s = 10.0  # one call of the copier to another region
copy_read_bytes = 4 << 20  # what one read of a copy asks for at most
segment_bytes_max = 64 * 1024 * 1024
recovery_kept_bytes_max = 256 * 1024 * 1024  # journal segments recovery's first pass read, kept for its second
record_bytes_max = 16 * 1024 * 1024
# node to node (pigeon.v1.Storage): an Append request carries the entries queued meanwhile up to this many bytes
# (one entry always: a record is at most record_bytes_max), a Read answer as many as fit in it
storage_message_bytes_max = 4 * 1024 * 1024
append_requests_in_flight_max = 2  # Append requests to one member not yet answered (pigeon.node.replication)
replication_linger_s = 0.005  # an entry nobody waits for yet goes to its members at most this much later
# under load a node's replication round somebody waits for goes once the last is held by Qa members, and no later
# than this after it: what is appended meanwhile goes with it (pigeon.node.logs: fewer, fuller requests under load)
replication_round_s = 0.003
ledger_close_drain_s = 0.05  # a ledger closing waits this long at most for its members' copies of what it confirmed
group_commit_bytes_max = 8 * 1024 * 1024
checkpoint_wal_bytes_max = 256 * 1024 * 1024  # take a checkpoint after this much WAL
checkpoint_interval_s_max = 60.0
read_cache_bytes_max = 64 * 1024 * 1024
pull_wait_s_max = 10.0  # a Pull with nothing to deliver answers empty after this long at most
pull_answer_before_deadline_s = 0.5  # … or this long before the caller's deadline, so it sees no error
stream_outstanding_messages_default = 1_000
stream_response_messages_max = 1_000
stream_deliveries_ahead = 4  # deliveries of a stream whose leases are being recorded (a cluster) at once
lease_left_s_min = 1.0  # a delivery whose lease has less than this (or a quarter of it) left once its record is
#                         confirmed is not sent (a node paused past it: the log's next owner may have handed the
#                         messages out again, and had them acknowledged, meanwhile)
streams_max = 20_000  # StreamingPull streams open at once on a server
stream_unsent_bytes_max = 256 * 1024 * 1024  # responses on their way to clients, shared fairly by open streams
shutdown_grace_s = 2.0  # on SIGTERM, calls in flight get this long to finish before they are cancelled
shutdown_goaway_s = 0.1  # … and open streams are ended this long after the GOAWAY, once their clients have it
stream_write_stall_s = 60.0  # a response its client leaves untaken this long is logged (the client may be stuck)
keepalive_s = 60.0  # the server pings an idle connection this often…
keepalive_timeout_s = 20.0  # … and closes it (with its streams) when the ping is not answered within this long
# Calls that reached gRPC and wait for the event loop to take them (grpc.aio takes one at a time). Past gRPC's own
# bounds (1,000, then refused at random up to 3,000) a call ends CANCELLED, a status its client cannot tell from a
# cancel of its own and that no server log shows: a burst of stream opens, or publishes while the loop is saturated,
# were lost that way. Pigeon's limits (streams_max, publish_pending_bytes_max, quotas) refuse with a status that says
# why; these only bound gRPC's queue (a waiting call also ends after 30 s unserved, gRPC's default).
grpc_waiting_calls_soft = 50_000
grpc_waiting_calls_max = 100_000
# asks for the next call of each hot method kept outstanding beside grpc.aio's one (pigeon.api.takers): a busy loop
# starts up to this many calls of a method per turn instead of one per ~5 turns
grpc_call_takers = 8
publish_pending_bytes_max = 256 * 1024 * 1024  # publishes accepted and not yet durable, in all
stream_idle_wake_s = 10.0  # a waiting stream looks again at least this often (every change wakes it at once)
lease_tick_s = 0.05
idempotency_window_s_default = 15 * 60.0
idempotency_key_bytes_max = 1_024
lock_s_max = 31 * 86_400.0  # queue extension: Take may lock for this long
retention_tick_s = 5.0

# the journal (node.journal_writer, storage.journal) and the files it writes
lazy_write_s = 0.002  # the longest an entry nobody waits for stays unwritten (a kill -9 would lose it)
lazy_flush_s = 0.01  # fsync=always: the longest a written entry nobody waits for stays without fdatasync
batch_sync_s = 0.005  # fsync=batch: the longest a written entry waits for its fdatasync
commit_tell_asks = 2  # asks since a batch was taken from which its group commit leaves the telling to the caller
gather_bytes_min = 64 * 1024  # an entry this big is written from its parts, not copied into one record first
segment_reserve_bytes = 4 * 1024 * 1024  # the active segment is allocated this far ahead of a small write …
reserved_write_bytes_max = 64 * 1024  # … for a write up to this size (a bigger one appends)
drop_pages_bytes = 8 << 20  # a cold file's pages are dropped once this much was written through it since the last time
read_ahead_bytes = 32 * 1024 * 1024  # how far ahead of a reader of the journal its pages are fetched …
read_ahead_chunk_bytes = 1024 * 1024  # … in reads of this size
read_ahead_idle_s = 0.05  # with nothing readable yet (not durable), the read-ahead looks again after this
malloc_mmap_threshold_bytes = 32 << 20  # allocations below this come from the heap (glibc's bound on 64-bit) …
malloc_trim_threshold_bytes = 64 << 20  # … and freed heap up to this is kept for reuse
compiled_schemas_max = 128  # protocol buffer schemas kept compiled
protoc_s_max = 30.0  # compiling a protocol buffer schema with protoc

# a full disk: publishes are refused while less than the reserve is free, so deliveries, acks and checkpoints
# (which let consumers drain the backlog and old segments go) can still be written
disk_reserve_fraction = 0.02  # of the filesystem…
disk_reserve_bytes_min = 8 * 1024 * 1024  # … but at least this
disk_reserve_bytes_max = 1024 * 1024 * 1024  # … and at most this
disk_free_check_s = 0.1  # free space is looked up at most this often (one statvfs)
disk_full_retry_s = 0.5  # after ENOSPC the writer tries again this often, keeping what it could not write
resources_per_server_max = 200_000  # topics, subscriptions, snapshots and schemas of every project together
probe_setup_s = 10.0  # creating the probe's topic and subscription: longer, and the target is not serving
certificate_days = 825  # `pigeon certs`: the longest validity browsers and most TLS stacks accept for a leaf
cli_connect_s_max = 3.0  # the command line says "cannot reach" when no server answers within this long

# push delivery
push_window_start = 1
push_window_max = 100  # requests in flight per subscription
push_backoff_s_min = 0.1
push_backoff_s_max = 60.0
push_wait_s_max = 1.0  # an idle worker looks at its subscription at least this often
push_connections_max = 1_000  # sockets open across every push subscription
push_response_bytes_max = 64 * 1024  # read (and dropped) from an answer so the connection can be reused
oidc_token_lifetime_s = 3_600
oidc_token_reuse_s_min = 300  # a cached token is reused while it has at least this long to live
# range reads (pigeon.v1.Ranges)
range_messages_default = 10_000
range_messages_max = 100_000
range_bytes_default = 4 * 1024 * 1024
range_bytes_max = 16 * 1024 * 1024  # one message (≤ 10 MB) always fits under the send limit too
# filters and schemas (documented by Pub/Sub)
filter_bytes_max = 256
schema_definition_bytes_max = 300 * 1024

assert 1 << shard_bits >= shards_per_topic_max
assert 1 <= push_window_start <= push_window_max
assert 0 < push_backoff_s_min <= push_backoff_s_max
assert oidc_token_reuse_s_min < oidc_token_lifetime_s
assert message_data_bytes_max <= range_bytes_max
assert range_bytes_max + 1024 * 1024 <= grpc_receive_bytes_max
assert streams_max < grpc_waiting_calls_soft <= grpc_waiting_calls_max
assert range_messages_default <= range_messages_max
assert publish_request_bytes_max + 1024 * 1024 <= record_bytes_max
assert record_bytes_max <= segment_bytes_max
assert record_bytes_max + 64 * 1024 <= grpc_receive_bytes_max  # one entry with its request's fields
assert storage_message_bytes_max + 64 * 1024 <= grpc_receive_bytes_max
assert publish_request_bytes_max <= grpc_receive_bytes_max
assert ack_deadline_s_min <= ack_deadline_s_default <= ack_deadline_s_max
assert snapshot_lifetime_s_min < snapshot_lifetime_s_max

# --- cluster (docs/cluster.md) -------------------------------------------------------------------------
session_ttl_s_default = 2  # a node whose session lease is not renewed this long is gone: its bundles move
session_ttl_s_min = 2
session_ttl_s_max = 60
session_beat_s = 0.25  # a node's event loop tells its session's thread that it runs this often …
session_stall_s = 5.0  # … and one that has not for this long is let go (its session runs out: node.meta_etcd)
recovery_ended_s = 0.25  # a ledger's member whose session ended and that has not answered a recovery by then is gone
workers_max = 64  # `pigeon serve --workers N`: worker processes behind one port (pigeon.ops.workers)
worker_stop_s = shutdown_grace_s + 10.0  # a worker still running this long after SIGTERM is killed
worker_restart_s_max = 5.0  # a worker that exited is started again after at most this long (backing off)
etcd_retry_s_max = 5.0  # an unreachable etcd is tried again at most this far apart
slow_request_s = 1.0  # a call (but one that waits by design) slower than this gets a log line with its duration
rest_body_bytes_max = 16 * 1024 * 1024  # a REST request body (a 10 MB publish is about 13.4 MB as base64 JSON)
forward_s_max = 5.0  # a forwarded call (but a Pull, which waits by design) not answered by then is UNAVAILABLE
refusal_log_s = 10.0  # calls about a log refused (UNAVAILABLE: no owner) this long: said in the log, then as often
cut_off_probe_s = 1.0  # a node whose writes every peer failed asks each this long for an answer before it steps down
peer_refusals = 3  # a peer that refused this many connections in a row … is gone: its session ends
peer_refusal_interval_s = 0.02  # … this far apart (only a port nothing listens on refuses: a live node never does)
member_silence_s = 5.0  # a ledger member that answers none of the entries sent to it this long has failed (a cut-off
#                        peer takes no entries and refuses none: without this its writer would wait for it forever)
peer_connect_s = 1.0  # a connection attempt to a peer that takes longer tells nothing
placement_check_s = 1.0  # a node compares what it owns with placement at least this often
merge_steer_s = 0.25  # a merged StreamingPull of a spread topic moves its client's flow control to the owners whose
#                       shards deliver this often (api.merge.demand_shares)
merge_reopen_s = 0.05  # … replaces an owner's stream that ended (its shards moved) this long after, at first …
merge_reopen_s_max = 2.0  # … doubling up to this …
merge_reopen_quiet_s = 10.0  # … while each came within this of the one before
merge_resend_s = 2.0  # acks and deadline changes a replaced stream took this long before it ended go again to their
#   shards' owners (it may not have applied them: an owner handing the shard over refuses them, ending the stream)
load_balance_s_default = 30.0  # the placement planner looks at the bundles' loads this often (0: never)
load_balance = 1.25  # … and moves bundles once the busiest node carries more than this times the average load …
load_floor_cores = 0.1  # … and at least this much CPU (an idle cluster never shuffles) …
load_moves_max = 2  # … this many at most a period (a move costs its bundle's callers a takeover's pause)
load_entry_units = 8  # a bundle's share of its node's CPU is reckoned from its appends: an entry weighs as much …
load_kib_units = 1  # … as 8 KiB of them (an entry's fixed cost against its bytes' in the loop)
load_unit_s_max = 0.001  # a unit costs the loop far less: CPU beyond this a unit is the node's own (its start, the
#                          storage role), not shared out to the few bundles that appended meanwhile
storage_call_s = 10.0  # one call of a peer's storage service (fence, read, delete)
etcd_call_s = 5.0  # one etcd call
store_check_s = 1.0  # a roll of a log's own accord (a snapshot, a wider ensemble) starts only once etcd answered a
#                      read within this long: the log's appends wait from the roll's start until the next ledger is
#                      written in etcd
append_connect_s = 10.0  # to reach a member's append channel (a cut-off one is never answered)
append_scratch_bytes = 64 * 1024  # append channel frames that fit are read several at a time into one buffer
metadata_watch_history_max = 10_000  # changes of the embedded metadata store a watch may start behind the present
log_read_entries_max = 512  # entries per Read call when a bundle log is read back, at most, and about …
log_read_bytes = 8 << 20  # … this many bytes: the first call asks for log_read_first_entries, later ones as many
log_read_first_entries = 16  # as the entries so far average to log_read_bytes (a read of one's own copy holds the loop)
etcd_compact_s = 300.0  # etcd forgets the history older than this, twice over (a watch that far behind lists again)
stray_check_s = 60.0  # a storage member looks for ledgers no list names (deleted while it was away) this often
repair_check_s = 30.0  # a repair pass at least this often even when nothing it depends on changed
log_ledgers_snapshot = 8  # a log listing more ledgers than this gets a snapshot (then a cut) though little was written
loop_slice_bytes = 1 << 20  # a read of a ledger this node holds lets the event loop serve others after this much
cold_read_bytes = 1 << 20  # where a ledger's entries are not in the page cache, a thread reads this much into it
own_positions_checkpoint_bytes = 64 << 20  # an owner writes where its own ledgers' entries lie after this much journal
fetch_bytes = 4 << 20  # one read of a batch named by a log address (core.bundles) and the entries after it, about
fetch_ahead = 4  # … and the reads of as many ranges ahead at once, once a reader gets to a range (≤ ¼ of the cache each)
fetch_tries = 3  # reads of a batch from its ledger in a row before a caller is answered UNAVAILABLE (core.bundles)
fetch_retry_s = 0.5  # after a failed read of a batch from its ledger, before delivery tries again
ledger_retry_s = 0.5  # between attempts of a takeover or a roll that could not finish (etcd or members unreachable)
handover_retry_s = 0.5  # between attempts of a shard's hand-over whose new home has no owner or does not answer
release_wait_s_max = 5.0  # how long a bundle given up waits for its records in flight to be confirmed
quota_share_floor = 0.25  # a node's part of a quota is at least this share of an equal part (its first calls pass)
# a peer or an etcd member that was down is dialled again at most this long after it is back (gRPC's own backoff
# grows to 120 s, and a channel waiting to dial again fails every call at once with the last error it saw)
reconnect_s_min = 0.1
reconnect_s_max = 0.5

# --- security (docs/security.md) ---------------------------------------------------------------------------
token_cache_max = 100_000  # verified credentials remembered (hash → principal, expiry): a call costs a lookup
decision_cache_max = 100_000  # (principal, permission, resource) → allowed, kept until the policies change
jwt_leeway_s = 30  # clock skew allowed between the token's issuer and this node (exp, nbf, iat)
jwks_refresh_s = 300.0  # an issuer's JWKS URL is read again this often (keys rotate: new ones appear first)
security_watch_s = 1.0  # open streams are checked again (policies changed, token file changed) this often
quota_report_projects_max = 5_000  # projects in a node's report of what was asked of the quotas (the busiest)
quota_burst_s = 0.1  # publish throughput: a project's bucket holds this many seconds of its rate …
quota_retry_s_min = 0.1  # … and a refusal's retry hint is at least this (a client waiting it out sends ≤ 10/s)
admin_quota_window_s = 60.0  # admin operations are metered over this window
quota_refusal_hold_s_max = 1.0  # a call refused by a quota is answered when its retry hint is due, at most this late
assert 0 < reconnect_s_min <= reconnect_s_max < session_ttl_s_min
assert log_read_first_entries <= log_read_entries_max
assert fetch_bytes * fetch_ahead * 2 <= read_cache_bytes_max  # a range read ahead is not dropped before it is read
assert reserved_write_bytes_max <= segment_reserve_bytes <= segment_bytes_max
assert lazy_write_s <= lazy_flush_s
assert 0 <= replication_round_s <= replication_linger_s
assert 0 < quota_share_floor <= 1
assert 0 < security_watch_s <= 5.0  # revocation reaches open streams "within seconds"
