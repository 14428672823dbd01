"""The `pigeon` command line."""

from __future__ import annotations

import inspect
import sys
from typing import Optional

import typer

from pigeon.cli import cluster as cluster_cli, credentials, errors, verbs
from pigeon.cli import serve as serve_cli

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def serve(**values) -> None:
    serve_cli.start(values)


# its options are declared in pigeon.cli.serve, which parses `pigeon serve` itself (a start without typer)
serve.__signature__ = inspect.Signature([
    inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=typer.Option(None, o.flag, help=o.help),
                      annotation=Optional[o.kind]) for o in serve_cli.OPTIONS])
serve.__doc__ = serve_cli.DOC
app.command()(serve)


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
    plan: str = typer.Option("quick", help="smoke | quick | full | cluster | scale | scale-quick"),
    workloads: Optional[str] = typer.Option(None, help="comma-separated subset of the plan's workloads (publish, "
                                                       "consume, latency, ordered, connections, idle, backlog, restart, failover)"),
    peers: str = typer.Option("none", help="none | all | cluster | comma-separated peers (rabbitmq-classic, "
                                            "rabbitmq-quorum, nats-js, nats-js-sync-always, redis-streams, "
                                            "pubsub-emulator, pigeon-cluster, nats-js-r3; pigeon-rest, pigeon-tls, "
                                            "pigeon-auth: Pigeon over REST, with TLS + tokens, with tokens only)"),
    address: Optional[str] = typer.Option(None, help="benchmark a Pigeon already serving here (default: start one "
                                                     "with fsync=always on a fresh temporary data directory)"),
    no_pigeon: bool = typer.Option(False, "--no-pigeon", help="run the peers only"),
    out: Optional[str] = typer.Option(None, help="directory for <date>-<machine>.json/.md/.png"),
    json_path: Optional[str] = typer.Option(None, "--json", help="write the JSON results here"),
    quiet_wait: float = typer.Option(0.0, help="before each target, wait up to this many seconds for other "
                                               "programs on the machine to go quiet"),
    report_from: Optional[str] = typer.Option(None, help="measure nothing: print and re-render (.md, .png beside "
                                                         "it) the results in this JSON file"),
    scale_nodes: Optional[str] = typer.Option(None, help="the scale plans: the cluster sizes to run, e.g. 3,4,5,6"),
    node_cpu: Optional[float] = typer.Option(None, help="the scale plans: each node's CPU quota in cores (0.2)"),
):
    """Measure Pigeon (and peers) with durable publish, consume, latency, backlog, restart, ordering and
    many-client workloads; print a table, optionally write JSON, Markdown and a PNG chart."""
    from pigeon.bench.cli import bench_command

    raise typer.Exit(bench_command(plan, peers, address, no_pigeon, out, json_path, quiet_wait, report_from,
                                     workloads, scale_nodes, node_cpu))


@app.command()
def certs(
    directory: str = typer.Argument("./certs", help="where the CA, keys and certificates go"),
    server: list[str] = typer.Option(["localhost", "127.0.0.1"], "--host", help="a host name or IP address the "
                                     "server certificate serves (repeatable)"),
    client: list[str] = typer.Option([], "--client", help="a client certificate for this e-mail identity "
                                     "(repeatable): user or service account"),
    node: list[str] = typer.Option([], "--node", help="a node certificate for this node id (repeatable)"),
    etcd: bool = typer.Option(False, "--etcd", help="also etcd.pem (+ -key.pem): etcd's server certificate for the "
                              "--host names (its --cert-file; also a client certificate, as etcd's "
                              "--client-cert-auth needs); node and --client certificates are etcd client "
                              "certificates (--etcd-cert)"),
):
    """Make a local CA and certificates for development: ca.pem, server.pem (+ -key.pem), one per --client and
    --node, and etcd.pem with --etcd. The CA is reused when the directory has one."""
    import os

    from pigeon.ops import certs as c

    if not os.path.exists(os.path.join(directory, "ca.pem")):
        c.make_ca(directory)
    made = [c.issue(directory, "server", hosts=server)[0]]
    for email in client:
        made.append(c.issue(directory, f"client-{email.split('@')[0]}", email=email)[0])
    for n in node:
        made.append(c.issue(directory, f"node-{n}", hosts=server, node_id=n)[0])
    if etcd:
        made.append(c.etcd_server(directory, server)[0])
    typer.echo(f"CA: {os.path.join(directory, 'ca.pem')}")
    for m in made:
        typer.echo(f"certificate: {m} (key: {m[:-4]}-key.pem)")


tokens_cli = typer.Typer(help="bearer tokens of --auth-token-file")


@tokens_cli.command("add")
def tokens_add(
    principal: str = typer.Argument(..., help="whom the token authenticates, e.g. serviceAccount:ci@demo.iam."
                                              "gserviceaccount.com or user:ann@example.com"),
    file: str = typer.Option("./tokens.txt", "--file", help="the token file (only hashes are stored)"),
):
    """Make a random token for PRINCIPAL, add its hash to the file and print the token (shown once). A running
    server reads the file again within a second."""
    import os
    import secrets

    from pigeon.ops.auth import token_hash

    if ":" not in principal:
        typer.echo("pigeon: a principal is kind:identity, e.g. user:ann@example.com", err=True)
        raise typer.Exit(2)
    token = "pgn_" + secrets.token_urlsafe(32)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{token_hash(token)} {principal}\n")
    typer.echo(token)


app.add_typer(tokens_cli, name="tokens")
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
    tls_ca: Optional[str] = credentials.CA,
    token: Optional[str] = credentials.TOKEN,
    token_file: Optional[str] = credentials.TOKEN_FILE,
    client_cert: Optional[str] = credentials.CERT,
    client_key: Optional[str] = credentials.KEY,
):
    """Publish and receive at a steady rate through the official client: end-to-end latency and failures, live
    and as metrics — the black-box check of a running service. Exits 0 when everything sent arrived, 1 when
    something was lost or failed, 2 when the probe could not start (the target refused it or is not there)."""
    from pigeon.cli.probe import main as run_probe

    auth = credentials.client_auth(tls_ca, token, token_file, client_cert, client_key)
    try:
        raise typer.Exit(run_probe(target, project, rate, duration, metrics_port, deadline, json_out, auth))
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
    tls_ca: Optional[str] = credentials.CA,
    token: Optional[str] = credentials.TOKEN,
    token_file: Optional[str] = credentials.TOKEN_FILE,
    client_cert: Optional[str] = credentials.CERT,
    client_key: Optional[str] = credentials.KEY,
):
    """Run a Spark structured-streaming job per subscription with cloud_storage_config (Parquet files) or
    bigquery_config (a Delta table). Needs pyspark, pyarrow and deltalake (the spark extra)."""
    credentials.client_auth(tls_ca, token, token_file, client_cert, client_key)  # a bad setting: said here, exit 2
    try:
        from pigeon.spark import export as exporter, options
    except ImportError as e:
        typer.echo(f"pigeon export needs the spark extra (pip install 'pigeon[spark]'): {e}", err=True)
        raise typer.Exit(2)
    access = options.access_options(*credentials.settings(tls_ca, token, token_file, client_cert, client_key))
    n = exporter.run(endpoint, project, root, once=once, master=master, access=access)
    typer.echo(f"pigeon export: {n} subscription(s) exported")


@app.command()
def backup(
    to: str = typer.Option(..., "--to", help="an empty directory for the backup (made when missing)"),
    data: bool = typer.Option(False, "--data", help="also every subscription's unacknowledged messages"),
    project: list[str] = typer.Option([], "--project", "-p", help="a project to back up (repeatable; default: all)"),
    address: Optional[str] = verbs.ADDRESS,
):
    """Write the resources of a node or cluster (topics, subscriptions, schemas with their revisions, snapshots,
    IAM policies) as JSON to a directory, and with --data the messages not acknowledged (docs/operations.md)."""
    _backup_call(lambda m, addr, auth: m.backup(addr, to, project, data, auth), address)


@app.command()
def restore(
    source: str = typer.Option(..., "--from", help="a directory `pigeon backup` wrote"),
    address: Optional[str] = verbs.ADDRESS,
):
    """Load a backup into a node or cluster that holds none of its projects, through the public APIs."""
    _backup_call(lambda m, addr, auth: m.restore(addr, source, auth), address)


def _backup_call(fn, address: Optional[str]) -> None:
    from pigeon.cli import backup as m

    address = address or verbs.DEFAULT_ADDRESS
    auth = credentials.client_auth()
    errors.check_reachable(address, auth)
    try:
        fn(m, address, auth)
    except m.BackupError as e:
        typer.echo(f"pigeon: {e}", err=True)
        raise typer.Exit(errors.USAGE)


def _print_version(asked: bool) -> None:
    if asked:  # (eager: answered before any command is required or run)
        from pigeon.version import __version__, commit

        built = commit()
        typer.echo(f"pigeon {__version__}" + (f" (commit {built})" if built != "unknown" else ""))
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="print the version (and the commit, when run from a checkout) and exit"),
    debug: bool = typer.Option(False, "--debug", help="show the traceback of a failure (also PIGEON_DEBUG=1)"),
    ca_file: Optional[str] = credentials.option("ca_file", env=True),
    token: Optional[str] = credentials.option("token", env=True),
    token_file: Optional[str] = credentials.option("token_file", env=True),
    client_cert: Optional[str] = credentials.option("cert_file", env=True),
    client_key: Optional[str] = credentials.option("key_file", env=True),
):
    """Pigeon: a durable Pub/Sub-compatible message server. Errors print one line and exit with 1 (the server
    refused: status and its message), 2 (the command line is wrong) or 3 (no server at the address)."""
    credentials.remember(ca_file, token, token_file, client_cert, client_key)


def main() -> None:
    sys.exit(errors.run(app, sys.argv[1:]))


if __name__ == "__main__":
    main()
