"""Who may read /metrics (pigeon.api.security.metrics_gate), with a real token file and authenticator: on a node
that authenticates, its admins and its metrics readers; `allAuthenticatedUsers` any caller it knows; `allUsers`
anyone; a node that cannot tell callers apart leaves the page open."""

from __future__ import annotations

import pytest

from pigeon.api import security
from pigeon.core.errors import PermissionDenied, Unauthenticated
from pigeon.ops.auth import Authenticator, token_hash
from pigeon.ops.config import load


class _Guard:
    """What the gate uses of the guard: its authenticator."""

    def __init__(self, cfg):
        self.authn = Authenticator(cfg)


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("".join(f"{token_hash(t)} {p}\n" for t, p in (
        ("admin-tok", "user:admin@example.com"), ("prom-tok", "serviceAccount:prom@example.iam.gserviceaccount.com"),
        ("eve-tok", "user:eve@example.com"))))
    return str(path)


def gate(tokens, readers: str = ""):
    cfg = load(env={}, auth_token_file=tokens, admins="user:admin@example.com", metrics_readers=readers)
    return security.metrics_gate(cfg, _Guard(cfg))


def test_admins_and_metrics_readers_may_read_the_metrics(tokens):
    check = gate(tokens, "serviceAccount:prom@example.iam.gserviceaccount.com")
    check("Bearer admin-tok", None)
    check("Bearer prom-tok", None)
    with pytest.raises(PermissionDenied):
        check("Bearer eve-tok", None)
    for bad in (None, "Bearer nope", "Basic YWJj"):
        with pytest.raises(Unauthenticated):
            check(bad, None)


def test_all_authenticated_users_and_all_users(tokens):
    check = gate(tokens, "allAuthenticatedUsers")
    check("Bearer eve-tok", None)
    with pytest.raises(Unauthenticated):
        check(None, None)
    assert gate(tokens, "allUsers") is None, "anyone: no check at all"


def test_a_node_that_does_not_authenticate_leaves_the_metrics_open(tokens):
    cfg = load(env={})
    assert security.metrics_gate(cfg, None) is None
