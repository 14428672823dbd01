"""Start the real `pigeon serve` process on a free loopback port (tests and benchmarks only)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pigeon.bench.procs import await_listening, free_port  # noqa: F401  (one rule for choosing a server's port)


class ServerProcess:
    """A `pigeon serve` child process. `start()` waits until the port accepts connections."""

    def __init__(self, data_dir: str, port: int | None = None, fsync: str = "always", extra: list[str] | None = None,
                 log_path: str | None = None, env: dict[str, str] | None = None, http: bool = False,
                 cwd: str | None = None):
        """`cwd`: the directory the process runs in — another tree of this repository's runs that tree's Pigeon
        (`python -m pigeon` imports the package from its working directory first)."""
        self.data_dir = data_dir
        self.env = env  # added to this process's environment
        self.cwd = cwd
        self.port = port or free_port()
        self.http_port = free_port() if http else 0  # the REST API and health checks (0: off)
        self.fsync = fsync
        self.extra = extra or []
        self.log_path = log_path or os.path.join(os.path.dirname(os.path.abspath(data_dir)), f"pigeon-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        """The base URL of the HTTP port (started with http=True)."""
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 30.0) -> "ServerProcess":
        cmd = [sys.executable, "-m", "pigeon", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--data-dir", self.data_dir, "--fsync", self.fsync, "--http-port", str(self.http_port), *self.extra]
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        log.close()
        await_listening(self.proc, self.port, timeout, "pigeon", self.log_path, self.log)
        if self.http_port:
            await_listening(self.proc, self.http_port, timeout, "pigeon (HTTP)", self.log_path, self.log)
        return self

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-5000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path (checkpoint, close)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
