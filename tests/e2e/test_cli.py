"""The command-line verbs against the real server."""

import base64
import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e


def run(server, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", *args, "--address", server.address, "--project", "cli"],
                          capture_output=True, text=True, timeout=60)


def pigeon(server, *args) -> str:
    out = run(server, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


DELAY_S = 15  # a scheduled message is still "scheduled" after a publish, a pull and a peek, however slow


def test_topics_subscriptions_publish_pull_and_queue_verbs(server):
    pigeon(server, "topics", "create", "cli-topic")
    pigeon(server, "subscriptions", "create", "cli-sub", "--topic", "cli-topic")
    assert "projects/cli/topics/cli-topic" in pigeon(server, "topics", "list")
    assert "cli-sub" in pigeon(server, "subscriptions", "list")
    mid = pigeon(server, "publish", "cli-topic", "hello", "-A", "k=v").strip()
    later = pigeon(server, "publish", "cli-topic", "later", "--delay", f"{DELAY_S}s").strip()
    # (each command is a process start: seconds apiece on a loaded machine; the server dated the activation before
    # the command returned, so it is due by now + DELAY_S)
    due = time.monotonic() + DELAY_S
    (got,) = json.loads(pigeon(server, "pull", "cli-sub", "--ack", "--format", "json"))["receivedMessages"]
    assert (got["message"]["messageId"], got["message"]["attributes"]) == (mid, {"k": "v"})
    assert base64.b64decode(got["message"]["data"]) == b"hello"  # as the REST API spells it
    assert json.loads(pigeon(server, "queue", "peek", "cli-sub", later))["state"] == "scheduled"
    time.sleep(max(0.0, due - time.monotonic()) + 0.5)
    (taken,) = json.loads(pigeon(server, "queue", "take", "cli-sub", "--lock", "60", "-f", "json"))["receivedMessages"]
    assert base64.b64decode(taken["message"]["data"]) == b"later"
    pigeon(server, "queue", "reschedule", "cli-sub", taken["ackId"], "--delay", "3600")
    assert json.loads(pigeon(server, "queue", "peek", "cli-sub", later))["state"] == "scheduled"
    assert pigeon(server, "queue", "delete", "cli-sub", later).strip() == "1"
    peek = run(server, "queue", "peek", "cli-sub", later)
    if peek.returncode == 0:  # still retained: shown as acked
        assert json.loads(peek.stdout)["state"] == "acked"
    else:  # the upkeep (every few seconds) already let go of the acked batch
        assert "is not retained" in peek.stderr, peek.stderr


def test_list_and_pull_print_tables_by_default(server):
    pigeon(server, "topics", "create", "table-topic")
    pigeon(server, "subscriptions", "create", "table-sub", "--topic", "table-topic")
    pigeon(server, "publish", "table-topic", "hello table", "-A", "k=v")
    assert "projects/cli/topics/table-topic" in pigeon(server, "topics", "list")
    subs = pigeon(server, "subscriptions", "list")
    assert "table-sub" in subs and "ack deadline" in subs
    pulled = pigeon(server, "pull", "table-sub", "--ack")
    assert "hello table" in pulled and "k=v" in pulled and "message id" in pulled
    listed = json.loads(pigeon(server, "subscriptions", "list", "--format", "json"))["subscriptions"]
    assert {"name": "projects/cli/subscriptions/table-sub", "topic": "projects/cli/topics/table-topic"}.items() <= \
        next(s for s in listed if s["name"].endswith("/table-sub")).items()


MISSING = "projects/cli/subscriptions/nobody-sub"
# every verb that talks to the server, with arguments the server refuses: (verb, status the line names)
REFUSED = [
    (["topics", "create", "x"], "INVALID_ARGUMENT"),
    (["topics", "delete", "nobody-topic"], "NOT_FOUND"),
    (["subscriptions", "create", "some-sub", "--topic", "nobody-topic"], "NOT_FOUND"),
    (["subscriptions", "delete", "nobody-sub"], "NOT_FOUND"),
    (["publish", "nobody-topic", "data"], "NOT_FOUND"),
    (["pull", "nobody-sub"], "NOT_FOUND"),
    (["queue", "take", "nobody-sub"], "NOT_FOUND"),
    (["queue", "ack", "nobody-sub", "1-2-3"], "NOT_FOUND"),
    (["queue", "reschedule", "nobody-sub", "1-2-3", "--delay", "5"], "NOT_FOUND"),
    (["queue", "bury", "nobody-sub", "1-2-3"], "NOT_FOUND"),
    (["queue", "kick", "nobody-sub"], "NOT_FOUND"),
    (["queue", "peek", "nobody-sub", "123"], "NOT_FOUND"),
    (["queue", "delete", "nobody-sub", "123"], "NOT_FOUND"),
]
VERBS = [args for args, _ in REFUSED] + [["topics", "list"], ["subscriptions", "list"]]


def _one_error_line(out: subprocess.CompletedProcess, verb: str) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"ERROR: (pigeon {verb}) "), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def refusing_server(tmp_path_factory):
    """One server for the refusals: none of them changes anything on it."""
    from pigeon.testing.server import ServerProcess

    srv = ServerProcess(str(tmp_path_factory.mktemp("refusals") / "data")).start()
    yield srv
    srv.kill()


@pytest.mark.parametrize("args,status", REFUSED, ids=[" ".join(a[:2]) for a, _ in REFUSED])
def test_a_refusal_is_one_line_with_the_status_and_the_servers_message(refusing_server, args, status):
    out = run(refusing_server, *args)
    assert out.returncode == 1, (out.stdout, out.stderr)
    verb = " ".join(args[:2]) if args[0] in ("topics", "subscriptions", "queue") else args[0]
    line = _one_error_line(out, verb)
    assert f") {status}: " in line and len(line.split(f"{status}: ", 1)[1]) > 10, line  # the server's sentence


def test_an_existing_topic_is_already_exists(server):
    pigeon(server, "topics", "create", "twice-topic")
    line = _one_error_line(run(server, "topics", "create", "twice-topic"), "topics create")
    assert "ALREADY_EXISTS" in line and "twice-topic" in line


def test_debug_shows_the_traceback(server):
    out = subprocess.run([sys.executable, "-m", "pigeon", "--debug", "topics", "create", "x", "--address",
                          server.address], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "InvalidArgument" in out.stderr


def test_every_verb_says_within_seconds_when_no_server_answers():
    from pigeon.core import limits
    from pigeon.testing.server import free_port

    address = f"127.0.0.1:{free_port()}"  # nobody listens here
    t0 = time.monotonic()
    procs = [(args, subprocess.Popen([sys.executable, "-m", "pigeon", *args, "--address", address], text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)) for args in VERBS]
    for args, p in procs:  # all at once: each waits the connect limit
        _, err = p.communicate(timeout=60)
        verb = " ".join(args[:2]) if args[0] in ("topics", "subscriptions", "queue") else args[0]
        line = _one_error_line(subprocess.CompletedProcess(args, p.returncode, "", err), verb)
        assert p.returncode == 3, (args, err)
        assert address in line and "PUBSUB_EMULATOR_HOST" in line and "make run" in line, line
    assert time.monotonic() - t0 < limits.cli_connect_s_max + 30  # bounded, not the client's minute of retries


def test_a_second_server_on_the_same_data_directory_is_refused(server):
    from pigeon.bench.procs import free_port

    out = subprocess.run([sys.executable, "-m", "pigeon", "serve", "--port", str(free_port()), "--data-dir",
                          server.data_dir], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (
        1, f"pigeon: the data directory {server.data_dir} is in use by another process")
    assert server.proc.poll() is None


def test_a_data_directory_of_a_newer_format_is_refused_before_anything_is_read(tmp_path):
    """An older Pigeon would take a newer one's records for damage and cut its log there: it refuses to start
    instead, naming both formats, and fsck says so too. A directory it starts on says the format it writes."""
    from pigeon.bench.procs import free_port
    from pigeon.storage import formats

    fresh, newer = tmp_path / "fresh", tmp_path / "newer"
    newer.mkdir()
    (newer / "FORMAT").write_text("pigeon-data 99\n")
    out = subprocess.run([sys.executable, "-m", "pigeon", "serve", "--port", str(free_port()), "--data-dir",
                          str(newer)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        f"pigeon: the data directory {newer} is in data format 99, written by a newer Pigeon; this Pigeon reads "
        f"formats up to {formats.DATA}: run the newer version on it")
    assert sorted(p.name for p in newer.iterdir()) == ["FORMAT", "LOCK"], "nothing was written"
    out = subprocess.run([sys.executable, "-m", "pigeon", "fsck", str(newer)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "NEWER FORMAT: the data directory" in out.stdout, out.stdout
    fresh.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pigeon", "serve", "--port", str(free_port()), "--data-dir",
                             str(fresh)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (fresh / "FORMAT").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert (fresh / "FORMAT").read_text() == f"pigeon-data {formats.DATA_PLAIN}\n"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
