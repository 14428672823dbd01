"""Every Pigeon process serves gRPC from its POSIX listener (pigeon._grpc_on_posix_io) unless GRPC_EXPERIMENTS
says otherwise, and leaves the variable as it found it for the processes it starts. gRPC's own trace of the TCP
layer names the source files that moved the bytes (POSIX I/O: tcp_server_posix.cc, tcp_posix.cc)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os, sys
import pigeon
import grpc
print("env:", os.environ.get("GRPC_EXPERIMENTS"), flush=True)
server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
ch = grpc.insecure_channel(f"127.0.0.1:{port}")
grpc.channel_ready_future(ch).result(10)
ch.close()
server.stop(None)
"""


def _probe(**env) -> tuple[str, str]:
    full = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    full.update(env, GRPC_VERBOSITY="debug", GRPC_TRACE="tcp")
    p = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr


def test_pigeon_serves_grpc_on_posix_io_and_leaves_the_environment_alone():
    out, err = _probe()
    assert "env: None" in out
    assert "tcp_server_posix.cc" in err and "tcp_posix.cc" in err  # the listener's and the connections' I/O


def test_an_explicit_choice_of_the_operator_is_kept():
    out, err = _probe(GRPC_EXPERIMENTS="event_engine_listener")
    assert "env: event_engine_listener" in out
    assert "tcp_posix.cc" not in err and "tcp_server_posix.cc" not in err
