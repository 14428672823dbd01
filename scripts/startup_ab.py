"""How long `pigeon serve` takes to open its gRPC port on an empty data directory (or a copy of `--data`, e.g.
one holding a backlog), for two source trees alternating in one sitting (start-up and recovery are most of a
restart's time: `pigeon bench`'s restart figure).

    git worktree add /tmp/before HEAD~1
    python scripts/startup_ab.py /tmp/before . --runs 8 [--data ./data-with-a-backlog]

Both trees' bytecode is written first (as installing a package does), so neither pays for compiling modules."""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def once(tree: str, source: str | None) -> float:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        if source:
            shutil.copytree(source, data)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--data-dir", data],
                                cwd=tree, env=dict(os.environ, PYTHONPATH=tree), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            while True:
                if proc.poll() is not None:
                    raise SystemExit(f"the server of {tree} exited with {proc.returncode}")
                try:
                    socket.create_connection(("127.0.0.1", port), 0.05).close()
                    return time.monotonic() - t0
                except OSError:
                    time.sleep(0.002)
                if time.monotonic() - t0 > 60:
                    raise SystemExit(f"the server of {tree} did not listen within 60 s")
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="the tree before (a checkout: its pigeon/ is started)")
    ap.add_argument("b", help="the tree after")
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--data", help="start on a copy of this data directory (default: an empty one)")
    args = ap.parse_args()
    trees = [os.path.abspath(args.a), os.path.abspath(args.b)]
    for t in trees:
        compileall.compile_dir(os.path.join(t, "pigeon"), quiet=1)
    times: dict[str, list[float]] = {t: [] for t in trees}
    for i in range(args.runs):
        for t in trees:
            times[t].append(once(t, args.data))
        print(f"run {i + 1}/{args.runs}", file=sys.stderr)
    for t in trees:
        print(f"{t}: gRPC port open after median {statistics.median(times[t]):.3f} s "
              f"({' '.join(f'{x:.2f}' for x in times[t])})")
    a, b = (statistics.median(times[t]) for t in trees)
    print(f"B ÷ A: {b / a:.2f}×")


if __name__ == "__main__":
    main()
