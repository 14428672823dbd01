"""The web console on a node that authenticates callers (bearer tokens from a token file), in a real Chromium
(pigeon.testing.browser): signed out it asks for a token instead of showing a wall of 401s; a viewer's token
shows the project read-only and a write is refused with the server's own message; an admin's token writes; the
token lives in the tab's sessionStorage only, and signing out forgets it.

The pictures in docs/security.md come from this test: `PIGEON_CONSOLE_SHOTS=docs/img pytest
tests/e2e/test_console_auth.py` writes them there (otherwise to the test's own directory)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.iam.v1 import iam_policy_pb2, policy_pb2

from pigeon.ops.auth import token_hash
from pigeon.testing.browser import chromium
from tests.e2e.test_console import click, wait_for

pytestmark = pytest.mark.e2e

ADMIN = "user:admin@example.com"
VIEWER = "user:viewer@example.com"
TOKENS = {ADMIN: "admin-" + os.urandom(12).hex(), VIEWER: "viewer-" + os.urandom(12).hex()}
REFUSED = "User not authorized to perform this action."  # every PERMISSION_DENIED (docs/security.md)


def rest(base: str, method: str, path: str, token: str | None = None, body=None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def grant_viewer(address: str, project: str) -> None:
    """roles/pubsub.viewer on the project for VIEWER (a project's policy is set over gRPC's IAMPolicy service)."""
    policy = policy_pb2.Policy(bindings=[policy_pb2.Binding(role="roles/pubsub.viewer", members=[VIEWER])])
    with grpc.insecure_channel(address) as ch:
        ch.unary_unary("/google.iam.v1.IAMPolicy/SetIamPolicy")(
            iam_policy_pb2.SetIamPolicyRequest(resource=project, policy=policy).SerializeToString(),
            metadata=[("authorization", f"Bearer {TOKENS[ADMIN]}")], timeout=10)


@pytest.fixture
def secured(server_factory, tmp_path):
    """A node on loopback with a token file (an admin and a viewer) and a project the viewer may read."""
    token_file = tmp_path / "tokens.txt"
    token_file.write_text("".join(f"{token_hash(t)} {who}\n" for who, t in TOKENS.items()))
    srv = server_factory(http=True, extra=["--auth-token-file", str(token_file), "--admins", ADMIN])
    assert rest(srv.http, "PUT", "/v1/projects/shop/topics/orders", TOKENS[ADMIN])[0] == 200
    assert rest(srv.http, "PUT", "/v1/projects/shop/subscriptions/orders-worker", TOKENS[ADMIN],
                {"topic": "projects/shop/topics/orders"})[0] == 200
    grant_viewer(srv.address, "projects/shop")
    return srv


@pytest.fixture
def browser():
    d = chromium(1200, 720)
    yield d
    d.quit()


def shot(driver, tmp_path, name: str) -> None:
    out = os.environ.get("PIGEON_CONSOLE_SHOTS") or str(tmp_path)
    assert driver.save_screenshot(os.path.join(out, name)), name


def sign_in(driver, token: str) -> None:
    from selenium.webdriver.common.by import By

    field = wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=token]"), "the token field")
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "[data-testid=sign-in]").click()
    wait_for(driver, lambda d: not d.find_element(By.ID, "signin").is_displayed(), "the prompt to go")


def refusals(driver) -> list[str]:
    """The browser's log lines for answers of 401 (each console call refused for want of credentials)."""
    return [e["message"] for e in driver.get_log("browser") if "status of 401" in e["message"]]


def test_sign_in_as_viewer_then_admin(secured, browser, tmp_path):
    from selenium.webdriver.common.by import By

    base, d = secured.http, browser
    assert rest(base, "GET", "/v1/projects")[0] == 401  # the node itself: nothing without a token

    # signed out: one prompt, with the server's reason; no error toast, no view, no polling into 401s
    d.get(f"{base}/?project=shop#/topics")
    why = wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=signin-why]").text, "the prompt")
    assert "missing required authentication credential" in why
    assert not d.find_element(By.ID, "toast").is_displayed() and d.find_element(By.ID, "main").text == ""
    time.sleep(2.5)  # more than one poll interval
    assert len(refusals(d)) == 1, refusals(d)
    shot(d, tmp_path, "console-signin.png")

    # a token the node does not know: asked again, saying so
    sign_in_field = d.find_element(By.CSS_SELECTOR, "[data-testid=token]")
    sign_in_field.send_keys("not-a-token")
    d.find_element(By.CSS_SELECTOR, "[data-testid=sign-in]").click()
    wait_for(d, lambda d: "refused the token" in d.find_element(By.CSS_SELECTOR, "[data-testid=signin-why]").text,
             "the refusal")
    assert d.execute_script("return sessionStorage.getItem('pigeon.token')") is None

    # a viewer: the project's topics and subscriptions show; creating a topic is refused in the server's words
    sign_in(d, TOKENS[VIEWER])
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-topic=orders]"), "the viewer's topic list")
    d.get(f"{base}/?project=shop#/subscriptions")  # a reload: the token stays for the tab
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-sub=orders-worker]"), "the subscriptions")
    d.get(f"{base}/?project=shop#/topics")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=topic-id]"), "the topic form")
    d.find_element(By.CSS_SELECTOR, "[data-testid=topic-id]").send_keys("payments")
    d.find_element(By.CSS_SELECTOR, "[data-testid=create-topic]").click()
    toast = wait_for(d, lambda d: d.find_element(By.ID, "toast").text, "the refusal")
    assert toast == REFUSED and "bad" in d.find_element(By.ID, "toast").get_attribute("class")
    assert rest(base, "GET", "/v1/projects/shop/topics/payments", TOKENS[ADMIN])[0] == 404
    shot(d, tmp_path, "console-viewer-refused.png")
    assert d.execute_script("return sessionStorage.getItem('pigeon.token')") == TOKENS[VIEWER]
    assert d.execute_script("return Object.keys(localStorage).filter((k) => localStorage[k].includes('viewer-'))") == []

    # signing out forgets the token and asks again
    click(d, "[data-testid=sign-out]")
    wait_for(d, lambda d: d.find_element(By.ID, "signin").is_displayed(), "the prompt after signing out")
    assert d.execute_script("return sessionStorage.getItem('pigeon.token')") is None
    assert d.find_element(By.ID, "main").text == ""

    # an admin: the same write goes through
    sign_in(d, TOKENS[ADMIN])
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=topic-id]"), "the topic form")
    d.find_element(By.CSS_SELECTOR, "[data-testid=topic-id]").send_keys("payments")
    d.find_element(By.CSS_SELECTOR, "[data-testid=create-topic]").click()
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-topic=payments]"), "the new topic's row")
    assert d.find_element(By.ID, "toast").text == "topic payments created"
    assert rest(base, "GET", "/v1/projects/shop/topics/payments", TOKENS[ADMIN])[0] == 200
