"""Configuration. Owns the rule: settings come from (in rising priority) an optional TOML file, PIGEON_*
environment variables and command-line flags, parsed once into a frozen Config; no other module reads
the environment."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass

from pigeon.core import limits
from pigeon.ops import etcd_access


@dataclass(frozen=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8085
    data_dir: str = "./data"
    fsync: str = "always"  # always | batch | never (see README, "Durability")
    shards_per_topic: int = limits.shards_per_topic_default
    topic_layout: str = "together"  # together | spread: a new topic's shards in its one bundle, or a bundle each
    #                                 (docs/cluster.md, "Scale-out": a spread topic spans a cluster's nodes)
    bundles: int = limits.bundles_default  # logs of topic data (hash ranges of topic names): fixed per data dir
    region: str = ""  # a cluster node's region (docs/regions.md): its cluster is one region of a deployment
    global_etcd: str = ""  # the etcd a deployment's regions share (its metadata log, the region registry)
    region_slots: int = limits.region_slots_default  # regions a deployment may have: fixed by its first node
    segment_bytes: int = limits.segment_bytes_max  # the journal is written in segment files of this size at most
    checkpoint_interval_s: float = limits.checkpoint_interval_s_max  # seconds between checkpoints, at most
    checkpoint_wal_bytes: int = limits.checkpoint_wal_bytes_max
    log_level: str = "INFO"
    idempotency_window_s: float = limits.idempotency_window_s_default  # seconds a pigeon-idempotency-key is remembered
    push_allowed_endpoints: str = ""  # comma-separated URL prefixes push may reach; empty: any http(s) URL
    export_root: str = ""  # export subscriptions (cloud_storage_config, bigquery_config) are run by this node, writing
    #                        under this directory (pigeon.node.exports; docs/spark.md); "": they are not run here
    export_master: str = "local[*]"  # the export job's Spark master: local[N], spark://host:port, yarn, k8s://…, or
    #                                  sc://host:port (Spark Connect)
    push_signing_key: str = ""  # the RSA key push OIDC tokens are signed with: a PEM file or a service-account JSON
    #                             key file ("": one made and kept in the data dir); its public key is served at
    #                             /.well-known/jwks.json on the HTTP port (docs/security.md, "Push authentication")
    # quotas: what one project may hold, and every project together (docs/reference.md, "Limits")
    topics_per_project: int = limits.topics_per_project_max  # topics one project may have
    subscriptions_per_project: int = limits.subscriptions_per_project_max  # subscriptions one project may have
    snapshots_per_project: int = limits.snapshots_per_project_max  # snapshots one project may have
    schemas_per_project: int = limits.schemas_per_project_max  # schemas one project may have
    resources_per_server: int = limits.resources_per_server_max
    # what clients may hold of the server's memory at once (docs/reference.md, "Limits")
    streams_max: int = limits.streams_max
    stream_unsent_bytes: int = limits.stream_unsent_bytes_max
    stream_write_stall_s: float = limits.stream_write_stall_s
    publish_pending_bytes: int = limits.publish_pending_bytes_max
    log_format: str = "text"  # text | json (one JSON object per line: time, level, logger, message)
    metrics_top: int = 500  # /metrics: per-subscription (and per-topic) series for this many, the largest backlogs
    http_port: int = -1  # REST API, /metrics, health checks: -1 = the gRPC port + 1 (8086 beside 8085), 0 = off
    # cluster (docs/cluster.md): without `etcd` the node is the embedded single node
    etcd: str = ""  # comma-separated etcd endpoints (host:port, http://host:port, or https://host:port: TLS)
    etcd_ca: str = ""  # TLS to etcd: the CA that signed etcd's certificate (default: the system's roots)
    etcd_cert: str = ""  # this node's client certificate for etcd (what etcd's --client-cert-auth asks for)
    etcd_key: str = ""  # its PEM private key
    node_id: str = ""  # this node's id in the cluster (one live node per id)
    advertise: str = ""  # host:port clients (and, without a peer port, peers) reach this node at (default host:port)
    peer_port: int = 0  # a port of its own for node-to-node calls (0: none, peers use the client port as clients do)
    peer_host: str = ""  # the interface the peer port and the append channel listen on ("": `host`): the nodes'
    #                      network apart from the clients'; peers dial it unless it is a wildcard (0.0.0.0, ::)
    append_port: int = 0  # the append channel, replication's bytes without gRPC (pigeon.node.append_channel): 0 any
    #                       free port (peers learn it from etcd), -1 none (appends go over gRPC); mutual TLS when
    #                       secured
    zone: str = ""  # ensembles span distinct zones when nodes carry them
    machine: str = ""  # the machine this node shares with others: an ensemble takes one node of a machine at most
    #                    (the supervisor of `--workers N --etcd` sets it for its workers; "": the node is its own)
    workers: int = 1  # worker processes behind the one port (pigeon.ops.workers): 1 is the single process; N > 1
    #                   N cluster nodes on this machine, their journals under the data dir: with an etcd of their
    #                   own, or with --etcd nodes <node id>.w<i> of that cluster
    reuse_port: bool = False  # share the client and HTTP ports with other processes (SO_REUSEPORT): a worker's
    #                           (the supervisor sets it; the kernel spreads the connections over the workers)
    own_http_port: int = 0  # a worker's HTTP port of its own besides the shared one: /metrics of that worker
    session_ttl_s: int = limits.session_ttl_s_default  # a node silent this long is gone: its bundles move
    load_balance_s: float = limits.load_balance_s_default  # how often the planner moves bundles by load (0: never)
    replicas: int = 3  # E = Qw: the storage nodes that hold each ledger of a bundle log
    ack_quorum: int = 2  # Qa: how many of them hold a record durably before it is answered
    log_snapshot_entries: int = 20_000  # a bundle log's owner writes its state into the log this often (entries)
    log_snapshot_bytes: int = 16 << 20  # … or this often (bytes): a takeover reads the log from the latest snapshot,
    #                                     so at most this much besides the bundle's state
    log_snapshot_s: float = 300.0  # … and at least this often (seconds), however little was written: a storage
    #                                member's journal is shared by every ledger it holds, so an entry kept pins
    #                                every segment after it — a quiet log's ledger must move on, and be cut, too
    # security (docs/security.md): all off by default, which is allowed only while every listener is on loopback
    tls_cert: str = ""  # PEM certificate chain the gRPC and HTTP ports (and node-to-node calls) present
    tls_key: str = ""  # its PEM private key
    tls_client_ca: str = ""  # mutual TLS: every client (and, without a peer port, peer node) presents a certificate
    #                          this CA signed
    peer_cert: str = ""  # the node certificate the peer port presents and peer calls carry (default: tls_cert)
    peer_key: str = ""  # its PEM private key (default: tls_key)
    peer_ca: str = ""  # the cluster's CA: the peer port requires node certificates it signed (default: tls_client_ca)
    auth_token_file: str = ""  # bearer tokens: lines "sha256:<hex of the token> <principal>" (`pigeon tokens`)
    oidc_issuer: str = ""  # OIDC/JWT access tokens: the `iss` they must carry…
    oidc_audience: str = ""  # … the `aud` they must carry…
    oidc_jwks: str = ""  # … and the issuer's keys: a JWKS file or an https URL
    admins: str = ""  # comma-separated principals holding every permission on everything (the bootstrap)
    metrics_readers: str = ""  # on a node that authenticates, who besides the admins may read /metrics
    #                            (comma-separated principals; allAuthenticatedUsers: any caller it knows; allUsers:
    #                            anyone, as without authentication)
    insecure: bool = False  # serve a non-loopback address without authentication or TLS, knowingly
    audit_log: str = ""  # JSON lines of admin changes and denied calls: a file, or "" for the log (pigeon.audit)
    # per-project quotas (0: none beyond the limits above); past one: RESOURCE_EXHAUSTED with a QuotaFailure
    publish_bytes_per_s: int = 0  # publish throughput of one project
    admin_ops_per_min: int = 0  # admin operations (creates, updates, deletes, policies) of one project
    backlog_bytes_per_project: int = 0  # unacknowledged bytes retained for one project's subscriptions

    def __post_init__(self):
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json (got {self.log_format!r})")
        if self.fsync not in ("always", "batch", "never"):
            raise ValueError(f"fsync must be always, batch or never (got {self.fsync!r})")
        if self.topic_layout not in ("together", "spread"):
            raise ValueError(f"topic_layout must be together or spread, not {self.topic_layout!r}")
        if not 1 <= self.shards_per_topic <= limits.shards_per_topic_max:
            raise ValueError(f"shards_per_topic must be in 1..{limits.shards_per_topic_max}")
        if not 1 <= self.bundles <= limits.bundles_max:
            raise ValueError(f"bundles must be in 1..{limits.bundles_max}")
        if not limits.record_bytes_max <= self.segment_bytes:
            raise ValueError(f"segment_bytes must be at least {limits.record_bytes_max}")
        if not 1 <= self.workers <= limits.workers_max:
            raise ValueError(f"--workers must be in 1..{limits.workers_max} (got {self.workers})")
        if self.workers > 1 and self.etcd and len(f"{self.node_id}.w{self.workers - 1}") > 63:
            raise ValueError(f"node id {self.node_id!r} with --workers {self.workers}: its workers are nodes "
                             f"{self.node_id}.w0.., which must fit in 63 characters")
        if self.workers > 1 and self.peer_port:
            raise ValueError("--peer-port is a cluster node's: the workers of --workers N get peer ports of their own "
                             "from the supervisor")
        if self.workers > 1 and not self.etcd and (self.peer_cert or self.peer_key or self.peer_ca):
            raise ValueError("--peer-cert, --peer-key and --peer-ca are a cluster node's: the workers of --workers N "
                             "get node certificates of their own from the supervisor (with --etcd, the machine's "
                             "node certificate serves its workers)")
        if "://" in self.export_root:
            raise ValueError(f"--export-root must be a directory (got {self.export_root!r}): object stores (s3://, "
                             "gs://) are not supported; mount one, or run `pigeon export` with a Spark that has it")
        if (self.region or self.global_etcd) and not (self.region and self.global_etcd and self.etcd):
            raise ValueError("a region's node needs --region (its name), --global-etcd (the etcd its regions share) "
                             "and --etcd (its region's own)")
        if self.region and not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", self.region):
            raise ValueError(f"region {self.region!r}: 1 to 63 lowercase letters, digits or '-', starting with a "
                             "letter")
        if self.region and not 1 <= self.region_slots <= limits.shards_per_topic_max // self.shards_per_topic:
            raise ValueError(f"region_slots × shards_per_topic must be at most {limits.shards_per_topic_max} (a "
                             f"topic has shards_per_topic shards in every region slot): got {self.region_slots} × "
                             f"{self.shards_per_topic}")
        if self.global_etcd:
            etcd_access.parse(self.global_etcd, self.etcd_ca, self.etcd_cert, self.etcd_key)
        if self.etcd and not self.node_id:
            raise ValueError("a cluster node needs --node-id (its name in the cluster) along with --etcd")
        if self.node_id and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", self.node_id):
            raise ValueError(f"node id {self.node_id!r}: 1 to 63 letters, digits, '.', '_' or '-', starting with a "
                             "letter or digit")
        if self.etcd:
            etcd_access.parse(self.etcd, self.etcd_ca, self.etcd_cert, self.etcd_key)
        elif self.etcd_ca or self.etcd_cert or self.etcd_key:
            raise ValueError("--etcd-ca, --etcd-cert and --etcd-key secure the connection to etcd: give --etcd too")
        if self.etcd and self.port == 0 and not self.advertise:
            raise ValueError("a cluster node on a port chosen by the system needs --advertise HOST:PORT")
        if not 1 <= self.ack_quorum <= self.replicas or 2 * self.ack_quorum <= self.replicas:
            raise ValueError(f"the ack quorum must be a majority of the replicas and at most all of them (got "
                             f"replicas={self.replicas}, ack_quorum={self.ack_quorum})")
        if self.load_balance_s and not 1.0 <= self.load_balance_s <= 3600.0:
            raise ValueError("load_balance_s must be 0 (off) or in 1..3600")
        if not limits.session_ttl_s_min <= self.session_ttl_s <= limits.session_ttl_s_max:
            raise ValueError(f"session_ttl_s must be in {limits.session_ttl_s_min}..{limits.session_ttl_s_max}")
        self._check_security()

    def _check_security(self) -> None:
        """The loopback rule: without authentication (and TLS to carry credentials) a node serves only loopback,
        unless `insecure` says otherwise out loud."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca and not self.tls_cert:
            raise ValueError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if self.oidc_jwks and not (self.oidc_issuer and self.oidc_audience):
            raise ValueError("--oidc-jwks needs --oidc-issuer and --oidc-audience (the iss and aud tokens carry)")
        if (self.oidc_issuer or self.oidc_audience) and not self.oidc_jwks:
            raise ValueError("--oidc-issuer/--oidc-audience need --oidc-jwks (the issuer's keys)")
        self._check_peers()
        for q in ("publish_bytes_per_s", "admin_ops_per_min", "backlog_bytes_per_project"):
            if getattr(self, q) < 0:
                raise ValueError(f"{q} must be 0 (no quota) or more")
        open_to = [h for h in self.listeners if not loopback(h)]
        if self.insecure or not open_to:
            return
        if not self.authenticated:
            raise ValueError(f"refusing to serve {open_to[0]} (not loopback) without authentication: give "
                             "--auth-token-file, --oidc-jwks or --tls-client-ca, or --insecure to serve it open")
        if not self.tls_cert:
            raise ValueError(f"refusing to take credentials in the clear on {open_to[0]} (not loopback): give "
                             "--tls-cert and --tls-key, or --insecure")

    def _check_peers(self) -> None:
        """A secured cluster's nodes prove to each other that they are nodes with node certificates (mutual TLS)
        before a forwarded caller's identity is believed: on the shared port that makes every client present a
        certificate too; a peer port asks it of peers only."""
        if self.peer_port and not self.etcd:
            raise ValueError("--peer-port is a cluster node's (node-to-node calls): give --etcd and --node-id")
        if not 0 <= self.peer_port <= 65535 or self.peer_port and self.peer_port == self.port:
            raise ValueError(f"--peer-port must be a port of its own, not the client port (got {self.peer_port})")
        if self.peer_host and not self.peer_port and self.workers == 1:  # (workers get peer ports of their own)
            raise ValueError("--peer-host is where the peer port listens: give --peer-port too")
        if not -1 <= self.append_port <= 65535 or self.append_port > 0 and self.append_port in (
                self.port, self.peer_port, self.http_port):
            raise ValueError(f"--append-port must be a port of its own, 0 (any free one) or -1 (none); got "
                             f"{self.append_port}")
        if bool(self.peer_cert) != bool(self.peer_key):
            raise ValueError("--peer-cert and --peer-key go together")
        if (self.peer_cert or self.peer_ca) and not self.peer_port:
            raise ValueError("--peer-cert, --peer-key and --peer-ca are the peer port's: give --peer-port")
        if not (self.etcd and self.secured):
            if self.peer_cert or self.peer_ca:
                raise ValueError("--peer-cert and --peer-ca secure the peer port of a secured node: give --tls-cert "
                                 "and --tls-key (and a way to authenticate) too")
            return
        if not self.peer_port and not self.tls_client_ca:
            raise ValueError("a cluster node with TLS or authentication needs --tls-client-ca (the cluster's CA): "
                             "peers prove they are nodes with node certificates before a forwarded caller's "
                             "identity is trusted. Or give --peer-port and --peer-ca: node certificates are then "
                             "asked for on the peer port only, and clients need none")
        if self.peer_port and not (self.node_cert and self.cluster_ca):
            raise ValueError("a secured cluster node's peer port needs its node certificate (--peer-cert and "
                             "--peer-key, or --tls-cert and --tls-key) and the cluster's CA (--peer-ca, or "
                             "--tls-client-ca)")

    @property
    def node_cert(self) -> str:
        """The certificate this node proves it is a node with (on the peer port and on its calls to peers)."""
        return self.peer_cert or self.tls_cert

    @property
    def node_key(self) -> str:
        return self.peer_key or self.tls_key

    @property
    def cluster_ca(self) -> str:
        """The CA whose node certificates this node trusts as peers."""
        return (self.peer_ca or self.tls_client_ca) if self.peer_port else self.tls_client_ca

    @property
    def peer_listen_host(self) -> str:
        """The interface the peer port and the append channel listen on."""
        return self.peer_host or self.host

    @property
    def peer_address(self) -> str:
        """Where peers dial this node: the peer port on `peer_host`, or on the advertised host when that is not
        given or a wildcard ("" without a peer port: peers use `address`, as clients do)."""
        if not self.peer_port:
            return ""
        if self.peer_host and self.peer_host not in _WILDCARDS:
            return f"{self.peer_host}:{self.peer_port}"
        return f"{self.address.rpartition(':')[0]}:{self.peer_port}"

    @property
    def append_channel(self) -> bool:
        """Whether this node opens an append channel (a cluster node; a secured one's speaks mutual TLS)."""
        return bool(self.etcd) and self.append_port >= 0

    @property
    def listeners(self) -> tuple[str, ...]:
        """The hosts this node listens on (the gRPC and the HTTP port share the host; the peer port and the append
        channel listen on `peer_host` when it is given)."""
        return tuple(dict.fromkeys(h for h in (self.host, self.peer_host) if h))

    @property
    def authenticated(self) -> bool:
        """Whether callers must prove who they are (any way in configured)."""
        return bool(self.auth_token_file or self.oidc_jwks or self.tls_client_ca)

    @property
    def secured(self) -> bool:
        """Whether anything of security is on: the embedded default (off) keeps today's code path exactly."""
        return self.authenticated or bool(self.tls_cert)

    @property
    def admin_principals(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.admins.split(",") if p.strip())

    @property
    def metrics_principals(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.metrics_readers.split(",") if p.strip())

    @property
    def address(self) -> str:
        """Where clients reach this node (and peers, when it has no peer port)."""
        return self.advertise or f"{self.host}:{self.port}"


_WILDCARDS = ("0.0.0.0", "::", "[::]")  # (listening on every interface: peers dial the advertised host)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def load(file: str | None = None, env: dict[str, str] | None = None, **flags) -> Config:
    """Merge file, environment (PIGEON_<FIELD>) and flags (None means unset)."""
    values: dict = {}
    if file:
        with open(file, "rb") as f:
            values.update(tomllib.load(f))
    env = os.environ if env is None else env
    fields = {f.name: f for f in dataclasses.fields(Config)}
    for name, f in fields.items():
        raw = env.get(f"PIGEON_{name.upper()}")
        if raw is not None:
            values[name] = _bool(raw) if type(f.default) is bool else type(f.default)(raw)
    values.update({k: v for k, v in flags.items() if v is not None})
    unknown = set(values) - set(fields)
    if unknown:
        raise ValueError(f"unknown settings: {sorted(unknown)}")
    return Config(**values)
