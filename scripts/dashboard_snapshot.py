"""A picture of docs/grafana/pigeon-dashboard.json with real data, where Grafana cannot be installed: a node under
traffic (the console screenshots' shop: a steady publisher, a consumer, a dead-letter topic), a real Prometheus
(Debian's `prometheus`) scraping its /metrics every second, then every panel's PromQL asked of Prometheus'
query_range API and drawn where the dashboard puts it (matplotlib). What it proves beyond a picture: every
query of the dashboard parses and returns series from what the node exports.

    python scripts/dashboard_snapshot.py [--out docs/img/dashboard.png] [--seconds 180]

Needs Debian's prometheus (apt-get install prometheus) and matplotlib (pip install -e '.[bench]').
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

from pigeon.bench.procs import await_listening, free_port
from pigeon.testing.server import ServerProcess

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from console_screenshots import setup, traffic  # noqa: E402 — the same shop, the same traffic

DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "grafana",
                         "pigeon-dashboard.json")


def prometheus(root: str, target: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(os.path.join(root, "prometheus.yml"), "w") as f:
        f.write(f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n"
                f"  - job_name: pigeon\n    static_configs: [{{targets: ['{target}']}}]\n")
    log = open(os.path.join(root, "prometheus.log"), "ab")
    proc = subprocess.Popen([shutil.which("prometheus") or "/usr/bin/prometheus",
                             f"--config.file={root}/prometheus.yml", f"--storage.tsdb.path={root}/tsdb",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    await_listening(proc, port, 30, "prometheus", os.path.join(root, "prometheus.log"), lambda: "")
    return proc, f"http://127.0.0.1:{port}"


def query_range(prom: str, expr: str, start: float, end: float) -> list[dict]:
    expr = expr.replace('{instance=~"$instance"}', "").replace('instance=~"$instance"', "")
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 2})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{q}", timeout=30) as r:
        out = json.loads(r.read())
    if out.get("status") != "success":
        raise RuntimeError(f"{expr}: {out}")
    return out["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    short = {k: v.split("/")[-1] if v.startswith("projects/") else v for k, v in labels.items()}
    for k, v in short.items():
        fmt = fmt.replace("{{" + k + "}}", v)
    return fmt or ",".join(f"{k}={v}" for k, v in short.items() if k not in ("job", "instance")) or "value"


def draw(dash: dict, data: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dash["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(16, rows / 8 * 2.6), facecolor="#111217")
    grid = fig.add_gridspec(rows, 24, hspace=8, wspace=2, top=0.96, bottom=0.03)
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"] - 1, g["x"]:g["x"] + g["w"]])
        ax.set_facecolor("#181b1f")
        ax.set_title(p["title"], color="#ccccdc", fontsize=10, loc="left")
        ax.tick_params(colors="#8e8e9e", labelsize=7)
        for s in ax.spines.values():
            s.set_color("#2c3235")
        ax.grid(color="#2c3235", linewidth=0.6)
        drawn = 0
        for target in p["targets"]:
            for series in data[(p["id"], target["refId"])]:
                pts = [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if not pts:
                    continue
                t0 = pts[0][0]
                ax.plot([t - t0 for t, _ in pts], [v for _, v in pts], linewidth=1.3,
                        label=legend(target.get("legendFormat", ""), series["metric"])[:40])
                drawn += 1
        if drawn:
            ax.legend(fontsize=6, loc="upper left", facecolor="#181b1f", edgecolor="#2c3235", labelcolor="#ccccdc")
        else:
            ax.text(0.5, 0.5, "no data (a cluster panel: this is a single node)", color="#8e8e9e",
                    ha="center", va="center", transform=ax.transAxes, fontsize=8)
        ax.set_xlabel("seconds", color="#8e8e9e", fontsize=7)
    fig.suptitle(f"{dash['title']} — Grafana dashboard docs/grafana/pigeon-dashboard.json, drawn from Prometheus",
                 color="#ccccdc", fontsize=12, y=0.995)
    fig.savefig(out, dpi=90, facecolor=fig.get_facecolor(), bbox_inches="tight")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/img/dashboard.png")
    ap.add_argument("--seconds", type=float, default=180.0, help="traffic scraped before the picture (> 60)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="pigeon-dash-")
    node = ServerProcess(os.path.join(root, "data"), http=True).start()
    prom = None
    try:
        prom, prom_url = prometheus(root, f"127.0.0.1:{node.http_port}")
        setup(node.http)
        stop = threading.Event()
        worker = threading.Thread(target=traffic, args=(node.http, stop), daemon=True)
        start = time.time()
        worker.start()
        while time.time() - start < args.seconds:
            print(f"traffic, scraped every second: {time.time() - start:4.0f} / {args.seconds:.0f} s", flush=True)
            time.sleep(15)
        stop.set()
        worker.join(10)
        print()
        dash = json.load(open(DASHBOARD))
        data, empty = {}, []
        for p in dash["panels"]:
            for t in p["targets"]:
                # from a minute in: the panels' rates look back a minute
                data[(p["id"], t["refId"])] = got = query_range(prom_url, t["expr"], start + 60, time.time())
                if not got:
                    empty.append(f"{p['title']}: {t['expr']}")
        draw(dash, data, args.out)
        print(f"saved {args.out}; queries without series: {len(empty)}")
        for e in empty:
            print(f"  {e}")
    finally:
        if prom is not None:
            prom.kill()
            prom.wait()
        node.kill()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
