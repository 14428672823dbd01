"""The web console at `/` on the HTTP port, in a real Chromium (pigeon.testing.browser) against a real server: what a
user does with it — create a topic and a subscription, publish, watch the backlog change, pull, delete — and
the dead-letter round trip (browse the dead-letter topic's messages, send one back to its topic). Every change
the browser makes is checked through the REST API too."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from pigeon.testing.browser import chromium

pytestmark = pytest.mark.e2e

WAIT_S = 20  # the console polls every 2 s


def rest(base: str, method: str, path: str, body=None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture
def browser():
    d = chromium()
    yield d
    d.quit()


def wait_for(driver, check, what: str):
    """Wait for `check`; a timeout says what the console showed last (its message line, the browser's log)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    # the console re-renders its tables every poll: an element found a moment ago may be gone, so look again
    waiting = WebDriverWait(driver, WAIT_S, poll_frequency=0.2,
                            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    try:
        return waiting.until(lambda d: check(d))
    except TimeoutException:
        shown = driver.execute_script("const t = document.getElementById('toast'); return t ? t.textContent : ''")
        raise AssertionError(f"waiting for {what}: the console said {shown!r}; browser log: "
                             f"{[e['message'] for e in driver.get_log('browser')]}") from None


def click(driver, selector: str) -> None:
    """Click what `selector` names, finding it again if a re-render replaced it under the click."""
    from selenium.webdriver.common.by import By

    wait_for(driver, lambda d: d.find_element(By.CSS_SELECTOR, selector).click() or True, f"to click {selector}")


def test_create_publish_watch_backlog_pull_delete(server_factory, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base = server_factory(http=True).http
    d = browser
    d.get(f"{base}/?project=console#/topics")
    assert d.title == "Pigeon console"

    # a topic, through the form
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=topic-id]"), "the topic form")
    d.find_element(By.CSS_SELECTOR, "[data-testid=topic-id]").send_keys("orders")
    d.find_element(By.CSS_SELECTOR, "[data-testid=create-topic]").click()
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-topic=orders]"), "the topic's row")
    assert rest(base, "GET", "/v1/projects/console/topics/orders")[0] == 200

    # a subscription of it
    d.get(f"{base}/?project=console#/subscriptions")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=sub-topic] option"), "the topic choice")
    d.find_element(By.CSS_SELECTOR, "[data-testid=sub-id]").send_keys("orders-worker")
    Select(d.find_element(By.CSS_SELECTOR, "[data-testid=sub-topic]")).select_by_visible_text("orders")
    d.find_element(By.CSS_SELECTOR, "[data-testid=create-sub]").click()
    row = "tr[data-sub=orders-worker] [data-testid=backlog]"
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, row), "the subscription's row")
    code, sub = rest(base, "GET", "/v1/projects/console/subscriptions/orders-worker")
    assert code == 200 and sub["topic"] == "projects/console/topics/orders"
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, row).text == "0", "a backlog of 0")

    # publish from the topic's page; the subscription's backlog shows it
    d.get(f"{base}/?project=console#/topics/orders")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=publish-data]"), "the publish form")
    d.find_element(By.CSS_SELECTOR, "[data-testid=publish-data]").send_keys("hello from the console")
    d.find_element(By.NAME, "attributes").send_keys("kind=order")
    d.find_element(By.CSS_SELECTOR, "[data-testid=publish]").click()
    d.get(f"{base}/?project=console#/subscriptions")
    wait_for(d, lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, row)] == ["1"], "a backlog of 1")

    # pull it (with acknowledge) on the subscription's page: its data and attributes, then a backlog of 0
    d.get(f"{base}/?project=console#/subscriptions/orders-worker")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-backlog]").text == "1", "the backlog")
    d.find_element(By.CSS_SELECTOR, "#pull input[name=ack]").click()
    d.find_element(By.CSS_SELECTOR, "[data-testid=pull]").click()
    cells = wait_for(d, lambda d: [c.text for c in d.find_elements(By.CSS_SELECTOR, "[data-testid=message-data]")],
                     "the message")
    assert cells == ["hello from the console"]
    assert "kind=order" in wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=message]").text, "it")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-backlog]").text == "0", "backlog 0")
    code, pulled = rest(base, "POST", "/v1/projects/console/subscriptions/orders-worker:pull",
                        {"maxMessages": 10, "returnImmediately": True})
    assert code == 200 and pulled.get("receivedMessages", []) == []  # acknowledged: not delivered again

    # delete both from their lists
    d.get(f"{base}/?project=console#/subscriptions")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-delete=orders-worker]"), "the delete button")
    click(d, "[data-delete=orders-worker]")
    d.switch_to.alert.accept()
    wait_for(d, lambda d: not d.find_elements(By.CSS_SELECTOR, "tr[data-sub=orders-worker]"), "the row to go")
    d.get(f"{base}/?project=console#/topics")
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-delete=orders]"), "the delete button")
    click(d, "[data-delete=orders]")
    d.switch_to.alert.accept()
    wait_for(d, lambda d: not d.find_elements(By.CSS_SELECTOR, "tr[data-topic=orders]"), "the row to go")
    assert rest(base, "GET", "/v1/projects/console/subscriptions/orders-worker")[0] == 404
    assert rest(base, "GET", "/v1/projects/console/topics/orders")[0] == 404
    assert [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"] == []


def test_dead_letters_browsed_and_sent_back(server_factory, browser):
    from selenium.webdriver.common.by import By

    base = server_factory(http=True).http
    p = "/v1/projects/dlq"
    for t in ("jobs", "jobs-dead"):
        assert rest(base, "PUT", f"{p}/topics/{t}")[0] == 200
    assert rest(base, "PUT", f"{p}/subscriptions/jobs-worker", {
        "topic": "projects/dlq/topics/jobs", "deadLetterPolicy": {
            "deadLetterTopic": "projects/dlq/topics/jobs-dead", "maxDeliveryAttempts": 5}})[0] == 200
    assert rest(base, "PUT", f"{p}/subscriptions/jobs-dead-reader", {"topic": "projects/dlq/topics/jobs-dead"})[0] == 200
    data = base64.b64encode(b"poison").decode()
    assert rest(base, "POST", f"{p}/topics/jobs:publish", {"messages": [{"data": data, "attributes": {"n": "1"}}]})[0] == 200
    for _ in range(5):  # five deliveries handed back: dead-lettered
        _, got = rest(base, "POST", f"{p}/subscriptions/jobs-worker:pull", {"maxMessages": 1})
        ack_ids = [m["ackId"] for m in got["receivedMessages"]]
        assert rest(base, "POST", f"{p}/subscriptions/jobs-worker:modifyAckDeadline",
                    {"ackIds": ack_ids, "ackDeadlineSeconds": 0})[0] == 200
    # the worker pulls on: the sixth delivery would pass max_delivery_attempts, so the message goes to jobs-dead
    _, got = rest(base, "POST", f"{p}/subscriptions/jobs-worker:pull", {"maxMessages": 1, "returnImmediately": True})
    assert got.get("receivedMessages", []) == []

    d = browser
    d.get(f"{base}/?project=dlq#/topics/jobs-dead")  # the dead-letter topic's page says whose it is
    wait_for(d, lambda d: d.find_element(By.ID, "dlq").is_displayed(), "the dead-letter panel")
    assert "jobs-worker" in wait_for(d, lambda d: d.find_element(By.ID, "dlq-body").text, "the feeding subscriptions")

    d.get(f"{base}/?project=dlq#/subscriptions/jobs-dead-reader")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-backlog]").text == "1", "a dead letter")
    d.find_element(By.CSS_SELECTOR, "[data-testid=pull]").click()  # not acknowledged: handed back at once
    wait_for(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-resend]"), "the send-back button")
    row = wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=message]").text, "the message")
    assert "poison" in row and "CloudPubSubDeadLetterSourceSubscription=jobs-worker" in row
    d.find_element(By.CSS_SELECTOR, "[data-resend]").click()
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-resend]").text == "sent back", "sent back")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-backlog]").text == "0", "DLQ emptied")

    # the message is on its topic again, with its own attributes and none of the dead-letter ones
    _, got = rest(base, "POST", f"{p}/subscriptions/jobs-worker:pull", {"maxMessages": 10})
    msgs = [m["message"] for m in got["receivedMessages"]]
    assert [base64.b64decode(m["data"]) for m in msgs] == [b"poison"] and msgs[0]["attributes"] == {"n": "1"}
    _, dead = rest(base, "POST", f"{p}/subscriptions/jobs-dead-reader:pull",
                   {"maxMessages": 10, "returnImmediately": True})
    assert dead.get("receivedMessages", []) == []


def test_an_export_subscription_shows_its_state_beside_its_lag(server_factory, browser):
    """An export subscription is marked in the list and on its page with where it writes and whether it runs (here
    not: the node has no --export-root); its lag is its unacked count, which grows as messages come."""
    from selenium.webdriver.common.by import By

    base = server_factory(http=True).http
    p = "/v1/projects/exp"
    assert rest(base, "PUT", f"{p}/topics/clicks")[0] == 200
    assert rest(base, "PUT", f"{p}/subscriptions/to-files", {
        "topic": "projects/exp/topics/clicks", "cloudStorageConfig": {"bucket": "click-bucket"}})[0] == 200
    assert rest(base, "PUT", f"{p}/subscriptions/pull-sub", {"topic": "projects/exp/topics/clicks"})[0] == 200
    assert rest(base, "POST", f"{p}/topics/clicks:publish", {"messages": [{"data": "eA=="}] * 3})[0] == 200

    d = browser
    d.get(f"{base}/?project=exp#/subscriptions")
    tag = wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "tr[data-sub=to-files] [data-testid=export]"),
                   "the export's tag")
    assert tag.text == "export failing"
    assert "click-bucket" in tag.get_attribute("title") and "RESOURCE_ERROR" in tag.get_attribute("title")
    assert not d.find_elements(By.CSS_SELECTOR, "tr[data-sub=pull-sub] [data-testid=export]")
    d.get(f"{base}/?project=exp#/subscriptions/to-files")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-backlog]").text == "3", "the lag")
    line = wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=sub-export]").text, "the export line")
    assert "cloud storage: click-bucket" in line and "this node has no --export-root" in line
