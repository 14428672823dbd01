"""`pigeon serve`: its options, declared once here, and how a server starts from them. A server's start is what
every restart waits for, so `pigeon serve` is parsed here with argparse, without importing the rest of the command
line (typer builds its options through pydantic on its first parse, a noticeable part of a start);
pigeon.cli.main registers the same options as a typer command, for `pigeon --help` and `pigeon serve --help`."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    name: str  # the setting's name (pigeon.ops.config.load's keyword)
    kind: type  # str, int or bool (a flag)
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


DOC = """Start a node: on its embedded defaults one process with one data directory; with --etcd a member of a
    cluster (docs/cluster.md)."""

OPTIONS = (
    Option("host", str, 'address to listen on (default 127.0.0.1)'),
    Option("port", int, 'port (default 8085)'),
    Option("data_dir", str, 'data directory (default ./data)'),
    Option("fsync", str, 'always | batch | never (default always)'),
    Option("shards_per_topic", int, 'shards of each new topic'),
    Option("topic_layout", str, "together | spread: a new topic's shards in one bundle (one owner), or each in a "
                                "bundle of its own (a cluster's nodes share it) (default together)"),
    Option("config", str, 'TOML settings file'),
    Option("log_level", str, 'DEBUG, INFO, WARNING, ERROR'),
    Option("etcd", str, 'join a cluster: comma-separated etcd endpoints (http://127.0.0.1:2379; https:// for TLS)'),
    Option("etcd_ca", str, "TLS to etcd: the CA that signed etcd's certificate (default: the system's roots)"),
    Option("etcd_cert", str, "TLS to etcd: this node's client certificate (etcd's --client-cert-auth)"),
    Option("etcd_key", str, 'its PEM private key'),
    Option("node_id", str, "this node's id in the cluster"),
    Option("advertise", str, 'HOST:PORT clients (and peers, without --peer-port) reach this node at (default '
                             '--host:--port)'),
    Option("peer_port", int, "cluster: a port of its own for node-to-node calls (on --peer-host, else on --advertise's "
                             "host); secured, it asks node certificates of peers and the client port asks none of "
                             "clients (default: none)"),
    Option("peer_host", str, "cluster: the interface the peer port and the append channel listen on, apart from the "
                             "clients' (default --host); peers dial it unless it is 0.0.0.0 or ::"),
    Option("append_port", int, 'cluster: the port peers send replicated records to without gRPC (default 0: any free '
                               'one, announced in etcd; -1: none, over gRPC; mutual TLS on a secured node)'),
    Option("region", str, "cluster: this cluster is a region of a deployment (docs/regions.md) named so; needs "
                          "--global-etcd"),
    Option("global_etcd", str, "region: the etcd endpoints every region shares (topics, subscriptions, policies: "
                               "the metadata log; the region registry); the same TLS options as --etcd"),
    Option("region_slots", int, "region: how many regions the deployment may hold (fixed by its first node; "
                                "× --shards-per-topic at most 64; default 4)"),
    Option("zone", str, "the node's zone: ledger ensembles span distinct zones"),
    Option("bundles", int, 'hash ranges topics are spread over (fixed per data directory and cluster)'),
    Option("replicas", int, 'cluster: storage nodes that hold each ledger (default 3)'),
    Option("ack_quorum", int, 'cluster: how many of them hold a record before it is answered (default 2, a majority)'),
    Option("load_balance_s", float, 'cluster: how often the busiest bundles move to the least busy nodes, by measured '
                                    'load (default 30; 0: never)'),
    Option("workers", int, 'worker processes behind the one port, each owning a share of the topics (default 1; N > 1'
                           ' starts an etcd of their own, or with --etcd joins that cluster as nodes <node id>.w<i>:'
                           ' docs/workers.md)'),
    Option("export_root", str, "run export subscriptions (cloud_storage_config, bigquery_config) here: a Spark job "
                               "writes under this directory, a bucket a directory in it (default: not run)"),
    Option("export_master", str, "the export job's Spark master: local[N], spark://host:port, yarn, or sc://host:port "
                                 "for Spark Connect (default local[*])"),
    Option("push_signing_key", str, "the RSA key push OIDC tokens are signed with: a PEM file or a service-account"
                                    " JSON key file (default: one made and kept in the data directory); endpoints"
                                    " verify them with /.well-known/jwks.json on the HTTP port"),
    Option("log_format", str, 'text | json (one object per line)'),
    Option("http_port", int, 'REST API, /metrics, /healthz, /readyz (default: the gRPC port + 1; 0 turns it off)'),
    Option("tls_cert", str, 'PEM certificate chain of the gRPC and HTTP ports (and of node-to-node calls)'),
    Option("tls_key", str, 'its PEM private key'),
    Option("tls_client_ca", str, 'mutual TLS: clients (and peer nodes, without --peer-port) present certificates this'
                                 ' CA signed; their identity authenticates'),
    Option("peer_cert", str, 'the node certificate of the peer port and of calls to peers (default --tls-cert)'),
    Option("peer_key", str, 'its PEM private key (default --tls-key)'),
    Option("peer_ca", str, "the cluster's CA: the peer port requires node certificates it signed (default --tls-"
                           'client-ca)'),
    Option("auth_token_file", str, 'bearer tokens, hashed (`pigeon tokens add`)'),
    Option("oidc_issuer", str, 'OIDC/JWT tokens: the issuer (iss)'),
    Option("oidc_audience", str, 'OIDC/JWT tokens: the audience (aud)'),
    Option("oidc_jwks", str, "OIDC/JWT tokens: the issuer's keys (a JWKS file or URL)"),
    Option("admins", str, 'comma-separated principals with every permission (bootstrap)'),
    Option("metrics_readers", str, "with authentication, who besides the admins may read /metrics (comma-separated "
                                   "principals; allAuthenticatedUsers, allUsers)"),
    Option("insecure", bool, 'serve a non-loopback address without authentication or TLS, knowingly'),
    Option("audit_log", str, "file for the audit log's JSON lines (default: the server's log)"),
    Option("publish_bytes_per_s", int, 'quota: publish bytes per second of each project (0: none)'),
    Option("admin_ops_per_min", int, 'quota: admin operations per minute of each project (0: none)'),
    Option("backlog_bytes_per_project", int, 'quota: unacknowledged bytes each project may retain (0: none)'),
)


def start(values: dict) -> None:
    """Serve with the settings given (None: not given), until SIGTERM/SIGINT."""
    from pigeon.api.server import run
    from pigeon.ops.config import load

    values = dict(values)
    try:
        cfg = load(values.pop("config", None), **values)
    except (ValueError, OSError) as e:
        print(f"pigeon: {e}", file=sys.stderr)
        raise SystemExit(2)
    run(cfg)


def parse(argv: list[str]) -> dict:
    """The settings in `argv` (what follows `serve`); argparse's usage error (exit 2) for anything else."""
    parser = argparse.ArgumentParser(prog="pigeon serve", usage="pigeon serve [OPTIONS] (pigeon serve --help: "
                                     "what each one does)", add_help=False, allow_abbrev=False)
    for o in OPTIONS:
        if o.kind is bool:
            parser.add_argument(o.flag, dest=o.name, action="store_const", const=True, default=None)
        else:
            parser.add_argument(o.flag, dest=o.name, type=o.kind, default=None)
    return vars(parser.parse_args(argv))


def main() -> None:
    """`pigeon serve …` (sys.argv[1] is "serve"; its help is the whole command line's: pigeon.cli.entry)."""
    argv = sys.argv[2:]
    from pigeon.cli import errors

    sys.exit(errors.guard(sys.argv[1:], lambda: start(parse([a for a in argv if a != "--debug"]))))
