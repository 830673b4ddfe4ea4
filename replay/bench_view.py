"""What a person sees during and after `kvtier bench`: a live line while it runs, a summary table at the end."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

GB = 1e9


class LiveView:
    """A one-line live status (elapsed, requests, read/write GB/s over the last interval, tier occupancy).
    On a non-terminal it prints a plain line every `plain_every_s` seconds instead."""

    def __init__(self, duration_s: float, enabled: bool = True, plain_every_s: float = 10.0) -> None:
        self.console = Console(stderr=True)
        self.duration_s = duration_s
        self.enabled = enabled
        self.plain_every_s = plain_every_s
        self._live: Live | None = None
        self._prev: dict | None = None
        self._last_plain = 0.0

    def __enter__(self) -> "LiveView":
        if self.enabled and self.console.is_terminal:
            self._live = Live(Text("starting..."), console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live:
            self._live.__exit__(*exc)

    def update(self, snap: dict) -> None:
        prev = self._prev or {"t_s": 0.0, "read_bytes": 0, "written_bytes": 0}
        self._prev = snap
        dt = max(snap["t_s"] - prev["t_s"], 1e-9)
        rd = (snap["read_bytes"] - prev["read_bytes"]) / GB / dt
        wr = (snap["written_bytes"] - prev["written_bytes"]) / GB / dt
        tiers = "  ".join(f"{name} {t['entries']}e/{t['used_bytes'] / GB:.2f}GB" for name, t in snap["tiers"].items())
        line = (f"{snap['t_s']:6.1f}/{self.duration_s:g}s  requests {snap['requests']:>7}  "
                f"read {rd:6.2f} GB/s  write {wr:6.2f} GB/s  |  {tiers}")
        if self._live:
            self._live.update(Text(line))
        elif self.enabled and time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            print(line, file=sys.stderr, flush=True)


def _ms(d: dict, key: str) -> str:
    return f"{d.get(key, 0):.2f}"


def summary_tables(doc: dict) -> list[Table]:
    s = doc["summary"]
    run = Table(title=f"kvtier bench: {doc['model']['name']} ({doc['model']['bytes_per_token']:,} B/token), "
                      f"status {doc['status']}", show_header=False)
    run.add_column(style="bold")
    run.add_column(justify="right")
    run.add_row("elapsed", f"{s['elapsed_time']:.1f} s")
    run.add_row("requests completed", f"{s['total_requests']:,} ({s['requests_per_second']:.1f}/s)")
    run.add_row("tokens/s (prompt + generated)", f"{s['avg_throughput_tokens_per_sec']:,.0f}")
    run.add_row("storage tier tokens/s", f"{s['storage_throughput_tokens_per_sec']:,.0f}")
    cs = s["cache_stats"]
    run.add_row("cache hit rate", f"{cs['cache_hit_rate']:.1%} ({cs['cache_hits']:,} hits, {cs['cache_misses']:,} misses)")
    if s["multi_turn_stats"]["enabled"]:
        mt = s["multi_turn_stats"]
        tries = mt["previous_turn_hits"] + mt["previous_turn_misses"]
        run.add_row("previous-turn hit rate", f"{mt['hit_rate']:.1%} of {tries:,}" if tries else "n/a (no later turns yet)")
    blk = doc.get("block_device")
    if blk:
        run.add_row(f"block device {blk['device']} (whole device)",
                    f"read {blk['read_bytes'] / GB:.2f} GB ({blk['read_gbps']:.2f} GB/s), "
                    f"written {blk['written_bytes'] / GB:.2f} GB ({blk['write_gbps']:.2f} GB/s)")

    lat = Table(title="request latency (ms)")
    for col in ("", "mean", "p50", "p95", "p99", "p99.9"):
        lat.add_column(col, justify="right" if col else "left")
    for name, key in (("end to end", "end_to_end_latency_ms"), ("storage I/O", "storage_io_latency_ms"),
                      ("generation", "generation_latency_ms"), ("queue wait", "queue_wait_latency_ms")):
        d = s[key]
        lat.add_row(name, _ms(d, "mean"), _ms(d, "p50"), _ms(d, "p95"), _ms(d, "p99"), _ms(d, "p999"))

    tiers = Table(title="tier operations (ms; host = CPU work, dev = inside the I/O calls or the copy)")
    for col in ("tier op", "ops", "GB", "GB/s", "p50", "p99", "host p99", "dev p99"):
        tiers.add_column(col, justify="left" if col == "tier op" else "right")
    elapsed = max(s["elapsed_time"], 1e-9)
    for name, t in doc["tiers"].items():
        run.add_row(f"{name} tier ({t.get('io_mode', t['kind'])})",
                    f"{t['entries']:,} entries, {t['used_bytes'] / GB:.2f} of {t['capacity_bytes'] / GB:.1f} GB")
        for op in ("read", "write"):
            o = t[op]
            tiers.add_row(f"{name} {op}", f"{o['ops']:,}", f"{o['bytes'] / GB:.2f}", f"{o['bytes'] / GB / elapsed:.2f}",
                          _ms(o["latency_ms"], "p50"), _ms(o["latency_ms"], "p99"), _ms(o["host_ms"], "p99"),
                          _ms(o["device_ms"], "p99"))
    return [run, lat, tiers]


def print_summary(doc: dict, output_path: str | None) -> None:
    console = Console()
    for table in summary_tables(doc):
        console.print(table)
    for note in doc.get("notes", []):
        console.print(f"note: {note}")
    if output_path:
        console.print(f"results: {output_path}")
