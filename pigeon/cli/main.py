"""The `pigeon` command line."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from pigeon.cli import verbs

app = typer.Typer(add_completion=False, help="Pigeon: a durable Pub/Sub-compatible message server.")


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="address to listen on (default 127.0.0.1)"),
    port: Optional[int] = typer.Option(None, help="port (default 8085)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="data directory (default ./data)"),
    fsync: Optional[str] = typer.Option(None, help="always | batch | never (default always)"),
    shards_per_topic: Optional[int] = typer.Option(None, help="shards of each new topic"),
    config: Optional[str] = typer.Option(None, help="TOML settings file"),
    log_level: Optional[str] = typer.Option(None, help="DEBUG, INFO, WARNING, ERROR"),
):
    """Start a node on its embedded defaults: one process, one data directory."""
    from pigeon.api.server import run
    from pigeon.ops.config import load

    try:
        cfg = load(config, host=host, port=port, data_dir=data_dir, fsync=fsync,
                   shards_per_topic=shards_per_topic, log_level=log_level)
    except (ValueError, OSError) as e:
        typer.echo(f"pigeon: {e}", err=True)
        raise typer.Exit(2)
    run(cfg)


@app.command()
def fsck(data_dir: str = typer.Argument(..., help="data directory to check")):
    """Check a data directory offline and print what is broken; changes nothing."""
    from pigeon.node.fsck import check

    ok = check(data_dir, sys.stdout)
    raise typer.Exit(0 if ok else 1)


verbs.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
