#!/usr/bin/env python3
"""phases.py	Per-request phases from a prefetch timeline (sitecustomize.py) with the client's marks.

usage: tools/prefetch_timeline/phases.py TIMELINE [--kinds l1,l2,l2_again,uncached]

Reads the file that `benchmarks/ttft_kvtier_vs_lmcache.py --timeline FILE` wrote (the LMCache servers' events and
the client's `send <backend>:<kind>` / `first_token <backend>:<kind> <ms>` marks; one stack at a time, so every
server event between a send and its first token belongs to that request) and prints, per backend and request kind,
the median and p90 (nearest rank) of:
  arrive    send -> LookupModule.lookup begins in the LMCache server (vLLM's scheduler, the MP round trip)
  lookup    submit_prefetch_request -> the L2 adapter's lookup result taken (query_lookup_and_lock_result)
  load      submit_load_task -> its result taken (query_load_result); 0 when nothing was loaded
  prefetch  submit_prefetch_request -> PrefetchController._finish_request
  rest      _finish_request -> first token (retrieve into vLLM, the forward pass, the stream)
  ttft      send -> first token, as the client measured it
and how many of the requests touched kvtier's pools or tiers (store or load tasks, puts, reads) in that window.

example (2 cores, other people's benchmarks running):
  $ tools/prefetch_timeline/phases.py /var/tmp/tl.log --kinds l1
  backend     kind      n   arrive      lookup      load        prefetch    rest        ttft       puts loads
  kvtier      l1       20   9.1/12.6    0.4/1.1     0.0/0.0     1.4/2.9     23.0/31.0   34.6/54.3     12     0
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict


def nearest_rank(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)] if s else float("nan")


def windows(lines: list[tuple[int, str, str, str]]):
    """(backend, kind, ttft_ms, events in the window) for every client send that got its first token."""
    open_send = None
    for i, (t, who, ev, extra) in enumerate(lines):
        if who != "client":
            continue
        if ev == "send":
            open_send = (i, t, extra)
        elif ev == "first_token" and open_send is not None:
            label = extra.split()[0]
            if label == open_send[2]:
                backend, _, kind = label.partition(":")
                yield backend, kind, float(extra.split()[1]), lines[open_send[0] : i + 1]
            open_send = None


def phases(win) -> dict[str, float] | None:
    first: dict[str, int] = {}
    counts: dict[str, int] = defaultdict(int)
    for t, _who, ev, _extra in win:
        first.setdefault(ev, t)
        counts[ev] += 1
    t_send, t_tok = win[0][0], win[-1][0]
    need = (
        "LookupModule.lookup.begin",
        "PrefetchController.submit_prefetch_request",
        "PrefetchController._finish_request",
    )
    if not all(k in first for k in need):
        return None
    sub, fin = first[need[1]], first[need[2]]
    look = next((first[k] for k in first if k.endswith(".query_lookup_and_lock_result")), fin)
    load_sub = next((first[k] for k in first if k.endswith(".submit_load_task")), None)
    load_done = next((first[k] for k in first if k.endswith(".query_load_result")), None)
    return {
        "arrive": (first[need[0]] - t_send) / 1e6,
        "lookup": (look - sub) / 1e6,
        "load": (load_done - load_sub) / 1e6 if load_sub and load_done else 0.0,
        "prefetch": (fin - sub) / 1e6,
        "rest": (t_tok - fin) / 1e6,
        "puts": counts["KvtierBackend.put.begin"] + counts["FSL2Adapter.submit_store_task"],
        "loads": counts["KvtierBackend.get_into.begin"] + counts["FSL2Adapter.submit_load_task"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("timeline")
    ap.add_argument("--kinds", default="l1,l2,l2_again,uncached")
    a = ap.parse_args()
    try:
        with open(a.timeline) as fh:
            raw = [line.split(None, 3) for line in fh if line.strip()]
    except OSError as exc:
        print(f"phases.py: cannot read {a.timeline}: {exc.strerror}", file=sys.stderr)
        return 2
    lines = sorted((int(p[0]), p[1], p[2], p[3].strip() if len(p) > 3 else "") for p in raw if len(p) >= 3)
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for backend, kind, ttft, win in windows(lines):
        ph = phases(win)
        if ph is not None:
            rows[(backend, kind)].append({**ph, "ttft": ttft})
    cols = ("arrive", "lookup", "load", "prefetch", "rest", "ttft")
    print(f"{'backend':11} {'kind':8} {'n':>3}   " + "".join(f"{c:12}" for c in cols) + " puts loads")
    for kind in a.kinds.split(","):
        for (backend, k), rs in sorted(rows.items()):
            if k != kind:
                continue
            cells = "".join(
                f"{nearest_rank([r[c] for r in rs], 0.5):.1f}/{nearest_rank([r[c] for r in rs], 0.9):.1f}".ljust(12)
                for c in cols
            )
            puts = sum(r["puts"] > 0 for r in rs)
            loads = sum(r["loads"] > 0 for r in rs)
            print(f"{backend:11} {kind:8} {len(rs):3}   {cells} {puts:5} {loads:5}")
    print("cells: p50/p90 in ms; puts, loads: requests during which the L2 adapter stored or loaded anything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
