"""`pigeon cluster status | regions | drain | undrain | move-shard | upgrade-check`: operate a cluster through its coordination store (etcd), which
every node watches — so these work while any node is down, and a drain takes effect wherever placement is
computed. They reach etcd as a node does (pigeon.ops.etcd_access): --etcd-ca, --etcd-cert and --etcd-key (or
PIGEON_ETCD_CA, PIGEON_ETCD_CERT, PIGEON_ETCD_KEY, as `pigeon serve` reads them) for an etcd that takes TLS."""

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
ETCD = typer.Option("127.0.0.1:2379", "--etcd", envvar="PIGEON_ETCD", help="comma-separated etcd endpoints "
                    "(https:// for TLS)")
ETCD_CA = typer.Option(None, "--etcd-ca", envvar="PIGEON_ETCD_CA", help="TLS to etcd: the CA that signed etcd's "
                       "certificate (default: the system's roots)")
ETCD_CERT = typer.Option(None, "--etcd-cert", envvar="PIGEON_ETCD_CERT", help="TLS to etcd: a client certificate "
                         "(etcd's --client-cert-auth)")
ETCD_KEY = typer.Option(None, "--etcd-key", envvar="PIGEON_ETCD_KEY", help="its PEM private key")


def _with_store(fn):
    from pigeon.node.membership import Membership, NodeInfo
    from pigeon.node.meta_etcd import EtcdMetadata
    from pigeon.ops import etcd_access

    async def go(access):
        meta = EtcdMetadata(access)
        try:
            return await fn(meta, Membership(meta, NodeInfo("-", "-")))
        finally:
            await meta.close()

    def run(endpoints: str, ca: Optional[str], cert: Optional[str], key: Optional[str]):
        try:
            access = etcd_access.read(endpoints, ca or "", cert or "", key or "")
        except ValueError as e:
            typer.echo(f"pigeon: {e}", err=True)
            raise typer.Exit(2)
        try:
            return asyncio.run(go(access))
        except M.StoreUnavailable as e:
            typer.echo(f"pigeon: {e}", err=True)
            raise typer.Exit(UNREACHABLE)

    return run


def _shown_whole(st: dict, fmt: Format, empty: bool, empty_says: str) -> bool:
    """Print `st` as JSON when asked, or what an empty store means: whether that was all to show."""
    if fmt is Format.json:
        print(json.dumps(st, indent=2))
        return True
    if empty:
        console.print(empty_says)
        return True
    return False


@cluster.command("regions")
def regions(global_etcd: str = typer.Option("127.0.0.1:2379", "--global-etcd", envvar="PIGEON_GLOBAL_ETCD",
                                            help="the etcd endpoints a deployment's regions share"),
            fmt: Format = FORMAT, etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT,
            etcd_key: Optional[str] = ETCD_KEY):
    """A deployment's regions (docs/regions.md): each region's slot and the nodes other regions reach it through
    now. (`pigeon cluster status --etcd <a region's etcd>` shows one region's nodes and bundles.)"""
    from pigeon.node.regions import regions_of

    st = _with_store(lambda meta, members: regions_of(meta))(global_etcd, etcd_ca, etcd_cert, etcd_key)
    if _shown_whole(st, fmt, not st["regions"],
                    f"no region in the global store at {global_etcd} (no node of a region has started yet)"):
        return
    from rich.table import Table

    table = Table("region", "slot", "gateways", title=f"{len(st['regions'])} of {st['slots']} region slots held")
    for r in st["regions"]:
        table.add_row(r["region"] + (" (lost)" if r["lost"] else ""), str(r["slot"]),
                      ", ".join(f"{g['node']} ({g['address']})" for g in r["gateways"]) or "none: cut off or down")
    console.print(table)


@cluster.command("lose-region")
def lose_region(name: str = typer.Argument(..., help="the region's name"),
                global_etcd: str = typer.Option("127.0.0.1:2379", "--global-etcd", envvar="PIGEON_GLOBAL_ETCD",
                                                help="the etcd endpoints a deployment's regions share"),
                etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT,
                etcd_key: Optional[str] = ETCD_KEY):
    """Declare a region lost for good (docs/regions.md, "Cross-region copies"): the topics copied to other regions
    (label pigeon-copy-to) are served there from their copies; the region's own nodes stop serving, and a node of
    it refuses to start. There is no way back: a region that returns must start over as a new one."""
    from pigeon.node.regions import lose_region as lose

    async def go(meta, members):
        try:
            return await lose(meta, name)
        except KeyError:
            return None

    slot = _with_store(go)(global_etcd, etcd_ca, etcd_cert, etcd_key)
    if slot is None:
        typer.echo(f"pigeon: no region {name} in the global store at {global_etcd}", err=True)
        raise typer.Exit(1)
    console.print(f"region {name} (slot {slot}) declared lost: its copies are served from now on")


@cluster.command("status")
def status(etcd: str = ETCD, fmt: Format = FORMAT, etcd_ca: Optional[str] = ETCD_CA,
           etcd_cert: Optional[str] = ETCD_CERT, etcd_key: Optional[str] = ETCD_KEY):
    """The cluster's nodes (up, draining, cut off from their peers, down), how many bundles each owns and the CPU
    it used lately, how many bundles have no owner and how many the planner placed by load."""
    st = _with_store(lambda meta, members: status_of(meta))(etcd, etcd_ca, etcd_cert, etcd_key)
    if _shown_whole(st, fmt, not st["cluster"], f"no cluster in the etcd at {etcd} (no node has joined it yet)"):
        return
    from rich.table import Table

    lg = st["ledgers"]
    table = Table("node", "address", "zone", "machine", "state", "bundles", "cores", "version", "format",
                  title=f"cluster {st['cluster']}: {st['bundles']} bundles, {st['unowned']} without an owner, "
                        f"{len(st['moves'])} placed by load, "
                        f"{sum(len(s) for s in st['homes'].values())} shards moved to other bundles; "
                        f"{lg['total']} ledgers, {lg['open']} open, {lg['under_replicated']} under-replicated; "
                        f"format {st['format']}")
    for r in st["nodes"]:
        table.add_row(r["node"], r["address"], r["zone"] or "-", r["machine"] or "-", r["state"], str(r["bundles"]),
                      "-" if r["cores"] is None else f"{r['cores']:.2f}", r["version"] or "-", "-" if r["format"] is None else str(r["format"]))
    console.print(table)


def upgrade_problems(st: dict) -> list[str]:
    """What keeps a node of the cluster `st` (`status_of`) from being taken down for an upgrade now: a node down
    or cut off (a second one gone could lose a quorum), a bundle without an owner, a ledger short of copies."""
    problems = [f"node {r['node']} is {r['state']}" for r in st["nodes"] if r["state"] not in ("up", "draining")]
    if st["unowned"]:
        problems.append(f"{st['unowned']} bundles have no owner")
    if st["ledgers"]["under_replicated"]:
        problems.append(f"{st['ledgers']['under_replicated']} ledgers are under-replicated (a repair is under way)")
    return problems


@cluster.command("upgrade-check")
def upgrade_check(etcd: str = ETCD, etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT,
                  etcd_key: Optional[str] = ETCD_KEY):
    """Whether a node may be upgraded now: every node up (none down or cut off, no bundle without an owner, no
    ledger under-replicated), and the releases and formats they run. Exit status 0 when it may, 1 when not yet."""
    st = _with_store(lambda meta, members: status_of(meta))(etcd, etcd_ca, etcd_cert, etcd_key)
    if not st["cluster"]:
        typer.echo(f"pigeon: no cluster in the etcd at {etcd}", err=True)
        raise typer.Exit(1)
    problems = upgrade_problems(st)
    releases = sorted({f"{r['version'] or 'before 0.1.0'} (format {r['format']})" for r in st["nodes"]
                       if r["format"] is not None})
    typer.echo(f"cluster {st['cluster']} speaks format {st['format']}; its nodes run {', '.join(releases)}")
    for p in problems:
        typer.echo(f"  not yet: {p}")
    if problems:
        raise typer.Exit(1)
    typer.echo("ready: upgrade one node at a time — `pigeon cluster drain NODE`, stop it, start it on the new "
                  "release, `pigeon cluster undrain NODE` — and check again before the next")


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
def drain(node: str = typer.Argument(..., help="the node's id"), etcd: str = ETCD,
          etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT, etcd_key: Optional[str] = ETCD_KEY):
    """Move every bundle off NODE (it stays up, keeps storing ledgers and answering clients) until undrained."""
    _with_store(_mark(node, True))(etcd, etcd_ca, etcd_cert, etcd_key)
    console.print(f"draining {node}: its bundles move to the other nodes (see `pigeon cluster status`)")


@cluster.command("undrain")
def undrain(node: str = typer.Argument(..., help="the node's id"), etcd: str = ETCD,
            etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT, etcd_key: Optional[str] = ETCD_KEY):
    """Let NODE own bundles again: it takes its share back."""
    _with_store(_mark(node, False))(etcd, etcd_ca, etcd_cert, etcd_key)
    console.print(f"{node} takes bundles again")


@cluster.command("move-shard")
def move_shard(topic: str = typer.Argument(..., help="the topic's full name (projects/P/topics/T)"),
               shard: int = typer.Option(..., "--shard", help="which of its shards (0 the first)"),
               bundle: int = typer.Option(..., "--bundle", help="the bundle it should be in (0 the first)"),
               etcd: str = ETCD, etcd_ca: Optional[str] = ETCD_CA, etcd_cert: Optional[str] = ETCD_CERT,
               etcd_key: Optional[str] = ETCD_KEY):
    """Hand SHARD of TOPIC over to BUNDLE's log: its messages, cursors and leases go on there, served by the
    bundle's owner — the way to spread a hot bundle's topics, or one hot topic's shards, over more owners. The
    shard's owner does it (a pause of a takeover's length for the shard's calls, which clients retry)."""
    from pigeon.cluster.placement import decode_homes, encode_homes

    async def go(meta, members):
        held = await meta.get(M.BUNDLES_KEY)
        if held is not None and not 0 <= bundle < int(held.value):
            typer.echo(f"pigeon: the cluster has bundles 0..{int(held.value) - 1}", err=True)
            raise typer.Exit(2)
        while True:
            kv = await meta.get(M.HOMES_KEY)
            homes = decode_homes(kv.value if kv else None)
            homes.setdefault(topic, {})[shard] = bundle
            ok, _ = await meta.txn([M.unchanged_since(kv) if kv else M.absent(M.HOMES_KEY)],
                                   [M.Put(M.HOMES_KEY, encode_homes(homes))])
            if ok:
                return

    _with_store(go)(etcd, etcd_ca, etcd_cert, etcd_key)
    console.print(f"shard {shard} of {topic} goes to bundle {bundle} (see the owners' logs, `pigeon cluster status`)")
