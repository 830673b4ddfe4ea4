"""The pieces of the results document of `kvtier bench`: the summary, tier details, cache stats, fallbacks.

`summary()` is the one place the summary is built: `Bench.results` calls it with one client's live request stats,
`merge.merge_results` with N clients' stats merged by `request_stats_of_docs`, so the two documents cannot drift apart.

Keys follow the MLPerf KV Cache benchmark where the concept is the same (`summary.avg_throughput_tokens_per_sec`,
`end_to_end_latency_ms`, `cache_stats.tier_<name>_kv_bytes_read_gb`, ...). Tier names in `cache_stats` use that
benchmark's words: gpu, cpu, storage (our disk tier). Every latency is a summary of a mergeable histogram, and the
histograms themselves are included (`tiers.<name>.read.histograms`) so runs can be merged later.

Python callers read a results file as a pandas DataFrame with `load(path)`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from kvconnector.histogram import LatencyHistogram
from kvconnector.store import TieredStore
from kvconnector.telemetry import OpStats, TierStats
from kvconnector.units import GB

from ..common.json_files import open_regular
from ..merging import merged_histogram
from ..outputs.csv_out import figures_frame
from .config import BenchConfig
from .stats import ClassStats, RequestStats

if TYPE_CHECKING:
    import pandas as pd

PEER_TIER_NAMES = {"gpu": "gpu", "cpu": "cpu", "disk": "storage", "s3": "storage"}


def tier_label(kind: str, name: str) -> str:
    return PEER_TIER_NAMES.get(kind, name)


def _percentiles_ms(hist: LatencyHistogram, percentiles: tuple[float, ...]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in hist.summary_ms(percentiles).items() if k.startswith("p")]


FAST_KINDS = ("gpu", "cpu")  # the spec's "fast tiers": a read served from these never touches storage


def _storage_tiers(tiers: dict) -> list[dict]:
    return [t for t in tiers.values() if t["kind"] not in FAST_KINDS]


def cache_stats(tiers: dict, events: dict, elapsed_s: float, bytes_per_token: int) -> dict:
    """The MLPerf-style `cache_stats` block from `tier_details` (a live store's, or merged clients').

    `cache_hit_rate` is the spec's: the share of reads served from the fast tiers (GPU, CPU); a read served from
    storage counts against it. `store_hit_rate` is the share served from any tier (what the reference implementation
    names cache_hit_rate). Byte totals cover every tier operation, demotion moves included (the reference counts
    request reads and new entries only; with a single tier the two agree)."""
    hits, misses = events.get("hits", 0), events.get("misses", 0)
    fast_hits = sum(t.get("events", {}).get("hits", 0) for t in tiers.values() if t["kind"] in FAST_KINDS)
    read_b = sum(t["read"]["bytes"] for t in tiers.values())
    write_b = sum(t["write"]["bytes"] for t in tiers.values())
    storage_b = sum(t["read"]["bytes"] + t["write"]["bytes"] for t in _storage_tiers(tiers))
    out: dict = {
        "cache_hits": hits,
        "cache_misses": misses,
        "cache_hit_rate": _rate(fast_hits, hits + misses),
        "fast_tier_hits": fast_hits,
        "store_hit_rate": _rate(hits, hits + misses),
        "put_rejected": events.get("put_rejected", 0),
        "total_read_bytes": read_b,
        "total_write_bytes": write_b,
        "total_read_gb": round(read_b / GB, 4),
        "total_write_gb": round(write_b / GB, 4),
        "read_write_ratio": round(read_b / max(write_b, 1), 4),
        # Operation counts over the run, under the reference's names (they are counts, not rates).
        "read_iops": sum(t["read"]["ops"] for t in tiers.values()),
        "write_iops": sum(t["write"]["ops"] for t in tiers.values()),
        # KV tokens that went through the storage tiers, reads and writes (demotions into storage included).
        "storage_tokens_processed": storage_b // bytes_per_token if bytes_per_token else 0,
        "nvme_tokens_processed": storage_b // bytes_per_token if bytes_per_token else 0,
        # Entries moved down into the CPU tier / the storage tiers (the reference's offloads).
        "offloads_cpu": sum(t.get("events", {}).get("demotions_in", 0) for t in tiers.values() if t["kind"] == "cpu"),
        "offloads_storage": sum(t.get("events", {}).get("demotions_in", 0) for t in _storage_tiers(tiers)),
    }
    # The reference names every tier's entries, a disabled tier's as 0 (the spec's Test 2 reads all three).
    for label in ("gpu", "cpu", "storage", "nvme"):
        out.setdefault(f"{label}_entries", 0)
    for kind in FAST_KINDS:
        out[f"{kind}_memory_used_gb"] = round(sum(t["used_bytes"] for t in tiers.values() if t["kind"] == kind) / GB, 4)
    for name, t in tiers.items():
        label = tier_label(t["kind"], name)
        out[f"{label}_entries"] = t["entries"]
        if label == "storage":
            out["nvme_entries"] = t["entries"]  # the spec's older name
        for op in ("read", "write"):
            st = OpStats.from_dict(t[op])
            verb = "read" if op == "read" else "written"
            out[f"tier_{label}_kv_bytes_{verb}_gb"] = round(st.nbytes / GB, 4)
            out[f"tier_{label}_{op}_bandwidth_gbps"] = round(st.nbytes / GB / elapsed_s, 4) if elapsed_s else 0.0
            # Percentile keys (p50 ... p9999) as the histograms name them everywhere else.
            for key, ms in _percentiles_ms(st.total, (50, 95, 99, 99.9, 99.99)):
                out[f"tier_{label}_{op}_{key}_ms"] = ms
                out[f"{label}_{op}_{key}_ms"] = ms  # the reference's name for the same figure
            if t["kind"] not in FAST_KINDS:  # the storage tier: a disk, or an object store (device: its service)
                out[f"nvme_{op}_p95_ms"] = st.total.percentile_ms(95)  # the spec's older name
                for part, hist in (("device", st.device), ("host", st.host)):
                    for key, ms in _percentiles_ms(hist, (50, 95, 99, 99.9, 99.99)):
                        out[f"storage_{op}_{part}_{key}_ms"] = ms
                        if part == "device" and key == "p95":
                            out[f"nvme_{op}_device_p95_ms"] = ms  # the spec's name (sections 1, 6)
    if "nvme_read_device_p95_ms" in out:  # section 7's shorthand for the pair
        out["nvme_device_p95_ms"] = {op: out[f"nvme_{op}_device_p95_ms"] for op in ("read", "write")}
    return out


def storage_stats(tiers: dict, elapsed_s: float) -> dict:
    """Bytes and operations that reached the storage tiers (disk, shared directory, Redis: everything below the
    CPU tier), demotions included: what the spec's multi-client aggregation snippet sums as storage bandwidth."""
    st = _storage_tiers(tiers)
    read_b = sum(t["read"]["bytes"] for t in st)
    write_b = sum(t["write"]["bytes"] for t in st)
    return {
        "total_read_bytes": read_b,
        "total_write_bytes": write_b,
        "read_ops": sum(t["read"]["ops"] for t in st),
        "write_ops": sum(t["write"]["ops"] for t in st),
        "read_gbps": round(read_b / GB / elapsed_s, 4) if elapsed_s else 0.0,
        "write_gbps": round(write_b / GB / elapsed_s, 4) if elapsed_s else 0.0,
    }


def tier_details(store: TieredStore) -> dict:
    usage = {u["tier"]: u for u in store.usage()}
    return {
        tier.name: {**tier.describe(), **usage[tier.name], **st.to_dict(), "fallbacks": dict(tier.fallbacks)}
        for tier, st in zip(store.tiers, store.stats)
    }


def merge_tier_details(parts: list[dict]) -> dict:
    """Tiers of several clients as one: entries, bytes and capacities add up; histograms merge (never averaged)."""
    out: dict = {}
    for tiers in parts:
        for name, t in tiers.items():
            if name not in out:
                out[name] = {k: v for k, v in t.items() if k not in ("read", "write", "events", "fallbacks")}
                out[name].update(_stats=TierStats(name), fallbacks={})
                out[name]["entries"] = out[name]["used_bytes"] = out[name]["capacity_bytes"] = 0
            m = out[name]
            m["entries"] += t["entries"]
            m["used_bytes"] += t["used_bytes"]
            m["capacity_bytes"] += t["capacity_bytes"]
            m["_stats"].merge(TierStats.from_dict(name, t))
            for k, v in t.get("fallbacks", {}).items():
                m["fallbacks"][k] = m["fallbacks"].get(k, 0) + v
    for m in out.values():
        m.update(m.pop("_stats").to_dict())
    return out


def sla_verdict(service, target_p95_ms: float, target_p99_ms: float, more: dict | None = None) -> dict:
    """A QoS class's SLA judged on its service-latency histogram: met True/False, or None with verdict "no data"
    when the class completed no request (nothing was measured, so nothing was missed either). Also the
    reference's figures: `actual_p95_ms` and `compliance`, the share of requests within the p95 target."""
    if not service.count:
        return {"met": None, "verdict": "no data", "actual_p95_ms": None, "compliance": None}
    # `more`: percentile -> target ms (QoSProfile.targets(): the reference's p99.9 / p99.99 targets when given)
    targets = {95.0: target_p95_ms, 99.0: target_p99_ms, **(more or {})}
    met = all(service.percentile_ms(p) <= ms for p, ms in targets.items())
    within = service.cumulative_counts([target_p95_ms * 1e6])[0]
    return {
        "met": met,
        "verdict": "met" if met else "missed",
        "actual_p95_ms": round(service.percentile_ms(95), 4),
        "compliance": round(within / service.count, 4),
    }


# ---- the summary: one function for one client's live stats and for N clients' merged stats ------------------------
def _rate(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def fallbacks(tiers: dict) -> dict:
    """`<tier>.<fallback>: count` from `tier_details` (a live store's, or merged clients', whose counts add up)."""
    return {f"{name}.{k}": v for name, t in tiers.items() for k, v in (t.get("fallbacks") or {}).items()}


def request_histograms(req: RequestStats) -> dict:
    """The request-level histograms, encoded, so that runs can be merged (by `request_stats_of_docs`) later."""
    return {
        "end_to_end": req.end_to_end.encode(),
        "storage_io": req.storage_io.encode(),
        "generation": req.generation.encode(),
        "queue_wait": req.queue_wait.encode(),
        "rag_burst": req.rag_burst.encode(),
    }


def request_stats_of_docs(docs: list[dict]) -> RequestStats:
    """The request stats of several clients' results documents as one: counts add up, histograms merge (never
    averaged). Counts are read back from each client's summary, histograms from `request_histograms` and
    `summary.qos_metrics.<class>.histograms`."""
    req = RequestStats()
    for d in docs:
        s, h = d["summary"], d["request_histograms"]
        mt, pc, rag, dec = (
            s.get(k) or {} for k in ("multi_turn_stats", "prefix_cache_stats", "rag_stats", "decode_stats")
        )
        req.completed += s["total_requests"]
        req.prompt_tokens += s["prompt_tokens"]
        req.generated_tokens += s["generated_tokens"]
        req.multi_turn_hits += mt.get("previous_turn_hits", 0)
        req.multi_turn_misses += mt.get("previous_turn_misses", 0)
        req.decode_reads += dec.get("reads", 0)
        req.decode_misses += dec.get("misses", 0)
        req.decode_bytes_read += dec.get("bytes_read", 0)
        req.prefill_bytes_written += s.get("prefill_stats", {}).get("bytes_written", 0)
        req.prefix_hits += pc.get("hits", 0)
        req.prefix_misses += pc.get("misses", 0)
        req.prefix_bytes_saved += round(pc.get("bytes_saved_gb", 0) * GB)  # the summary keeps GB to 4 places
        req.rag_queries += rag.get("queries", 0)
        req.rag_chunk_reads += rag.get("chunk_reads", 0)
        req.rag_chunk_misses += rag.get("chunk_misses", 0)
        for name in ("end_to_end", "storage_io", "generation", "queue_wait", "rag_burst"):
            getattr(req, name).merge(merged_histogram([h.get(name)]))
        for name, n in (s.get("requests_by_profile") or {}).items():
            req.by_profile[name] = req.by_profile.get(name, 0) + n
        for name, q in (s.get("qos_metrics") or {}).items():
            cs = req.by_class.setdefault(name, ClassStats())
            cs.requests += q["requests"]
            cs.end_to_end.merge(merged_histogram([q["histograms"]["end_to_end"]]))
            cs.service.merge(merged_histogram([q["histograms"]["service"]]))
    return req


def _qos_metrics(req: RequestStats, cfg: BenchConfig) -> dict:
    # Every class of the distribution is listed: one that completed nothing (given no users, or a window too short)
    # shows 0 requests and SLA "no data".
    classes = {c for c, share in cfg.qos_distribution.items() if share > 0} | set(req.by_class)
    out = {}
    for name in sorted(classes):
        cs = req.by_class.get(name) or ClassStats()
        prof = cfg.qos_profiles[name]
        out[name] = {
            "requests": cs.requests,
            "total_requests": cs.requests,  # the reference's name
            "priority": prof.priority,
            "end_to_end_latency_ms": cs.end_to_end.summary_ms(),
            "latency_ms": cs.end_to_end.summary_ms(),  # the reference's name: its class latency is end-to-end
            "service_latency_ms": cs.service.summary_ms(),
            "sla": {
                "target_p95_ms": prof.target_p95_ms,
                "target_p99_ms": prof.target_p99_ms,
                **sla_verdict(cs.service, prof.target_p95_ms, prof.target_p99_ms, prof.targets()),
            },
            "histograms": {"end_to_end": cs.end_to_end.encode(), "service": cs.service.encode()},
        }
    return out


def _qos_stats(qos_metrics: dict) -> dict:
    """The spec's `qos_stats` (section 3.9): per class, the p95 the SLA is judged on and whether it was met.
    kvtier judges service latency (end-to-end less simulated generation; equal to it with --generation-mode
    none, as submissions run)."""
    return {
        name: {"latency_p95_ms": q["service_latency_ms"]["p95"] if q["requests"] else None, "sla_met": q["sla"]["met"]}
        for name, q in qos_metrics.items()
    }


def _autoscaling_summary(mode: str, steps_by_client: list[list[dict]], initial_users: int) -> dict:
    """Each client scales its own users: its last step says how many it ended with, its peak step where its
    throughput was highest. Across clients users and peak throughputs add (each client's own peak)."""
    steps = [s for s in steps_by_client if s]
    peaks = [max(s, key=lambda x: x["throughput_tokens_per_sec"]) for s in steps]
    return {
        "mode": mode,
        "steps": sum(len(s) for s in steps),
        "final_users": sum(s[-1]["next_users"] for s in steps),
        "peak_throughput_tokens_per_sec": sum(p["throughput_tokens_per_sec"] for p in peaks),
        "peak_users": sum(p["users"] for p in peaks),
        "reason": "; ".join(dict.fromkeys(s[-1]["reason"] for s in steps)),
        # The reference's names for the same figures.
        "initial_users": initial_users,
        "total_scale_events": sum(len(s) for s in steps),
        "peak_user_count": sum(p["users"] for p in peaks),
        "peak_throughput": sum(p["throughput_tokens_per_sec"] for p in peaks),  # the spec's Test 4 name
    }


def summary(
    req: RequestStats,
    cfg: BenchConfig,
    *,
    status: str,
    elapsed_s: float,
    tiers: dict,
    events: dict,
    bytes_per_token: int,
    io_saturation: float,
    window: dict,
    autoscaling: list[list[dict]],
    num_clients: int = 1,
) -> dict:
    """The results document's `summary`, from request stats (one client's live ones, or N clients' merged by
    `request_stats_of_docs`), tier details (`tier_details` or `merge_tier_details`) and the run's window.
    `autoscaling` holds each client's autoscaler steps."""
    tokens = req.prompt_tokens + req.generated_tokens
    disk_bytes = sum(t["read"]["bytes"] + t["write"]["bytes"] for t in _storage_tiers(tiers))
    # Summed per-request storage time, from the histogram (bucket midpoints: within 0.1% of the exact sum).
    io_time_s = req.storage_io.mean_ms() * req.storage_io.count / 1000
    qos = _qos_metrics(req, cfg)
    caches = cache_stats(tiers, events, elapsed_s, bytes_per_token)
    caches["decode_bytes_read_gb"] = round(req.decode_bytes_read / GB, 4)
    caches["prefill_bytes_written_gb"] = round(req.prefill_bytes_written / GB, 4)
    caches["decode_reads"] = req.decode_reads
    # The reference's hit counters by kind of read: system prompt, previous turn, a request's own entry (decode).
    caches["system_prompt_hits"] = req.prefix_hits
    caches["multi_turn_hits"] = req.multi_turn_hits
    caches["user_cache_hits"] = req.decode_reads - req.decode_misses

    def per_s(n: float, digits: int) -> float:
        return round(n / elapsed_s, digits) if elapsed_s else 0.0

    out = {
        "status": status,
        "num_clients": num_clients,
        "total_requests": req.completed,
        # Tokens as the reference counts them: generated tokens (its total_tokens_generated).
        "total_tokens": req.generated_tokens,
        "prompt_tokens": req.prompt_tokens,
        "generated_tokens": req.generated_tokens,
        "prompt_and_generated_tokens": tokens,
        "elapsed_time": round(elapsed_s, 4),
        "requests_per_second": per_s(req.completed, 4),
        # The spec's wall-clock throughput: total_tokens / elapsed_time.
        "avg_throughput_tokens_per_sec": per_s(req.generated_tokens, 2),
        "prompt_and_generated_tokens_per_sec": per_s(tokens, 2),
        # Per-request storage I/O time summed over requests (concurrent requests overlap), in seconds.
        "total_storage_io_time": round(io_time_s, 4),
        # The spec's storage throughput: total_tokens / total_storage_io_time.
        "storage_throughput_tokens_per_sec": round(req.generated_tokens / io_time_s, 2) if io_time_s else 0.0,
        # KV tokens moved through the storage (disk) tier per wall-clock second.
        "storage_tier_tokens_per_sec": per_s(disk_bytes / bytes_per_token, 2),
        "end_to_end_latency_ms": req.end_to_end.summary_ms(),
        "end_to_end_latency_p95_ms": req.end_to_end.summary_ms()["p95"],
        # Section 7's names for the same figures (tokens/s, tokens/s, ms).
        "wall_clock_throughput": per_s(req.generated_tokens, 2),
        "storage_throughput": round(req.generated_tokens / io_time_s, 2) if io_time_s else 0.0,
        "end_to_end_latency_p95": req.end_to_end.summary_ms()["p95"],
        "storage_io_latency_ms": req.storage_io.summary_ms(),
        "io_saturation": io_saturation,
        # Time past --duration and what it went to (set-up of users, a late deadline, in-flight operations).
        "window": window,
        "window_overrun_s": window.get("overrun_s", 0.0),
        "generation_latency_ms": req.generation.summary_ms(),
        "queue_wait_latency_ms": req.queue_wait.summary_ms(),
        "cache_stats": caches,
        "storage_stats": storage_stats(tiers, elapsed_s),
        "multi_turn_stats": {
            "enabled": not cfg.disable_multi_turn,
            "previous_turn_hits": req.multi_turn_hits,
            "previous_turn_misses": req.multi_turn_misses,
            "cache_hits": req.multi_turn_hits,  # the reference's names
            "cache_misses": req.multi_turn_misses,
            "hit_rate": _rate(req.multi_turn_hits, req.multi_turn_hits + req.multi_turn_misses),
        },
        "prefix_cache_stats": {
            "enabled": not cfg.disable_prefix_caching,
            "hits": req.prefix_hits,
            "misses": req.prefix_misses,
            "hit_rate": _rate(req.prefix_hits, req.prefix_hits + req.prefix_misses),
            "bytes_saved_gb": round(req.prefix_bytes_saved / GB, 4),
        },
        "rag_stats": {
            "enabled": cfg.enable_rag,
            "queries": req.rag_queries,
            "chunk_reads": req.rag_chunk_reads,
            "chunk_misses": req.rag_chunk_misses,
            "chunk_hit_rate": _rate(req.rag_chunk_reads - req.rag_chunk_misses, req.rag_chunk_reads),
            "burst_latency_ms": req.rag_burst.summary_ms(),
        },
        "decode_stats": {
            "reads": req.decode_reads,
            "misses": req.decode_misses,
            "bytes_read": req.decode_bytes_read,
            "batch_size": cfg.decode.batch_size,
        },
        "prefill_stats": {"bytes_written": req.prefill_bytes_written},
        "qos_metrics": qos,
        "qos_stats": _qos_stats(qos),
        "requests_by_profile": dict(sorted(req.by_profile.items())),
    }
    if any(autoscaling):
        out["autoscaling_summary"] = _autoscaling_summary(cfg.autoscaler_mode, autoscaling, cfg.num_users)
    return out


def document_keys(run_summary: dict) -> dict:
    """Top-level keys the spec's multi-client aggregation snippet (its section 2.1) reads from each results file:
    `storage_stats.total_read_bytes` / `total_write_bytes` and `duration_seconds` (the run's window)."""
    return {"duration_seconds": run_summary["elapsed_time"], "storage_stats": run_summary["storage_stats"]}


def load(path: str | os.PathLike) -> pd.DataFrame:
    r"""A `kvtier bench` results file (one client's or merged) as a DataFrame in long format, one row per figure:
    columns `section` (the dotted path of the JSON object the figure sits in: `summary`, `summary.cache_stats`,
    `tiers.disk.read.latency_ms`, `run` for top-level scalars), `metric` (its key) and `value` (a number, string,
    boolean or None). These are the rows of the `--csv-output` file, with the same derived `gb`/`gbps` per tier and
    operation, and no encoded histograms or timeline.

    Long rather than wide because runs differ in shape (tiers, QoS classes, clients, autoscaler steps): frames of
    several runs stack without gaps and pivot into a comparison, and any one table is a filter away:

        runs = pd.concat({p: load(p) for p in paths}, names=["run"]).reset_index("run")
        side_by_side = runs.pivot(index=["section", "metric"], columns="run", values="value")
        p99 = df[df.section.str.fullmatch(r"tiers\.\w+\.(read|write)\.latency_ms") & (df.metric == "p99")]
    """
    with open_regular(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, dict) or not isinstance(doc.get("summary"), dict):
        raise ValueError(f"{path}: not a kvtier bench result (no summary)")
    return figures_frame(doc)
