"""The scale plan's results as tables (terminal and Markdown), a JSON document and a PNG chart of rate and
efficiency against the node count. Owns the rule: every rate is shown beside its efficiency, rate(N) ÷ (rate(N₀)
× N/N₀) from the same run, and beside the CPU each node used (it was capped: a node at its cap is the bound)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from pigeon.bench.report import fmt

# (row label, results key, field): {t} is the number of topics
ROWS = [
    ("one topic, publish alone", "publish", "publish_msgs_per_s"),
    ("one topic, publish + consume at once: publish", "mixed", "publish_msgs_per_s"),
    ("one topic, publish + consume at once: consume", "mixed", "consume_msgs_per_s"),
    ("{t} topics, publish alone", "topics_publish", "publish_msgs_per_s"),
    ("{t} topics, publish + consume at once: publish", "topics", "publish_msgs_per_s"),
    ("{t} topics, publish + consume at once: consume", "topics", "consume_msgs_per_s"),
]
WORKLOAD_NAMES = {"publish": "one topic, publish", "mixed": "one topic, publish + consume",
                  "topics_publish": "{t} topics, publish", "topics": "{t} topics, publish + consume"}


def _counts(doc: dict) -> list[str]:
    return sorted(doc["runs"], key=int)


def rate(doc: dict, n: str, key: str, field: str):
    v = (((doc["runs"].get(n) or {}).get("results") or {}).get(key) or {}).get(field)
    return v if isinstance(v, (int, float)) else None


def rate_rows(doc: dict) -> list[tuple[str, list[str]]]:
    """(label, a cell per node count: 'rate msg/s (efficiency)')."""
    rows = []
    topics = doc["settings"].get("topics", 16)
    for label, key, field in ROWS:
        vals = [rate(doc, n, key, field) for n in _counts(doc)]
        if all(v is None for v in vals):
            continue
        eff = (doc.get("efficiency") or {}).get(f"{key}.{field}") or {}
        cells = [fmt(v, "msg/s") + (f" ({eff[n]:.2f})" if eff.get(n) is not None else "")
                 for n, v in zip(_counts(doc), vals)]
        rows.append((label.format(t=topics), cells))
    return rows


def other_load(doc: dict) -> tuple[str, list[str]]:
    """(label, a cell per node count): the CPU other programs used while that count's runs went, median and most
    over its runs (a share of the whole machine): such load lowers that count's figures, and so the efficiencies."""
    cells = []
    for n in _counts(doc):
        seen = sorted(r["cpu"].get("other_pct", 0.0) for r in (doc["runs"][n].get("results") or {}).values()
                      if r.get("cpu"))
        cells.append(f"{seen[len(seen) // 2]:.0f} % / {seen[-1]:.0f} %" if seen else "–")
    return "other programs' CPU meanwhile, median / most (share of the machine; no efficiency)", cells


def cpu_rows(doc: dict) -> list[tuple[str, str, str, str]]:
    """(N, workload, each node's cores (throttled share of periods), etcd's cores)."""
    out = []
    topics = doc["settings"].get("topics", 16)
    for n in _counts(doc):
        for key, r in (doc["runs"][n].get("results") or {}).items():
            cpu = r.get("node_cpu") or {}
            nodes = " · ".join(f"{node} {c['cores']:.2f}" + (f" ({c['throttled_pct']:.0f} %)"
                                                              if "throttled_pct" in c else "")
                               for node, c in cpu.items() if node != "etcd")
            owned = " · ".join(f"{node} {k}" for node, k in (r.get("owned_by") or {}).items() if k)
            out.append((n, WORKLOAD_NAMES.get(key, key).format(t=topics), nodes,
                        f"{cpu['etcd']['cores']:.2f}" if "etcd" in cpu else "", owned))
    return out


def _said(error: str) -> str:
    """An error's first line, with a gRPC error's status and details (its first line names neither)."""
    lines = error.splitlines()
    said = [ln.strip() for ln in lines if ln.strip().startswith(("status = ", "details = "))][:2]
    return " ".join([lines[0][:200]] + said) if lines else ""


def _problems(doc: dict) -> list[str]:
    out = [f"N={n} / {k}: {_said(v)}" for n in _counts(doc) for k, v in (doc["runs"][n].get("errors") or {}).items()]
    out += [f"N={n}: the nodes' logs are kept in {doc['runs'][n]['logs']}" for n in _counts(doc)
            if doc["runs"][n].get("logs")]
    for n in _counts(doc):
        for k, r in (doc["runs"][n].get("results") or {}).items():
            for what in ("publish_errors", "stream_errors", "teardown_failed"):
                if r.get(what):
                    out.append(f"N={n} / {k}: {what.replace('_', ' ')} {r[what]}")
    return out


def print_table(doc: dict, console: Console) -> None:
    s = doc["settings"]
    t = Table(title=f"scale-out ({doc['plan']} run): msg/s (efficiency) — each node capped at {s['node_cpu']:g} "
                    f"core, replicas {s['replicas']}, ack quorum {s['ack_quorum']}")
    t.add_column("figure")
    for n in _counts(doc):
        t.add_column(f"N = {n}", justify="right")
    for label, cells in [*rate_rows(doc), other_load(doc)]:
        t.add_row(label, *cells)
    console.print(t)
    t2 = Table(title="CPU each node used over each run, cores (share of CFS periods throttled)")
    for c in ("N", "workload", "nodes", "etcd", "topics owned"):
        t2.add_column(c)
    for row in cpu_rows(doc):
        t2.add_row(*row)
    console.print(t2)
    for p in _problems(doc):
        console.print(f"[red]{p}")


def markdown(doc: dict) -> str:
    s, m = doc["settings"], doc["machine"]
    counts = _counts(doc)
    base = counts[0] if counts else "3"
    lines = [f"# Pigeon scale-out benchmark — {doc['when']} ({doc['plan']} run)", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_bytes'] / 2**30:.0f} GiB, Linux {m['kernel']}, "
             f"Python {m['python']}. Run took {doc.get('seconds', 0):.0f} s.", "",
             f"A Pigeon cluster of N nodes (etcd + N × `pigeon serve --etcd … --fsync always --replicas "
             f"{s['replicas']} --ack-quorum {s['ack_quorum']}`, {doc.get('bundles', 16)} bundles) on loopback, each "
             f"node held to **{s['node_cpu']:g} core** by a CPU cgroup ({doc['cgroup']['kind']}, CFS quota "
             f"{round(s['node_cpu'] * s['cpu_period_us'])} µs per {s['cpu_period_us']} µs); etcd and the load "
             "generator are not held. A publisher process and a consumer process per node, each talking to its "
             "node only (a call about a topic another node owns is forwarded there); "
             f"{s['message_bytes']} B messages, {s['batch']:,} per request, {s['inflight']} requests in flight "
             f"per publisher, StreamingPull with acks; {s['run_s']:g} s per run, each on fresh topics.", "",
             f"Cells: msg/s and, in brackets, **efficiency** = rate(N) ÷ (rate({base}) × N/{base}): 1.0 is "
             f"linear scaling, {base}/N is no gain at all.", "",
             "| figure | " + " | ".join(f"N = {n}" for n in counts) + " |",
             "|---|" + "---:|" * len(counts)]
    lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in [*rate_rows(doc), other_load(doc)]]
    lines += ["", "## CPU each node used", "",
              "Over each run's window, in cores (1.0 = one core busy all along; the cap is "
              f"{s['node_cpu']:g}), and in brackets the share of CFS periods in which the node was throttled. "
              f"*Topics owned*: how many of the run's topics each node owned (the {s['topics']} topics are one in "
              "each bundle, so they spread as the bundles do).", "",
              "| N | workload | nodes | etcd | topics owned |", "|---:|---|---|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in cpu_rows(doc)]
    problems = _problems(doc)
    if problems:
        lines += ["", "## Errors", ""] + [f"* {p}" for p in problems]
    return "\n".join(lines) + "\n"


def chart(doc: dict, path: str) -> bool:
    """Rate against N (left) and efficiency against N with the linear and the no-gain lines (right); False
    without matplotlib or figures."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    counts = _counts(doc)
    topics = doc["settings"].get("topics", 16)
    series = [(label.format(t=topics), key, field) for label, key, field in ROWS
              if any(rate(doc, n, key, field) is not None for n in counts)]
    if not series or not counts:
        return False
    xs = [int(n) for n in counts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    for i, (label, key, field) in enumerate(series):
        style = dict(marker="o", linestyle="-" if key in ("publish", "mixed") else "--", color=f"C{i}")
        pts = [(int(n), rate(doc, n, key, field)) for n in counts if rate(doc, n, key, field) is not None]
        left.plot([x for x, _ in pts], [y for _, y in pts], label=label, **style)
        eff = (doc.get("efficiency") or {}).get(f"{key}.{field}") or {}
        pts = [(int(n), eff[n]) for n in counts if eff.get(n) is not None]
        right.plot([x for x, _ in pts], [y for _, y in pts], label=label, **style)
    right.plot(xs, [1.0] * len(xs), color="#5c6670", linewidth=1, label="linear (1.0)")
    right.plot(xs, [xs[0] / x for x in xs], color="#5c6670", linewidth=1, linestyle=":",
               label=f"no gain ({xs[0]}/N)")
    s = doc["settings"]
    left.set_title(f"msg/s, higher is better ({s['message_bytes']} B, {s['batch']:,} per request)", fontsize=10)
    right.set_title(f"efficiency = rate(N) ÷ (rate({xs[0]}) × N/{xs[0]})", fontsize=10)
    right.set_ylim(0, max(1.2, *(v for e in (doc.get("efficiency") or {}).values() for v in e.values() if v)))
    for ax in (left, right):
        ax.set_xticks(xs)
        ax.set_xlabel(f"nodes, each capped at {s['node_cpu']:g} core")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    left.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    m = doc["machine"]
    fig.suptitle(f"Pigeon scale-out — {doc['when'][:10]}, {m['cores']} cores, {doc['plan']} run", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_views(doc: dict, stem: str) -> list[str]:
    """Write <stem>.md and <stem>.png from a scale results document (report.write writes the JSON)."""
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    return [stem + ".md"] + ([stem + ".png"] if chart(doc, stem + ".png") else [])
