"""Results of a replay: the JSON summary (vLLM bench's metric names where they mean the same), per-round rows for
long sessions, goodput against SLOs, and the per-request rows the detail files are written from.

Every percentile comes from a mergeable HDR histogram (`kvconnector.histogram.LatencyHistogram`); per-request figures
appear only in the detail files. The files themselves (JSONL, CSV, PNG) and the closing table are written by
replay/outputs/, which `kvtier bench` uses too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvconnector.histogram import LatencyHistogram
from replay.openai.client import RequestRecord
from replay.openai.driver import RunState
from replay.openai.server_metrics import delta, delta_by, derive
from replay.sources.target_hit_rate import TargetShape

__all__ = ["build_summary", "media_identity", "parse_slo", "request_rows", "run_failure"]

_SLO_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft_ms=500,tpot_ms=50' -> dict; ValueError with a clear message otherwise."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in _SLO_KEYS:
            raise ValueError(f"--slo: expected KEY=MS with KEY in {', '.join(_SLO_KEYS)}, got {part!r}")
        try:
            out[key] = float(val)
        except ValueError:
            raise ValueError(f"--slo: {key} needs a number of milliseconds, got {val!r}") from None
        if out[key] <= 0:
            raise ValueError(f"--slo: {key} must be > 0")
    return out


class _Dist:
    """A LatencyHistogram plus the exact sum: percentiles from the histogram, the mean without walking its buckets."""

    __slots__ = ("hist", "sum_ns")

    def __init__(self) -> None:
        self.hist = LatencyHistogram()
        self.sum_ns = 0

    def record_ns(self, v: int) -> None:
        v = max(0, int(v))
        self.hist.record_ns(v)
        self.sum_ns += v

    def summary(self, pcts: tuple[float, ...]) -> dict[str, float]:
        n = self.hist.count
        out: dict[str, float] = {"count": n, "mean": round(self.sum_ns / n / 1e6, 4) if n else 0.0}
        for p in pcts:
            out["p" + f"{p:g}".replace(".", "")] = round(self.hist.percentile_ms(p), 4)
        out["max"] = round(self.hist.max_ms(), 4)
        return out


def _record_hists(recs: list[RequestRecord]) -> dict[str, _Dist]:
    hs = {k: _Dist() for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms")}
    for r in recs:
        if r.dispatched_ns and r.scheduled_ns:
            hs["send_lag_ms"].record_ns(r.dispatched_ns - r.scheduled_ns)
        if r.slot_ns and r.dispatched_ns:
            hs["queue_ms"].record_ns(r.slot_ns - r.dispatched_ns)
        if not r.success:
            continue
        hs["ttft_ms"].record_ns(r.first_token_ns - r.sent_ns)
        hs["e2el_ms"].record_ns(r.last_chunk_ns - r.sent_ns)
        tpot = r.tpot_ms()
        if tpot is not None:
            hs["tpot_ms"].record_ns(int(tpot * 1e6))
        for gap in r.itl_ns():
            hs["itl_ms"].record_ns(gap)
    return hs


def _goodput(recs: list[RequestRecord], slo: dict[str, float], duration_s: float) -> dict[str, Any] | None:
    if not slo:
        return None
    good = 0
    for r in recs:
        if not r.success:
            continue
        ok = True
        for key, limit in slo.items():
            if key == "itl_ms":
                v = max((g / 1e6 for g in r.itl_ns()), default=0.0)
            else:
                v = getattr(r, key)()
            if v is not None and v > limit:
                ok = False
                break
        good += ok
    return {
        "slo": slo,
        "good_requests": good,
        "request_goodput": round(good / duration_s, 4) if duration_s else 0.0,
        "good_fraction": round(good / len(recs), 4) if recs else 0.0,
    }


def _reusable_tokens(
    recs: list[RequestRecord], block_size: int, prev: dict[str, tuple[int, int]]
) -> tuple[int, int, int]:
    """(reusable, reusable without the answers, prompt) tokens of a round: the part of each prompt that was sent
    before in its session (previous prompt plus the previous answer; or the previous prompt only, for a cache that
    keeps prefill KV only, as LMCache does), in whole blocks, never the last prompt token (a server always computes
    it); the ideal hit rates are their ratios to the prompt tokens."""
    reusable = prompt_only = total = 0
    for r in recs:
        if not r.success or r.prompt_tokens is None:
            continue
        with_answer, without = prev.get(r.session_id, (0, 0))
        for before, acc in ((with_answer, 0), (without, 1)):
            blocks = max(0, min(before, r.prompt_tokens - 1) // block_size * block_size)
            if acc:
                prompt_only += blocks
            else:
                reusable += blocks
        total += r.prompt_tokens
        prev[r.session_id] = (r.prompt_tokens + (r.output_tokens or 0), r.prompt_tokens)
    return reusable, prompt_only, total


def build_summary(
    state: RunState,
    meta: dict[str, Any],
    *,
    percentiles: tuple[float, ...],
    slo: dict[str, float],
    block_size: int | None = None,
    kv_bytes_per_token: float | None = None,
    kv_bytes_metric: str | None = None,
) -> dict[str, Any]:
    recs = state.records
    ok = [r for r in recs if r.success]
    sent = [r for r in recs if r.sent_ns]
    # The run's wall time, start of the schedule to the end of its last request (failed ones included); the records'
    # own timestamps only when the driver did not say (a request that timed out has none past its send).
    end_ns = state.end_ns or max((r.last_chunk_ns or r.first_byte_ns or r.sent_ns for r in sent), default=state.t0_ns)
    duration_s = max((end_ns - state.t0_ns) / 1e9, 1e-9) if sent else 0.0
    hs = _record_hists(recs)
    out_tokens = sum(r.n_output_tokens() for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    errors: dict[str, int] = {}
    for r in recs:
        if not r.success and r.error_kind:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    first_sent = min((r.sent_ns for r in sent), default=0)
    last_sent = max((r.sent_ns for r in sent), default=0)
    achieved = (len(sent) - 1) / ((last_sent - first_sent) / 1e9) if len(sent) > 1 and last_sent > first_sent else None
    sched = sorted(r.scheduled_ns for r in sent)
    sched_rate = (len(sched) - 1) / ((sched[-1] - sched[0]) / 1e9) if len(sched) > 1 and sched[-1] > sched[0] else None
    s: dict[str, Any] = dict(meta)
    s.update(
        {
            "completed": len(ok),
            "failed": len(recs) - len(ok),
            "not_sent": len(recs) - len(sent),
            "scheduled": state.scheduled_total,
            "warmup_requests": len(state.warmup_records),
            "errors_by_kind": errors,
            "aborted": state.aborted,
            "window_closed": state.window_closed,
            "sessions_cut_by_error": state.sessions_cut_by_error,
            "duration_s": round(duration_s, 4),
            "request_throughput": round(len(ok) / duration_s, 4) if duration_s else 0.0,
            "output_throughput": round(out_tokens / duration_s, 4) if duration_s else 0.0,
            "total_token_throughput": round((in_tokens + out_tokens) / duration_s, 4) if duration_s else 0.0,
            "total_input_tokens": in_tokens,
            "total_output_tokens": out_tokens,
            "achieved_rate": round(achieved, 4) if achieved else None,
            "schedule_rate": round(sched_rate, 4) if sched_rate else None,
        }
    )
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "send_lag_ms", "queue_ms"):
        s[key] = hs[key].summary(percentiles)
    s["send_lag_note"] = "dispatch time minus the absolute schedule deadline; queue_ms is the wait for a slot after it"
    s["histograms"] = {k: h.hist.encode() for k, h in hs.items()}
    targets = [(r.target_prompt_tokens, r.prompt_tokens) for r in ok if r.prompt_tokens and r.target_prompt_tokens]
    if targets:
        s["prompt_tokens_vs_target_mean"] = round(sum(a for _, a in targets) / sum(t for t, _ in targets), 4)
    s["goodput"] = _goodput(recs, slo, duration_s)
    s["run_failed"] = run_failure(len(ok), errors)
    if state.metrics_start is not None and state.metrics_last is not None:
        s["server_metrics"] = derive(state.metrics_start, state.metrics_last, kv_bytes_per_token, kv_bytes_metric)
    else:
        s["server_metrics"] = None
    if s.get("target_hit_rate"):  # --target-hit-rate: the rate the server measured beside the target
        shape = TargetShape.from_dict(s["target_hit_rate"])
        s["target_hit_rate"] = {
            **s["target_hit_rate"],
            "planned_hit_rate_of_completed": round(shape.first(len(ok)).hit_rate, 6),
            "measured_hit_rate": (s["server_metrics"] or {}).get("hit_rate"),
        }
    if state.round_snapshots:
        server_block = state.metrics_start.block_size() if state.metrics_start else None
        if block_size is None:
            block_size = server_block or 16
        s["block_size"] = block_size
        s["rounds"] = _rounds(state, percentiles, block_size, kv_bytes_per_token, kv_bytes_metric)
    s["media_identity"] = media_identity(state, s.get("rounds"))
    return s


def run_failure(completed: int, errors_by_kind: dict[str, int]) -> str | None:
    """Why the run as a whole failed (the CLI then exits 1), or None. The rule: no request completed, or more requests
    failed than completed. Requests the run itself cancelled (end of the --duration window, Ctrl-C) are not failures
    of the server, but a run where nothing completed failed whatever the reason."""
    failed = sum(n for kind, n in errors_by_kind.items() if kind != "cancelled")
    if completed and failed <= completed:
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(errors_by_kind.items(), key=lambda kv: -kv[1])) or "none sent"
    what = f"{failed} of {completed + failed} requests failed" if failed else "no request completed"
    hint = ""
    if set(errors_by_kind) - {"cancelled"} == {"http_404"}:
        hint = "; check --base-url (the server root, or root/v1), --endpoint and --model"
    return f"{what} ({kinds}){hint}"


def _ratio(num: float | None, den: float | None, digits: int = 4) -> float | None:
    return round(num / den, digits) if num is not None and den else None


def _recomputed_tokens(m: dict[str, Any]) -> float | None:
    """Prompt tokens the server computed (not taken from a cache) over an interval, from its /metrics."""
    src = m.get("prompt_tokens_by_source")
    if src and src.get("local_compute") is not None:
        return src["local_compute"]
    if m.get("prefix_cache_queries") is not None:
        return (
            m["prefix_cache_queries"] - (m.get("prefix_cache_hits") or 0) - (m.get("external_prefix_cache_hits") or 0)
        )
    return None


def _rounds(state: RunState, pcts, block_size, kv_bytes_per_token, kv_bytes_metric) -> list[dict[str, Any]]:
    by_round: dict[int, list[RequestRecord]] = {}
    for r in state.records:
        if r.round_index is not None:
            by_round.setdefault(r.round_index, []).append(r)
    prev: dict[str, tuple[int, int]] = {}
    rows = []
    for idx, start, end, before, after in state.round_snapshots:
        recs = by_round.get(idx, [])
        ok = [r for r in recs if r.success]
        ttft, tpot = LatencyHistogram(), LatencyHistogram()
        ttft_ns = decode_ns = 0
        for r in ok:
            ttft.record_ns(r.first_token_ns - r.sent_ns)
            ttft_ns += r.first_token_ns - r.sent_ns
            decode_ns += max(0, r.last_chunk_ns - r.first_token_ns)
            if (t := r.tpot_ms()) is not None:
                tpot.record_ns(int(t * 1e6))
        m = derive(before, after, kv_bytes_per_token, kv_bytes_metric) if before and after else None
        prompt = sum(r.prompt_tokens or 0 for r in ok)
        reusable, prompt_only, counted = _reusable_tokens(ok, block_size, prev)
        ideal = round(reusable / counted, 6) if counted else None
        hit = m["hit_rate"] if m else None
        recomputed = _recomputed_tokens(m) if m else None
        # Excess recompute: prompt tokens computed beyond the ones no cache could have held (the unreusable tail).
        excess = max(0.0, recomputed - (counted - reusable)) if recomputed is not None and counted else None
        wall_s = (end - start) / 1e9
        # Each request's time to first token and its decode time, as shares of the round's wall clock, averaged over
        # the round's requests (they run together, so the shares of one request are what a user of the round sees).
        lived = len(ok) * (end - start)
        errors: dict[str, int] = {}
        for r in recs:
            if not r.success:
                errors[r.error_kind or "unknown"] = errors.get(r.error_kind or "unknown", 0) + 1
        rows.append(
            {
                "round": idx + 1,
                "requests": len(recs),
                "completed": len(ok),
                "errors": len(recs) - len(ok),
                "errors_by_kind": errors or None,
                "hit_rate": hit,
                "ideal_hit_rate": ideal,
                # the ideal of a cache that keeps prefill KV only (LMCache): the answers are computed again
                "ideal_hit_rate_prompt_only": round(prompt_only / counted, 6) if counted else None,
                "hit_to_ideal": _ratio(hit, ideal),
                "prefix_cache_hit_rate": m["prefix_cache_hit_rate"] if m else None,
                "external_hit_rate": m["external_prefix_cache_hit_rate"] if m else None,
                "ttft_p50_ms": round(ttft.percentile_ms(50), 3),
                "ttft_p95_ms": round(ttft.percentile_ms(95), 3),
                "tpot_p50_ms": round(tpot.percentile_ms(50), 3) if tpot.count else None,
                "requests_per_s": _ratio(len(ok), wall_s),
                "ttft_share": _ratio(ttft_ns, lived),
                "decode_share": _ratio(decode_ns, lived),
                "prompt_tokens_per_request": round(prompt / len(ok), 1) if ok else None,
                "reusable_tokens_per_request": round(reusable / len(ok), 1) if ok else None,
                "recomputed_tokens_per_request": round(recomputed / len(ok), 1)
                if recomputed is not None and ok
                else None,
                "excess_recompute_per_request": round(excess / len(ok), 1) if excess is not None and ok else None,
                "excess_recompute_share": _ratio(excess, reusable) if excess is not None else None,
                "kv_written_bytes": m["kv_written_bytes"] if m else None,
                "kv_bytes_by_tier": m["kv_bytes_by_tier"] if m else None,
                "prompt_tokens_by_tier": m["prompt_tokens_by_tier"] if m else None,
                "preemptions": m["preemptions"] if m else None,
                "wall_s": round(wall_s, 4),
            }
        )
    return rows


def media_identity(state: RunState, rounds: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """What went to each storage medium over the run, to check that two configurations did the same work (the "media
    identity" of LUISUAN's published GP7000 long-session measurement, replay/plan/README.md: total stores and loads per
    configuration, bytes into each tier): per kvtier tier the bytes and operations written and read
    (`kvtier_bytes_total` / `kvtier_ops_total` by the exporter's `tier` label), the backend's store and load events,
    LMCache's stored and hit tokens; and whether the rounds' per-tier bytes add up to the run's (every byte is in
    exactly one round). None without two snapshots."""
    a, b = state.metrics_start, state.metrics_last
    if a is None or b is None:
        return None
    tiers: dict[str, dict[str, float]] = {}
    for (tier, op), v in delta_by(a, b, "kvtier_bytes_total", "tier", "op").items():
        tiers.setdefault(tier, {})[f"bytes_{op}"] = v
    for (tier, op), v in delta_by(a, b, "kvtier_ops_total", "tier", "op").items():
        tiers.setdefault(tier, {})[f"ops_{op}"] = v
    events = {ev: v for (ev,), v in delta_by(a, b, "kvtier_backend_events_total", "event").items()}
    out: dict[str, Any] = {
        "tiers": tiers or None,
        "bytes_written": sum(t.get("bytes_write", 0.0) for t in tiers.values()) if tiers else None,
        "bytes_read": sum(t.get("bytes_read", 0.0) for t in tiers.values()) if tiers else None,
        "stores": events.get("store_ok"),
        "loads": events.get("load_hits"),
        "lmcache_stored_tokens": delta(a, b, "lmcache:num_stored_tokens"),
        "lmcache_hit_tokens": delta(a, b, "lmcache:num_hit_tokens"),
        # LMCache's MP server (0.5.6): every store goes through its memory (L1), so its chunk counters are the
        # stores and loads of a configuration without kvtier too
        "lmcache_l1_chunks_written": delta(a, b, "lmcache_mp_l1_write_chunks_total"),
        "lmcache_l1_chunks_read": delta(a, b, "lmcache_mp_l1_read_chunks_total"),
        "lmcache_l1_chunks_evicted": delta(a, b, "lmcache_mp_l1_evicted_chunks_total"),
        "lmcache_lookup_hit_tokens": delta(a, b, "lmcache_mp_lookup_hit_tokens_total"),
    }
    if rounds and tiers:
        summed: dict[str, float] = {}
        for r in rounds:
            for tier, ops in (r.get("kv_bytes_by_tier") or {}).items():
                summed[tier] = summed.get(tier, 0.0) + ops.get("write", 0.0)
        out["rounds_add_up"] = all(summed.get(t, 0.0) == v.get("bytes_write", 0.0) for t, v in tiers.items())
    return out


def request_rows(state: RunState, *, warmup: bool = False) -> Iterator[dict[str, Any]]:
    """One detail row per request (timestamps relative to the run's start), made as they are read: the warm-up
    requests first when `warmup` (the JSONL has them, the CSV and the plots do not)."""
    for r in (state.warmup_records + state.records) if warmup else state.records:
        yield r.to_json(state.t0_ns)
