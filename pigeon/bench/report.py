"""Results as a table (terminal and Markdown), a JSON document and a PNG chart. Owns the rule: a ratio is
Pigeon's figure divided by the peer's, from the same run; each row says whether higher or lower is better."""

from __future__ import annotations

import json
import math
import os

from rich.console import Console
from rich.table import Table

# (row label, results key, field, unit, better: "higher" | "lower" | "context" — a condition of the run, no ratio)
FIGURES = [
    ("durable publish, 1 KiB × 1,000/request", "publish_b1000", "msgs_per_s", "msg/s", "higher"),
    ("durable publish, 1 KiB × 100/request", "publish_b100", "msgs_per_s", "msg/s", "higher"),
    ("consume with acks, draining a backlog", "consume", "msgs_per_s", "msg/s", "higher"),
    ("publish and consume at once: publish", "mixed", "publish_msgs_per_s", "msg/s", "higher"),
    ("publish and consume at once: consume", "mixed", "consume_msgs_per_s", "msg/s", "higher"),
    ("… spread over several topics: publish", "topics", "publish_msgs_per_s", "msg/s", "higher"),
    ("… spread over several topics: consume", "topics", "consume_msgs_per_s", "msg/s", "higher"),
    ("latency p50 at 1,000 msg/s", "latency", "p50_ms", "ms", "lower"),
    ("latency p99 at 1,000 msg/s", "latency", "p99_ms", "ms", "lower"),
    ("latency p999 at 1,000 msg/s", "latency", "p999_ms", "ms", "lower"),
    ("publish-ack latency p50 at 1,000 msg/s (publish → durable answer)", "latency", "ack_p50_ms", "ms", "lower"),
    ("publish-ack latency p99 at 1,000 msg/s", "latency", "ack_p99_ms", "ms", "lower"),
    ("disk meanwhile: slowest fdatasync of a probe", "latency", "disk_probe_max_ms", "ms", "context"),
    ("backlogged messages held for the two rows below", "backlog", "messages", "msgs", "higher"),
    ("RAM per backlogged 100 B message", "backlog", "bytes_per_msg", "B", "lower"),
    ("restart (kill -9) to serving the backlog", "restart", "seconds", "s", "lower"),
    ("ordered publish, many keys", "ordered", "publish_msgs_per_s", "msg/s", "higher"),
    ("ordered consume with acks, order checked", "ordered", "consume_msgs_per_s", "msg/s", "higher"),
    ("many clients: publish", "connections", "publish_msgs_per_s", "msg/s", "higher"),
    ("many clients: receive", "connections", "receive_msgs_per_s", "msg/s", "higher"),
    ("few clients, the same request size: publish", "connections_few", "publish_msgs_per_s", "msg/s", "higher"),
    ("few clients, the same request size: consume", "connections_few", "consume_msgs_per_s", "msg/s", "higher"),
    ("idle StreamingPull streams held open", "idle", "streams", "msgs", "higher"),
    ("RAM per idle stream", "idle", "bytes_per_stream", "B", "lower"),
    ("publish + consume while they are held / without: publish", "idle", "publish_ratio", "×", "higher"),
    ("publish + consume while they are held / without: consume", "idle", "consume_ratio", "×", "higher"),
    ("big backlog (Pigeon only)", "backlog_big", "messages", "msgs", "higher"),
    ("RAM per backlogged message, big backlog", "backlog_big", "bytes_per_msg", "B", "lower"),
    ("restart with the big backlog", "restart_big", "seconds", "s", "lower"),
    ("failover: kill -9 of the owner (leader) → publishes answered", "failover", "seconds", "s", "lower"),
]

# Replicated targets against each other and against a single Pigeon: (row label, results key, field, unit, better)
CLUSTER_FIGURES = [f for f in FIGURES if f[1] in ("publish_b1000", "publish_b100", "consume", "mixed", "topics",
                                                   "latency", "failover") and f[4] != "context"]
CLUSTER_ROWS = (("pigeon-cluster", "nats-js-r3"), ("pigeon-cluster", "rabbitmq-quorum-r3"), ("pigeon-cluster", "pigeon"))


def value(doc: dict, target: str, key: str, field: str):
    t = doc["targets"].get(target) or {}
    v = ((t.get("results") or {}).get(key) or {}).get(field)
    return v if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else None


def fmt(v, unit: str) -> str:
    if v is None:
        return "–"
    if unit in ("msg/s", "msgs"):
        return f"{v:,.0f}"
    if unit == "B":
        return f"{v:,.1f}"
    return f"{v:,.3g}" if v < 10 else f"{v:,.1f}"


def ratio(doc: dict, target: str, key: str, field: str) -> float | None:
    p, q = value(doc, "pigeon", key, field), value(doc, target, key, field)
    if p is None or q is None or q == 0:
        return None
    return p / q


def _peers(doc: dict) -> list[str]:
    return [t for t in doc["targets"] if t != "pigeon" and "missing" not in doc["targets"][t]]


def _rows(doc: dict) -> list[tuple[str, list[str]]]:
    peers = _peers(doc)
    rows = []
    for label, key, field, unit, better in FIGURES:
        vals = [value(doc, t, key, field) for t in ["pigeon", *peers]]
        if all(v is None for v in vals):
            continue
        cells = [fmt(vals[0], unit)]
        for t, v in zip(peers, vals[1:]):
            r = ratio(doc, t, key, field) if unit != "msgs" and better != "context" else None
            cells.append(fmt(v, unit) + (f" ({r:,.0f}×)" if r is not None and r >= 100 else
                                         f" ({r:.3g}×)" if r is not None else ""))
        rows.append((f"{label} [{unit}, {'no ratio: the conditions' if better == 'context' else better + ' is better'}]",
                     cells))
    return rows


def cluster_rows(doc: dict) -> list[tuple[str, list[str]]]:
    """pigeon-cluster's figures, each ÷ nats-js-r3's, rabbitmq-quorum-r3's and a single Pigeon's from the same run."""
    pairs = [(a, b) for a, b in CLUSTER_ROWS if a in doc["targets"] and b in doc["targets"]
             and "missing" not in doc["targets"][a] and "missing" not in doc["targets"][b]]
    rows = []
    for label, key, field, unit, better in CLUSTER_FIGURES if pairs else []:
        cells = []
        for a, b in pairs:
            p, q = value(doc, a, key, field), value(doc, b, key, field)
            cells.append(f"{fmt(p, unit)} / {fmt(q, unit)}" + (f" ({p / q:.3g}×)" if p and q else ""))
        if any(c != "– / –" for c in cells):
            rows.append((f"{label} [{unit}, {better} is better]", cells))
    return rows, pairs


def other_load(entry: dict, field: str = "other_pct") -> str:
    """Median and most, over this target's workloads, of a `cpu` reading (other programs' CPU, disk busy)."""
    seen = sorted(r["cpu"][field] for k, r in (entry.get("results") or {}).items()
                  if isinstance(r, dict) and field in r.get("cpu", {}) and not k.startswith("fresh_start"))
    return f"{seen[len(seen) // 2]:.0f} % / {seen[-1]:.0f} %" if seen else ""


def _descriptions(doc: dict) -> list[tuple[str, str, str, str, str, str]]:
    out = []
    for t, e in doc["targets"].items():
        if "missing" in e:
            out.append((t, "not run: " + e["missing"], "", "", "", ""))
        else:
            out.append((t, e.get("server", ""), e.get("durable", ""), e.get("client", ""), other_load(e),
                        other_load(e, "disk_busy_pct")))
    return out


def markdown(doc: dict) -> str:
    peers = _peers(doc)
    m = doc["machine"]
    s = doc["settings"]
    lines = [f"# Pigeon benchmark — {doc['when']} ({doc['plan']} run)", "",
             f"Machine: {m['cores']} cores ({m['cpu']}), {m['memory_bytes'] / 2**30:.0f} GiB, Linux {m['kernel']}, "
             f"Python {m['python']}. Everything on loopback, one server at a time, each on a fresh data directory. "
             f"Run took {doc.get('seconds', 0):.0f} s.", "",
             "Each peer's cell shows its figure and, in brackets, **Pigeon's figure ÷ the peer's** from this run "
             "(for msg/s above 1 means Pigeon is faster; for ms, bytes and seconds below 1 means Pigeon is "
             "better).", "",
             "| figure | pigeon | " + " | ".join(peers) + " |",
             "|---|---:|" + "---:|" * len(peers)]
    for label, cells in _rows(doc):
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    crows, pairs = cluster_rows(doc)
    if crows:
        lines += ["", "## Replicated", "", "Three members each on this one machine. Cells: the first target's figure "
                  "/ the second's (first ÷ second).", "",
                  "| figure | " + " | ".join(f"{a} / {b}" for a, b in pairs) + " |",
                  "|---|" + "---:|" * len(pairs)]
        lines += [f"| {label} | " + " | ".join(cells) + " |" for label, cells in crows]
        bw = m.get("disk_write_mb_s") or {}
        if bw.get("1") and bw.get("3"):
            lines += ["", f"The disk the members share, measured before the targets ran (1 MiB appends, each "
                          f"fdatasync'd): one writer {bw['1']:.0f} MB/s, three at once {bw['3']:.0f} MB/s. A "
                          f"replicated message is written to it three times (once per member): the disk alone lets "
                          f"three members on it take at most {bw['3'] / 3:.0f} MB/s of messages, where one node may "
                          f"take {bw['1']:.0f} ({bw['3'] / 3 / bw['1']:.2f}×); with a disk each, that bound is gone."]
            for t in ("pigeon", "pigeon-cluster"):
                v, copies = value(doc, t, "publish_b1000", "msgs_per_s"), 3 if t == "pigeon-cluster" else 1
                if v:
                    lines[-1] += (f" {t}'s publish × 1,000 wrote {v * s['message_bytes'] * copies / 1e6:.0f} MB/s "
                                  f"of messages to it ({copies} × {fmt(v, 'msg/s')} msg/s × {s['message_bytes']} B).")
    lines += ["", "## Servers and the clients that drove them", "",
              "*Other load*: the CPU (share of all cores) that programs outside the benchmark used while that "
              "target's workloads ran — median / most over its workloads (per workload: `cpu` in the JSON). The "
              "machine may be shared; such load lowers figures, the latency tail most. *Disk busy*: the share of "
              "time the disk was busy (anyone's I/O), median / most.", "",
              "| target | server and settings | durable | driven by | other load | disk busy |",
              "|---|---|---|---|---:|---:|"]
    for t, server, durable, client, load, disk in _descriptions(doc):
        lines.append(f"| {t} | {server} | {durable} | {client} | {load} | {disk} |")
    lines += ["", "## How each figure was measured", "",
              f"* **Durable publish**: {s['publish_procs']} publisher processes × {s['publish_inflight']} requests "
              f"in flight each, for {s['publish_s']:.0f} s per batch size; 1 KiB random payloads; a message counts "
              "once the server acknowledged it (Pigeon: Publish response after fdatasync; RabbitMQ: publisher "
              "confirm; NATS: PubAck; Redis: XADD reply with appendfsync always). For peers a 'request' is a "
              "pipelined window of that many messages whose acknowledgements are awaited together.",
              f"* **Consume with acks**: {s['consume_procs']} consumer processes drain up to "
              f"{s.get('consume_messages', 0):,} messages of the publish backlog (or stop after "
              f"{s['consume_s_max']:.0f} s; a consumer stopped by the clock is rated over the whole window), "
              "acknowledging everything they receive (StreamingPull acks on the stream; RabbitMQ manual acks, "
              "multiple; NATS pull consumer, ack_policy all; Redis XREADGROUP + XACK).",
              f"* **Publish and consume at once**: the publishers of *durable publish* (requests of "
              f"{s['publish_batches'][0]:,}, {s['publish_inflight'][0]} in flight per process) and the consumers "
              f"of *consume* on one fresh topic and its subscription, together for {s.get('mixed_s', 0):g} s; each "
              "side is rated over that window (what the consumers had not taken by its end is `backlog_left` in "
              "the JSON).",
              f"* **… spread over several topics**: the same, on {s.get('topics', 4)} fresh topics with a publisher "
              "process and a consumer process each and as many requests in flight in all: load a server can share "
              "out by topic (`pigeon serve --workers N` gives each worker some of them).",
              f"* **Latency**: one publisher at {s['latency_rate']:,} msg/s for {s['latency_s']:.0f} s, open loop "
              "(each message stamped with the time it was due), one message per durable publish; a separate "
              "consumer process records receive − due time and acks. *Publish-ack latency* is the same run's publisher side: due time → the server's answer (Pigeon: the Publish response, after fdatasync; RabbitMQ: the confirm; NATS: the PubAck; Redis: the XADD reply). Meanwhile a probe thread writes 4 KiB and "
              "fdatasyncs it every 20 ms on the same filesystem: its slowest fdatasync is the row *disk meanwhile* "
              "(a durable server cannot answer faster than its disk; on a shared VM the disk stalls now and then "
              "for hundreds of ms, and a stall of d ms at 1,000 msg/s delays about d messages)."
              + (f" Run {s.get('latency_runs', 1)} times per server, each on a fresh topic; the rows show the "
                 "median run by p99 (its p50, p99, p999 and disk probe together; every run is in the JSON)."
                 if s.get("latency_runs", 1) > 1 else ""),
              f"* **Backlog memory**: the server's resident memory (its whole process tree) before and after "
              f"{s['backlog_messages']:,} messages of {s['backlog_bytes']} B are published to a subscription "
              "(queue, stream) that nobody reads, divided by the message count."
              + (f" The big backlog repeats this with {s['backlog_big_messages']:,} messages on a fresh Pigeon."
                 if s.get("backlog_big_messages") else ""),
              "* **Restart**: kill -9 of the server with that backlog, start on the same data, time until the "
              "backlog is served (Pigeon/emulator: a Pull returns a message; RabbitMQ/NATS/Redis: the queue or "
              "stream reports every message).",
              f"* **Ordered**: {s['ordered_keys']:,} ordering keys, requests of {s['ordered_batch']} messages of "
              "100 B (one key per request, each key's next request sent after the previous one's answer), up to "
              f"{s['ordered_messages']:,} messages or {s['ordered_s_max']:.0f} s; then one StreamingPull stream "
              "drains them and checks every key's sequence (violations and redeliveries are in the JSON).",
              f"* **Many clients**: {s['conn_publishers']:,} publisher tasks (requests of {s['conn_batch']} × 1 KiB) "
              f"and {s['conn_subscribers']:,} subscriber tasks (each its own StreamingPull stream on one "
              "subscription), asyncio tasks in one process per side, spread over "
              f"{s['conn_channels']} TCP connections per side, for {s['conn_s']:.0f} s. gRPC targets only. "
              "Beside it, for comparison, *few clients* publish and consume at once with the same request size "
              f"({s['publish_procs']} publisher processes with {s.get('conn_reference_inflight', '?')} requests "
              f"in flight each, {s['consume_procs']} consumers).",
              f"* **Idle streams**: {s.get('idle_streams', 0):,} StreamingPull streams held open on a subscription "
              f"nobody publishes to, over {s.get('idle_channels', 0)} TCP connections from a process of their own "
              "(a stream that fails is reopened, as the client libraries do); the server's resident memory before "
              "and with them, divided by their count; and publish + consume at once (as above, for "
              f"{s.get('idle_probe_s', 0):.0f} s) while they are held, against the mean of the same run before and "
              "after. gRPC targets only.", ""]
    notes = [f"{t} / {k}: {r['note']}" for t, e in doc["targets"].items() for k, r in (e.get("results") or {}).items()
             if isinstance(r, dict) and r.get("note")]
    notes += [line for t, e in doc["targets"].items()
              for line in latency_caveats(t, (e.get("results") or {}).get("latency") or {})]
    if notes:
        lines += ["## Notes", ""] + [f"* {n}" for n in notes] + [""]
    courses = [(t, r["p50_ms_each_second"]) for t, e in doc["targets"].items()
               if (r := (e.get("results") or {}).get("latency") or {}).get("p50_ms_each_second")]
    if courses:
        lines += ["## Latency second by second", "",
                  "Each second's median latency in ms over the run shown in the table (a warm-up, a stall and the "
                  "queue it leaves draining show here; the percentiles blur them):", ""]
        lines += [f"* {t}: " + " ".join(f"{x:g}" for x in xs) for t, xs in courses] + [""]
    problems = [(t, k, v) for t, e in doc["targets"].items() for k, v in (e.get("errors") or {}).items()]
    skipped = [(t, k, v) for t, e in doc["targets"].items() for k, v in (e.get("skipped") or {}).items()]
    if problems or skipped:
        lines += ["## Not measured", ""]
        lines += [f"* {t} / {k}: error — {v.splitlines()[0][:300]}" for t, k, v in problems]
        lines += [f"* {t} / {k}: {v}" for t, k, v in skipped]
        lines.append("")
    return "\n".join(lines)


def print_table(doc: dict, console: Console) -> None:
    peers = _peers(doc)
    table = Table(title=f"Pigeon vs peers ({doc['plan']} run) — peer cells: value (Pigeon ÷ peer)")
    table.add_column("figure")
    table.add_column("pigeon", justify="right")
    for t in peers:
        table.add_column(t, justify="right")
    for label, cells in _rows(doc):
        table.add_row(label, *cells)
    console.print(table)
    crows, pairs = cluster_rows(doc)
    if crows:
        t3 = Table(title="replicated (3 members each): first / second (first ÷ second)")
        t3.add_column("figure")
        for a, b in pairs:
            t3.add_column(f"{a} / {b}", justify="right")
        for label, cells in crows:
            t3.add_row(label, *cells)
        console.print(t3)
    t2 = Table(title="servers and clients")
    for c in ("target", "server", "durable", "driven by", "other load", "disk busy"):
        t2.add_column(c)
    for row in _descriptions(doc):
        t2.add_row(*row)
    console.print(t2)
    for t, e in doc["targets"].items():
        for k, v in (e.get("errors") or {}).items():
            console.print(f"[red]{t} / {k}: {v.splitlines()[0][:300]}")
        for line in latency_caveats(t, (e.get("results") or {}).get("latency") or {}):
            console.print(f"[yellow]{line}")


def latency_caveats(target: str, r: dict) -> list[str]:
    """What the latency figures of `target` leave out: messages not received within the run (a stream the
    server ended holds them until their leases run out), publishes the server refused and got again."""
    out = []
    if r.get("received") is not None and r.get("sent") and r["received"] < r["sent"]:
        out.append(f"{target} / latency: {r['received']:,} of {r['sent']:,} messages received within the run "
                   f"(the percentiles are of those)")
    if r.get("stream_errors"):
        out.append(f"{target} / latency: streams the server ended: "
                   + ", ".join(f"{code} {n}" for code, n in sorted(r["stream_errors"].items())))
    if r.get("publish_retries"):
        out.append(f"{target} / latency: {r['publish_retries']:,} publishes refused and sent again "
                   f"(their wait counted)")
    return out


# chart panels: (title, unit, better, log scale, [(series label, results key, field)])
PANELS = [
    ("durable publish, 1 KiB messages", "msg/s", "higher", False,
     [("1,000 per request", "publish_b1000", "msgs_per_s"), ("100 per request", "publish_b100", "msgs_per_s")]),
    ("consume with acks", "msg/s", "higher", False, [("drain the backlog", "consume", "msgs_per_s")]),
    ("publish and consume at once, 1 KiB messages", "msg/s", "higher", False,
     [("publish", "mixed", "publish_msgs_per_s"), ("consume", "mixed", "consume_msgs_per_s")]),
    ("publish→receive latency at 1,000 msg/s", "ms", "lower", True,
     [("p50", "latency", "p50_ms"), ("p99", "latency", "p99_ms"), ("p999", "latency", "p999_ms"),
      ("publish-ack p50", "latency", "ack_p50_ms"), ("publish-ack p99", "latency", "ack_p99_ms")]),
    ("RAM per backlogged 100 B message", "B", "lower", False, [("backlog", "backlog", "bytes_per_msg")]),
    ("restart (kill -9) to serving the backlog", "s", "lower", False, [("restart", "restart", "seconds")]),
    ("ordering keys (100 B messages)", "msg/s", "higher", False,
     [("publish", "ordered", "publish_msgs_per_s"), ("consume", "ordered", "consume_msgs_per_s")]),
    ("many clients at once (beside: few clients, the same request size)", "msg/s", "higher", False,
     [("publish", "connections", "publish_msgs_per_s"), ("receive", "connections", "receive_msgs_per_s"),
      ("few: publish", "connections_few", "publish_msgs_per_s"),
      ("few: consume", "connections_few", "consume_msgs_per_s")]),
]


def chart(doc: dict, path: str) -> bool:
    """One horizontal bar panel per figure (series side by side), Pigeon in orange; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [p for p in PANELS if any(value(doc, t, k, f) is not None for t in doc["targets"] for _, k, f in p[4])]
    if not panels:
        return False
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 3.9 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (title, unit, better, log, series) in zip(axes.flat, panels):
        names = [t for t in doc["targets"] if any(value(doc, t, k, f) is not None for _, k, f in series)]
        height = 0.8 / len(series)
        alphas = [1.0 - 0.7 * i / max(1, len(series) - 1) for i in range(len(series))]  # as many as the series
        for si, (label, key, field) in enumerate(series):
            for ni, t in enumerate(names):
                v = value(doc, t, key, field)
                if v is None:
                    continue
                y = ni - 0.4 + height * (si + 0.5)
                ax.barh(y, v, height=height * 0.92, color="#d9480f" if t == "pigeon" else "#5c6670",
                        alpha=alphas[si], label=label if ni == 0 or (t == names[0]) else None)
                ax.text(v, y, " " + fmt(v, unit) + (f" {label}" if len(series) > 1 else ""), va="center",
                        fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        for tick in ax.get_yticklabels():
            if tick.get_text() == "pigeon":
                tick.set_fontweight("bold")
        ax.set_ylim(max(len(names), 3) - 0.5, -0.5)
        if log:
            ax.set_xscale("log")
        ax.set_title(f"{title} — {unit}, {better} is better" + (" (log scale)" if log else ""), fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
        ax.margins(x=0.3)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    m = doc["machine"]
    fig.suptitle(f"Pigeon (orange) vs peers — {doc['when'][:10]}, {m['cores']} cores, {doc['plan']} run",
                 fontsize=11)
    caveats = [f"{t}: {e['durable']}" for t, e in doc["targets"].items()
               if "missing" not in e and e.get("durable", "yes").startswith("no")]
    if caveats:
        fig.text(0.01, 0.005, "Not durable before the acknowledgement — " + "; ".join(caveats), fontsize=8,
                 color="#5c6670")
    fig.tight_layout(rect=(0, 0.015, 1, 0.975))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write(doc: dict, stem: str, views=None) -> list[str]:
    """Write <stem>.json, and <stem>.md and <stem>.png with `views` (default write_views); returns the paths
    written."""
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return [stem + ".json", *(views or write_views)(doc, stem)]


def write_views(doc: dict, stem: str) -> list[str]:
    """Write <stem>.md and <stem>.png from a results document."""
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    return [stem + ".md"] + ([stem + ".png"] if chart(doc, stem + ".png") else [])
