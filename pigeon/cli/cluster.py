"""`pigeon cluster status | drain | undrain`: operate a cluster through its coordination store (etcd), which
every node watches — so these work while any node is down, and a drain takes effect wherever placement is
computed."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

import typer

from pigeon.cli.errors import UNREACHABLE
from pigeon.cli.output import FORMAT, Format, console
from pigeon.cluster import metadata as M
from pigeon.node.membership import status_of

cluster = typer.Typer(help="Operate a cluster: its nodes, who owns which bundles, draining a node.",
                      no_args_is_help=True)
ETCD = typer.Option("127.0.0.1:2379", "--etcd", envvar="PIGEON_ETCD", help="comma-separated etcd endpoints")


def _with_store(fn):
    from pigeon.node.membership import Membership, NodeInfo
    from pigeon.node.meta_etcd import EtcdMetadata

    async def go(endpoints: str):
        meta = EtcdMetadata(endpoints)
        try:
            return await fn(meta, Membership(meta, NodeInfo("-", "-")))
        finally:
            await meta.close()

    def run(endpoints: str):
        try:
            return asyncio.run(go(endpoints))
        except M.StoreUnavailable as e:
            typer.echo(f"pigeon: {e}", err=True)
            raise typer.Exit(UNREACHABLE)

    return run


@cluster.command("status")
def status(etcd: str = ETCD, fmt: Format = FORMAT):
    """The cluster's nodes (up, draining, down), how many bundles each owns and how many have no owner."""
    st = _with_store(lambda meta, members: status_of(meta))(etcd)
    if fmt is Format.json:
        print(json.dumps(st, indent=2))
        return
    from rich.table import Table

    if not st["cluster"]:
        console.print(f"no cluster in the etcd at {etcd} (no node has joined it yet)")
        return
    lg = st["ledgers"]
    table = Table("node", "address", "zone", "state", "bundles",
                  title=f"cluster {st['cluster']}: {st['bundles']} bundles, {st['unowned']} without an owner; "
                        f"{lg['total']} ledgers, {lg['open']} open, {lg['under_replicated']} under-replicated")
    for r in st["nodes"]:
        table.add_row(r["node"], r["address"], r["zone"] or "-", r["state"], str(r["bundles"]))
    console.print(table)


def _mark(node: str, draining: bool):
    async def go(meta, members):
        if draining:
            if node not in await members.members():
                typer.echo(f"pigeon: no live node {node!r} in the cluster", err=True)
                raise typer.Exit(1)
            await meta.put(M.drain_key(node), b"1")
        else:
            await meta.delete(M.drain_key(node))

    return go


@cluster.command("drain")
def drain(node: str = typer.Argument(..., help="the node's id"), etcd: str = ETCD):
    """Move every bundle off NODE (it stays up, keeps storing ledgers and answering clients) until undrained."""
    _with_store(_mark(node, True))(etcd)
    console.print(f"draining {node}: its bundles move to the other nodes (see `pigeon cluster status`)")


@cluster.command("undrain")
def undrain(node: str = typer.Argument(..., help="the node's id"), etcd: Optional[str] = ETCD):
    """Let NODE own bundles again: it takes its share back."""
    _with_store(_mark(node, False))(etcd)
    console.print(f"{node} takes bundles again")
