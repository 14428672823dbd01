"""Wiring of a secured node (docs/security.md): the guard (api.access) with its authenticator, audit log and
quotas; TLS credentials; the unix socket the node's own REST front reaches its gRPC API through; the watch that
re-checks open streams when policies change, reloads the token file, the client port's TLS files and the
issuer's keys, and measures each project's backlog. Owns the rule: a node whose configuration says nothing of
security gets none of this."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile

from pigeon.api import access
from pigeon.core import limits
from pigeon.core.errors import PermissionDenied
from pigeon.ops import tls
from pigeon.ops.config import Config

log = logging.getLogger("pigeon.security")

ServedCertificate = tls.ServedCertificate
peer_server_credentials = tls.peer_server_credentials


def guard(config: Config, engine) -> access.Guard:
    from pigeon.ops import audit, auth, quotas  # (PyJWT, cryptography: loaded by secured servers only)

    try:
        authn = auth.Authenticator(config)
    except (OSError, ValueError) as e:
        raise SystemExit(f"pigeon: cannot read the credentials' configuration: {e}")
    q = quotas.ProjectQuotas(config.publish_bytes_per_s, config.admin_ops_per_min, config.backlog_bytes_per_project)
    return access.Guard(engine, authn, config, audit.Audit(config.audit_log), q)


def metrics_gate(config: Config, g: access.Guard | None):
    """Who may read /metrics: on a node that authenticates callers, its admins and `metrics_readers` — the page
    names every project's topics and subscriptions and their traffic, the node's figures, not one tenant's —
    else anyone (a node that cannot tell callers apart has only the network to keep it). Returns None (open) or
    `check(authorization header, client certificate PEM)`, which raises Unauthenticated or PermissionDenied."""
    readers = config.metrics_principals | config.admin_principals
    if g is None or not config.authenticated or "allUsers" in readers:
        return None
    anyone_known = "allAuthenticatedUsers" in readers

    def check(authorization: str | None, cert_pem: bytes | None) -> None:
        who = g.authn.principal(authorization, cert_pem)
        if not anyone_known and who not in readers:
            raise PermissionDenied(PermissionDenied.MESSAGE)

    return check


class LocalSocket:
    """A unix socket in a directory only this user may enter: the REST front's way into the gRPC API (it
    forwards the caller's credential; a certificate identity it verified itself rides in x-pigeon-principal,
    which the guard believes from this socket only)."""

    def __init__(self, server):
        self.dir = tempfile.mkdtemp(prefix="pigeon-")  # mode 0700
        self.path = os.path.join(self.dir, "grpc.sock")
        self.target = f"unix:{self.path}"
        if server.add_insecure_port(self.target) == 0:
            raise SystemExit(f"pigeon: cannot listen on {self.target}")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def local_socket(server) -> LocalSocket:
    return LocalSocket(server)


def describe(config: Config) -> str:
    if not config.secured:
        return ""
    ways = [w for w, on in (("tokens", config.auth_token_file), ("OIDC", config.oidc_jwks),
                            ("client certificates", config.tls_client_ca)) if on]
    return f", TLS {'on' if config.tls_cert else 'off'}, authentication: {', '.join(ways) or 'none'}"


async def watch(g: access.Guard, engine, served: tls.ServedCertificate | None = None, cluster=None) -> None:
    """Every `limits.security_watch_s`: streams whose caller lost the right end; a changed token file is read
    again, and so are changed TLS files of the client port (`served`); the issuer's keys are fetched when due
    (off the event loop); each project's backlog is measured; a cluster node shares the quotas out with the
    others (`QuotaSharing`)."""
    authn = g.authn
    sharing = asyncio.get_running_loop().create_task(QuotaSharing(g.quotas, cluster).run(), name="pigeon-quotas") \
        if cluster is not None and g.quotas.active else None  # (a task of its own: etcd's pace is not the watch's)
    try:
        await _watch(g, engine, served, authn)
    finally:
        if sharing is not None:
            sharing.cancel()


async def _watch(g: access.Guard, engine, served, authn) -> None:
    while True:
        await asyncio.sleep(limits.security_watch_s)
        try:
            g.recheck_if_changed()
            if served is not None and served.reload_if_changed():
                log.info("TLS certificate read again (%s): new connections get it", served.paths[0])
            if authn.config.auth_token_file and authn.reload_tokens():
                log.info("token file read again (%d tokens)", len(authn.tokens))
            if authn.keys_due():
                await asyncio.to_thread(authn.refresh_keys)
            if g.quotas.backlog_bytes:
                g.quotas.measured(backlog_bytes(engine))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 — a bad token file or an unreachable issuer: logged, tried again
            log.exception("security watch")


class QuotaSharing:
    """A cluster node's part in sharing each project's quotas (pigeon.ops.quotas): every second it puts what its
    callers asked for under its session's lease (gone with the node) and reads the others' back. While etcd cannot
    be reached the shares stay as they were (said once)."""

    def __init__(self, quotas, cluster):
        self.quotas, self.cluster = quotas, cluster
        self.failing = False

    async def run(self) -> None:
        while True:  # the first at once: until a node has shared, it would hold every quota whole
            await self.exchange()
            await asyncio.sleep(limits.security_watch_s)

    async def exchange(self) -> None:
        import json

        from pigeon.cluster import metadata as M

        lease, me = self.cluster.membership.lease, M.usage_key(self.cluster.info.node_id)
        if not lease:
            return
        own = self.quotas.report()
        try:
            await self.cluster.meta.put(me, json.dumps(own, separators=(",", ":")).encode(), lease)
            others = [json.loads(kv.value) for kv in await self.cluster.meta.list(M.USAGE_PREFIX) if kv.key != me]
            self.quotas.share_out(own, others)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 — etcd away, or a report this node cannot read: the last shares stand
            if not self.failing:
                log.warning("cannot share the quotas out with the other nodes now (%s): keeping this node's "
                            "shares as they are", e)
            self.failing = True
            return
        if self.failing:
            log.info("sharing the quotas out with the other nodes again")
            self.failing = False


def backlog_bytes(engine) -> dict[str, int]:
    """Each project's unacknowledged retained bytes, estimated as each subscription's backlog times its topic's
    mean message size (the index keeps no per-message sizes)."""
    out: dict[str, int] = {}
    for s in engine.state.subs_by_uid.values():
        t = s.topic
        if t is None or not t.published:
            continue
        project = s.name.split("/", 2)[1]
        out[project] = out.get(project, 0) + s.backlog() * t.published_bytes // t.published
    return out
