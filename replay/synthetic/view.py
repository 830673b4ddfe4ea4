"""What a person sees during and after `kvtier bench`: a live line while it runs, a summary table at the end."""

from __future__ import annotations

import json

from rich.table import Table

from kvconnector.files import atomic_path
from kvconnector.units import GB

from ..outputs._common import sla_verdict_text
from ..outputs.progress import LiveLine, StepBars
from ..outputs.tables import _ROUND_COLS as ROUND_COLUMNS
from ..outputs.tables import rows_table, target_hit_rate_table
from ..outputs.terminal import console as terminal_console

# Set for each process of --num-clients: the file its live figures go to, for the parent's aggregate view.
STATUS_ENV = "KVTIER_CLIENT_STATUS"

_VERDICT = {"met": "met", "missed": "MISSED", "no data": "no data"}


class LiveView:
    """A one-line live status (elapsed, requests, read/write GB/s over the last interval, tier occupancy) on stderr
    (outputs.progress.LiveLine). On a non-terminal it prints a plain line every `plain_every_s` seconds instead."""

    def __init__(
        self, duration_s: float, enabled: bool = True, plain_every_s: float = 10.0, status_file: str | None = None
    ) -> None:
        # A multi-client parent reads each client's latest snapshot from here for its aggregate view.
        self.status_file = status_file
        self.duration_s = duration_s
        self._line = LiveLine(enabled, plain_every_s=plain_every_s)
        self._prev: dict | None = None

    def __enter__(self) -> LiveView:
        self._line.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._line.__exit__(*exc)

    def update(self, snap: dict) -> None:
        if self.status_file:
            write_status(self.status_file, snap)
        prev = self._prev or {"t_s": 0.0, "read_bytes": 0, "written_bytes": 0}
        self._prev = snap
        dt = max(snap["t_s"] - prev["t_s"], 1e-9)
        rd = (snap["read_bytes"] - prev["read_bytes"]) / GB / dt
        wr = (snap["written_bytes"] - prev["written_bytes"]) / GB / dt
        tiers = "  ".join(f"{name} {t['entries']}e/{t['used_bytes'] / GB:.2f}GB" for name, t in snap["tiers"].items())
        users = f"users {snap['users']}  " if snap.get("users") else ""
        if snap.get("round"):  # --prefix-model chained
            last = snap.get("last_round")
            users += f"round {snap['round']}  " + (
                f"(round {last['round']} hit {last['hit_rate'] or 0:.2f} of ideal {last['ideal_hit_rate'] or 0:.2f})  "
                if last
                else ""
            )
        self._line.show(
            f"{snap['t_s']:6.1f}/{self.duration_s:g}s  {users}requests {snap['requests']:>7}  "
            f"read {rd:6.2f} GB/s  write {wr:6.2f} GB/s  |  {tiers}"
        )


def write_status(path: str, snap: dict) -> None:
    # Whole or not at all: the parent process reads these files while the client rewrites them.
    with atomic_path(path, suffix=".status.tmp") as tmp, open(tmp, "w") as f:
        json.dump(snap, f)


class SetupProgress(StepBars):
    """Progress of set-up steps (preconditioning, RAG ingest, pre-population), which can take a while: a bar per step
    on stderr (outputs.progress.StepBars), `update(step, done, total)`."""


def _ms(d: dict, key: str) -> str:
    return f"{d.get(key, 0):.2f}"


def summary_tables(doc: dict) -> list[Table]:
    s = doc["summary"]
    run = Table(
        title=f"kvtier bench: {doc['model']['name']} ({doc['model']['bytes_per_token']:,} B/token), "
        f"status {doc['status']}"
        # which semantics ran (a merged or older document may lack these keys)
        + (f", {doc['request_model']} request model" if doc.get("request_model") else "")
        + (f", sizes in {doc['size_unit']}" if doc.get("size_unit") else "")
        + (", trace-only (no device I/O)" if doc.get("trace_only") else ""),
        show_header=False,
    )
    run.add_column(style="bold")
    run.add_column(justify="right")
    run.add_row("elapsed", f"{s['elapsed_time']:.1f} s")
    run.add_row("requests completed", f"{s['total_requests']:,} ({s['requests_per_second']:.1f}/s)")
    run.add_row("generated tokens/s (wall clock)", f"{s['avg_throughput_tokens_per_sec']:,.0f}")
    run.add_row("prompt + generated tokens/s", f"{s['prompt_and_generated_tokens_per_sec']:,.0f}")
    if doc.get("trace_only"):  # no device I/O: storage time is ~0 and this ratio means nothing
        run.add_row("tokens / storage I/O s", "- (trace-only)")
    else:
        run.add_row("tokens / storage I/O s", f"{s['storage_throughput_tokens_per_sec']:,.0f}")
    run.add_row("storage tier tokens/s", f"{s['storage_tier_tokens_per_sec']:,.0f}")
    wl = doc.get("workload", {})
    if wl.get("source") and wl["source"] != "synthetic":
        run.add_row("workload", f"{wl['source']}" + (" (timed)" if wl.get("timed") else ""))
    pc = s.get("prefix_cache_stats", {})
    if pc.get("enabled") and pc["hits"] + pc["misses"]:
        run.add_row(
            "system-prompt prefix hit rate", f"{pc['hit_rate']:.1%} ({pc['bytes_saved_gb']:.2f} GB not rewritten)"
        )
    rag = s.get("rag_stats", {})
    if rag.get("enabled"):
        run.add_row("RAG queries / chunk hit rate", f"{rag['queries']:,} / {rag['chunk_hit_rate']:.1%}")
    auto = s.get("autoscaling_summary")
    if auto:
        run.add_row(
            "autoscaler",
            f"{auto['mode']}: final {auto['final_users']} users; peak "
            f"{auto['peak_throughput_tokens_per_sec']:,.0f} tok/s at {auto['peak_users']} users",
        )
    cs = s["cache_stats"]
    run.add_row(
        "cache hit rate (GPU/CPU)",
        f"{cs['cache_hit_rate']:.1%}; any tier {cs['store_hit_rate']:.1%} "
        f"({cs['cache_hits']:,} hits, {cs['cache_misses']:,} misses)",
    )
    if s["multi_turn_stats"]["enabled"]:
        mt = s["multi_turn_stats"]
        tries = mt["previous_turn_hits"] + mt["previous_turn_misses"]
        run.add_row(
            "previous-turn hit rate", f"{mt['hit_rate']:.1%} of {tries:,}" if tries else "n/a (no later turns yet)"
        )
    blk = doc.get("block_device")
    if blk:
        run.add_row(
            f"block device {blk['device']} (whole device)",
            f"read {blk['read_bytes'] / GB:.2f} GB ({blk['read_gbps']:.2f} GB/s), "
            f"written {blk['written_bytes'] / GB:.2f} GB ({blk['write_gbps']:.2f} GB/s)",
        )
    proc = doc.get("process")
    if proc:
        moved = (proc["read_bytes"] + proc["written_bytes"]) / 2**30
        per_gib = proc.get("cpu_s_per_gib_moved")
        run.add_row(
            "this process: CPU, block I/O",
            f"{proc['cpu_user_s'] + proc['cpu_system_s']:.1f} CPU-s ({proc['cpu_system_s']:.1f} system), "
            f"{moved:.2f} GiB" + (f": {per_gib:.3f} CPU-s/GiB" if per_gib is not None else ""),
        )

    lat = Table(title="request latency (ms)")
    for col in ("", "mean", "p50", "p95", "p99", "p99.9"):
        lat.add_column(col, justify="right" if col else "left")
    for name, key in (
        ("end to end", "end_to_end_latency_ms"),
        ("storage I/O", "storage_io_latency_ms"),
        ("generation", "generation_latency_ms"),
        ("queue wait", "queue_wait_latency_ms"),
    ):
        d = s[key]
        lat.add_row(name, _ms(d, "mean"), _ms(d, "p50"), _ms(d, "p95"), _ms(d, "p99"), _ms(d, "p999"))

    tiers = Table(title="tier operations (ms; host = CPU work, dev = inside the I/O calls or the copy)")
    for col in ("tier op", "ops", "GB", "GB/s", "p50", "p99", "host p99", "dev p99"):
        tiers.add_column(col, justify="left" if col == "tier op" else "right")
    elapsed = max(s["elapsed_time"], 1e-9)
    for name, t in doc["tiers"].items():
        run.add_row(
            f"{name} tier ({t.get('io_mode', t['kind'])})",
            f"{t['entries']:,} entries, {t['used_bytes'] / GB:.2f} of {t['capacity_bytes'] / GB:.1f} GB",
        )
        for op in ("read", "write"):
            o = t[op]
            tiers.add_row(
                f"{name} {op}",
                f"{o['ops']:,}",
                f"{o['bytes'] / GB:.2f}",
                f"{o['bytes'] / GB / elapsed:.2f}",
                _ms(o["latency_ms"], "p50"),
                _ms(o["latency_ms"], "p99"),
                _ms(o["host_ms"], "p99"),
                _ms(o["device_ms"], "p99"),
            )
    tables = [run, lat, tiers]
    qos = s.get("qos_metrics") or {}
    if qos:
        q = Table(title="QoS classes (service latency = end to end minus simulated generation)")
        for col in ("class", "requests", "p95 ms", "target", "p99 ms", "target", "SLA"):
            q.add_column(col, justify="left" if col in ("class", "SLA") else "right")
        for name, c in sorted(qos.items(), key=lambda kv: -kv[1]["priority"]):
            sv = c["service_latency_ms"]
            q.add_row(
                name,
                f"{c['requests']:,}",
                _ms(sv, "p95"),
                f"{c['sla']['target_p95_ms']:g}",
                _ms(sv, "p99"),
                f"{c['sla']['target_p99_ms']:g}",
                _VERDICT[sla_verdict_text(c)],
            )
        tables.append(q)
    steps = doc.get("autoscaling_stats") or []
    if steps:
        a = Table(title="autoscaler steps")
        for col in ("t s", "users", "tok/s", "saturation", "action", "reason"):
            a.add_column(col, justify="left" if col in ("action", "reason") else "right")
        for st in steps[-12:]:
            a.add_row(
                f"{st['t_s']:.0f}",
                str(st["users"]),
                f"{st['throughput_tokens_per_sec']:,.0f}",
                f"{st['saturation']:.2f}",
                st["action"],
                st["reason"],
            )
        tables.append(a)
    if doc.get("rounds"):  # --prefix-model chained: the same per-round table as kvtier replay's
        tables.append(rows_table("per round (chained prefix)", doc["rounds"], ROUND_COLUMNS))
    if doc.get("trace"):
        tables.append(trace_table(doc["trace"]))
        if doc["trace"].get("target_hit_rate"):
            tables.append(target_hit_rate_table(doc["trace"]["target_hit_rate"], "the store's hits"))
    return tables


def trace_table(trace: dict) -> Table:
    """--source: each tier's share of the prompt tokens found in it, measured and as kvtier plan --trace predicts."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f}%"

    blocks = f"{trace['requests']} requests, {trace['block_tokens']}-token blocks"
    t = Table(title=f"{trace['source']} trace: hit rate per tier ({blocks})")
    for col in ("tier", "capacity tokens", "measured", "predicted"):
        t.add_column(col, justify="left" if col == "tier" else "right")
    for row in trace["tiers"]:
        t.add_row(row["tier"], f"{row['capacity_tokens']:,}", pct(row["hit_rate"]), pct(row["predicted_hit_rate"]))
    t.add_row("all", "", pct(trace["hit_rate"]), pct(trace["predicted_hit_rate"]))
    return t


def print_summary(doc: dict, output_path: str | None, extra: list[str] = ()) -> None:
    console = terminal_console()
    for table in summary_tables(doc):
        console.print(table)
    for note in doc.get("notes", []):
        console.print(f"note: {note}")
    if output_path:
        console.print(f"results: {output_path}")
    for path in extra:
        console.print(f"wrote: {path}")
