"""The `pigeon` command line."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from pigeon.cli import cluster as cluster_cli, errors, verbs

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="address to listen on (default 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="port (default 8085)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="data directory (default ./data)"),
    fsync: Optional[str] = typer.Option(None, help="always | batch | never (default always)"),
    shards_per_topic: Optional[int] = typer.Option(None, help="shards of each new topic"),
    config: Optional[str] = typer.Option(None, help="TOML settings file"),
    log_level: Optional[str] = typer.Option(None, help="DEBUG, INFO, WARNING, ERROR"),
    etcd: Optional[str] = typer.Option(None, help="join a cluster: comma-separated etcd endpoints "
                                                   "(http://127.0.0.1:2379)"),
    node_id: Optional[str] = typer.Option(None, "--node-id", help="this node's id in the cluster"),
    advertise: Optional[str] = typer.Option(None, help="HOST:PORT peers reach this node at (default --host:--port)"),
    zone: Optional[str] = typer.Option(None, help="the node's zone: ledger ensembles span distinct zones"),
    bundles: Optional[int] = typer.Option(None, help="hash ranges topics are spread over (fixed per data "
                                                     "directory and cluster)"),
    replicas: Optional[int] = typer.Option(None, help="cluster: storage nodes that hold each ledger (default 3)"),
    ack_quorum: Optional[int] = typer.Option(None, "--ack-quorum", help="cluster: how many of them hold a "
                                             "record before it is answered (default 2, a majority)"),
    log_format: Optional[str] = typer.Option(None, "--log-format", help="text | json (one object per line)"),
    http_port: Optional[int] = typer.Option(None, "--http-port", help="REST API, /metrics, /healthz, /readyz "
                                            "(default: the gRPC port + 1; 0 turns it off)"),
):
    """Start a node: on its embedded defaults one process with one data directory; with --etcd a member of a
    cluster (docs/cluster.md)."""
    from pigeon.api.server import run
    from pigeon.ops.config import load

    try:
        cfg = load(config, host=host, port=port, data_dir=data_dir, fsync=fsync,
                   shards_per_topic=shards_per_topic, log_level=log_level, etcd=etcd, node_id=node_id,
                   advertise=advertise, zone=zone, bundles=bundles, replicas=replicas, ack_quorum=ack_quorum,
                   http_port=http_port, log_format=log_format)
    except (ValueError, OSError) as e:
        typer.echo(f"pigeon: {e}", err=True)
        raise typer.Exit(2)
    run(cfg)


@app.command()
def fsck(
    data_dir: str = typer.Argument(..., help="data directory to check"),
    repair: bool = typer.Option(False, "--repair", help="truncate the log at a record that cannot be applied "
                                                        "(after printing what is dropped); the server will not"),
):
    """Check a data directory offline and print what is broken; changes nothing without --repair."""
    from pigeon.node.fsck import check

    ok = check(data_dir, sys.stdout, repair=repair)
    raise typer.Exit(0 if ok else 1)


@app.command()
def bench(
    plan: str = typer.Option("quick", help="smoke | quick | full"),
    workloads: Optional[str] = typer.Option(None, help="comma-separated subset of the plan's workloads (publish, "
                                                       "consume, latency, ordered, connections, idle, backlog, restart, failover)"),
    peers: str = typer.Option("none", help="none | all | cluster | comma-separated peers (rabbitmq-classic, "
                                            "rabbitmq-quorum, nats-js, nats-js-sync-always, redis-streams, "
                                            "pubsub-emulator, pigeon-cluster, nats-js-r3)"),
    address: Optional[str] = typer.Option(None, help="benchmark a Pigeon already serving here (default: start one "
                                                     "with fsync=always on a fresh temporary data directory)"),
    no_pigeon: bool = typer.Option(False, "--no-pigeon", help="run the peers only"),
    out: Optional[str] = typer.Option(None, help="directory for <date>-<machine>.json/.md/.png"),
    json_path: Optional[str] = typer.Option(None, "--json", help="write the JSON results here"),
    quiet_wait: float = typer.Option(0.0, help="before each target, wait up to this many seconds for other "
                                               "programs on the machine to go quiet"),
    report_from: Optional[str] = typer.Option(None, help="measure nothing: print and re-render (.md, .png beside "
                                                         "it) the results in this JSON file"),
):
    """Measure Pigeon (and peers) with durable publish, consume, latency, backlog, restart, ordering and
    many-client workloads; print a table, optionally write JSON, Markdown and a PNG chart."""
    from pigeon.bench.cli import bench_command

    raise typer.Exit(bench_command(plan, peers, address, no_pigeon, out, json_path, quiet_wait, report_from,
                                     workloads))


verbs.register(app)
app.add_typer(cluster_cli.cluster, name="cluster")


@app.command()
def probe(
    target: str = typer.Option("127.0.0.1:8085", help="HOST:PORT of a node's gRPC API"),
    project: str = typer.Option("pigeon-probe", help="the project of the probe topic and subscription"),
    rate: float = typer.Option(10.0, help="messages per second"),
    duration: Optional[float] = typer.Option(None, help="seconds to run (default: until Ctrl-C)"),
    metrics_port: int = typer.Option(9464, "--metrics-port", help="serve the probe's Prometheus metrics here "
                                     "(0: none)"),
    deadline: float = typer.Option(10.0, help="a message not delivered this long after its publish is lost"),
    json_out: bool = typer.Option(False, "--json", help="print a JSON summary at the end"),
):
    """Publish and receive at a steady rate through the official client: end-to-end latency and failures, live
    and as metrics — the black-box check of a running service."""
    from pigeon.cli.probe import main as run_probe

    try:
        raise typer.Exit(run_probe(target, project, rate, duration, metrics_port, deadline, json_out))
    except KeyboardInterrupt:
        raise typer.Exit(0)


@app.command()
def export(
    project: list[str] = typer.Option(..., "--project", help="a project whose export subscriptions to run (repeatable)"),
    endpoint: str = typer.Option("localhost:8085", help="the Pigeon node (host:port)"),
    root: str = typer.Option("./export", help="export root: a bucket is a directory under it, a BigQuery table a "
                                              "Delta table under _bigquery/"),
    once: bool = typer.Option(False, "--once", help="export what is there now, then exit"),
    master: Optional[str] = typer.Option(None, help="Spark master (default local[*]; SPARK_REMOTE for Spark Connect)"),
):
    """Run a Spark structured-streaming job per subscription with cloud_storage_config (Parquet files) or
    bigquery_config (a Delta table). Needs pyspark, pyarrow and deltalake (the spark extra)."""
    try:
        from pigeon.spark import export as exporter
    except ImportError as e:
        typer.echo(f"pigeon export needs the spark extra (pip install 'pigeon[spark]'): {e}", err=True)
        raise typer.Exit(2)
    n = exporter.run(endpoint, project, root, once=once, master=master)
    typer.echo(f"pigeon export: {n} subscription(s) exported")


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="show the traceback of a failure (also PIGEON_DEBUG=1)"),
):
    """Pigeon: a durable Pub/Sub-compatible message server. Errors print one line and exit with 1 (the server
    refused: status and its message), 2 (the command line is wrong) or 3 (no server at the address)."""


def main() -> None:
    sys.exit(errors.run(app, sys.argv[1:]))


if __name__ == "__main__":
    main()
