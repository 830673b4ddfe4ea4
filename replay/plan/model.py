"""The chained-block LRU model behind `kvtier plan`: multi-round sessions over a KV cache of limited size.

What it models (vLLM's prefix cache, LMCache's chunk keys):
- Each of `concurrency` sessions sends one request per round; rounds are synchronized and the sessions are served in
  the same order every round (`order="fixed"`: a closed-loop multi-round benchmark keeps its order), or in a fresh
  random order each round (`"shuffled"`, seeded), which turns the cliff into a slope. The prompt of round r is
  P_1 = first_input_len, P_r = P_(r-1) + output_len + input_len (the previous answer, then a follow-up).
- A session's KV is a chain of blocks of `block_size` tokens; block k's key covers blocks 0..k, so a request can
  reuse its prefix only up to the first block missing from the cache. Only whole blocks are kept.
- `answer_kv="recomputed"`: a request leaves its prompt's blocks (LMCache stores prefill KV only; the answer is
  prefilled again as part of the next prompt). `"reused"`: it leaves prompt + answer blocks (vLLM's own prefix cache
  keeps generated blocks). Either way the last prompt token is always computed, as a server does.
- The tiers (fastest first) form one exclusive waterfall: a block lives in one tier, new and hit blocks go to the
  top, the least recently used block of a full tier moves down, the bottom tier drops it. For hits and misses that
  is one LRU list as long as all tiers together; a hit's tier is where its recency puts it.
- A request first looks its chain up (the hit blocks become most recent), then computes the rest and stores every
  block that is missing. Its own blocks are never victims while it runs; blocks still cached are not written again.
  When eviction has taken a session's head block, the whole chain is recomputed: the cliff.

Invariant that makes it fast: a request touches its blocks in chain order and LRU drops the oldest first, so a
session's cached blocks are always one run [lo, hi) of its chain, the head side lost first. The LRU list is a deque
of such runs (one live run per session, stale ones skipped lazily), and a Fenwick tree over the runs' insertion
numbers gives how many blocks are more recent than a run (its depth, hence its tier). Cost: O(log n) per request,
independent of the block count (C=112, 20 rounds: milliseconds).

Use from code (what `kvtier bench --prefix-model chained` and the collapse benchmark import):

    from replay.plan import Workload, TierSpec, simulate
    plan = simulate(Workload(concurrency=112, rounds=20, input_len=50, output_len=5000, block_size=256,
                             kv_bytes_per_token=88_100, first_input_len=10_000, answer_kv="recomputed"),
                    [TierSpec("dram", 400 * 2**30)], name="dram")
    plan.rounds[19].predicted_hit_rate, plan.collapse_round, plan.to_dict()

    simulate(workload, tiers, *, name="plan", policy="lru", order="fixed", seed=0, progress=None) -> PlanResult

`progress(round)` is called after each simulated round. `ChainLRU` is the cache alone
(`request(session, reusable_blocks, stored_blocks) -> RequestOutcome`), for a driver that makes its own sessions.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from kvconnector.errors import ConfigError

from .lmcache_mp import LMCacheMP, MPParams

__all__ = [
    "COLLAPSE_FRACTION",
    "ORDERS",
    "POLICIES",
    "ChainLRU",
    "MPParams",
    "PlanResult",
    "RequestOutcome",
    "RoundResult",
    "TierSpec",
    "Workload",
    "simulate",
]

AnswerKV = Literal["reused", "recomputed"]
# lru: the chained-block LRU above (vLLM's prefix cache, kvtier's store); lmcache-mp: LMCache MP's L1 with its
# periodic eviction over an optional write-through L2, block by block (lmcache_mp.py)
POLICIES = ("lru", "lmcache-mp")
ORDERS = ("fixed", "shuffled")
# A round has collapsed when its predicted hit rate is below this share of the ideal (kvtier's own threshold).
COLLAPSE_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class Workload:
    """Sessions, rounds and KV geometry. Token counts per request; `input_len` is each follow-up after round 1."""

    concurrency: int
    rounds: int
    input_len: int
    output_len: int
    block_size: int
    kv_bytes_per_token: float
    first_input_len: int | None = None
    answer_kv: AnswerKV = "recomputed"

    def __post_init__(self) -> None:
        for key in ("concurrency", "rounds", "block_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be at least 1, got {getattr(self, key)}")
        for key in ("input_len", "output_len"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key} must be 0 or more, got {getattr(self, key)}")
        if self.first_input_len is not None and self.first_input_len < 1:
            raise ConfigError(f"first_input_len must be at least 1, got {self.first_input_len}")
        if self.first_input_len is None and self.input_len < 1:
            raise ConfigError("input_len must be at least 1 when it is also the first prompt's length")
        if not self.kv_bytes_per_token > 0:
            raise ConfigError(f"kv_bytes_per_token must be more than 0, got {self.kv_bytes_per_token}")
        if self.answer_kv not in ("reused", "recomputed"):
            raise ConfigError(f"answer_kv must be 'reused' or 'recomputed', got {self.answer_kv!r}")

    @property
    def first_len(self) -> int:
        return self.input_len if self.first_input_len is None else self.first_input_len

    @property
    def block_bytes(self) -> float:
        return self.block_size * self.kv_bytes_per_token

    def prompt_tokens(self, r: int) -> int:
        """Prompt length of round r (1-based)."""
        return self.first_len + (r - 1) * (self.output_len + self.input_len)

    def kept_tokens(self, r: int) -> int:
        """Tokens whose KV a session's round-r request leaves behind (the last generated token has none)."""
        p = self.prompt_tokens(r)
        return p + max(0, self.output_len - 1) if self.answer_kv == "reused" else p

    def stored_blocks(self, r: int) -> int:
        return self.kept_tokens(r) // self.block_size

    def reusable_blocks(self, r: int) -> int:
        """Blocks of round r's prompt an infinite cache would serve: the previous request's kept whole blocks, never
        the last prompt token."""
        if r <= 1:
            return 0
        return min(self.kept_tokens(r - 1), self.prompt_tokens(r) - 1) // self.block_size


@dataclass(frozen=True, slots=True)
class TierSpec:
    name: str
    capacity_bytes: float


@dataclass(slots=True)
class RequestOutcome:
    hit_blocks: int
    written_blocks: int
    evicted_blocks: int
    hit_blocks_by_tier: list[int]


class _Fenwick:
    """Prefix sums over insertion numbers: blocks held by the runs inserted at or before a number."""

    __slots__ = ("tree",)

    def __init__(self, n: int) -> None:
        # Grown as insertion numbers reach its end (doubling), so memory follows the requests simulated so far,
        # not the `n` a caller expects (concurrency x rounds can be far beyond what a run reaches).
        cap = 1
        while cap < min(max(n, 1), 1 << 16):
            cap <<= 1
        self.tree = [0] * (cap + 1)

    def _grow(self, i: int) -> None:
        """Room for 1-based index `i`: the capacity doubles; the new nodes below the new top cover only numbers not
        yet inserted (zero), the top covers everything, i.e. the old top's sum."""
        tree = self.tree
        while i >= len(tree):
            cap = len(tree) - 1
            tree.extend([0] * cap)
            tree[2 * cap] = tree[cap]

    def add(self, i: int, delta: int) -> None:
        i += 1
        if i >= len(self.tree):
            self._grow(i)
        tree = self.tree
        while i < len(tree):
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        """Sum over insertion numbers 0..i."""
        tree = self.tree
        i = min(i + 1, len(tree) - 1)  # numbers past the end hold nothing yet
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s


class ChainLRU:
    """An LRU cache of chained blocks over exclusive tiers (capacities in blocks, fastest first).

    Invariants: each session holds at most one live run [lo, hi) of its chain; `used` is the sum of live run sizes
    and never exceeds the total capacity after a request; the deque holds runs oldest first, each tagged with its
    insertion number, and a run is live only while its session's `seq` still names that number.
    """

    def __init__(self, tier_blocks: Sequence[int], sessions: int, max_requests: int) -> None:
        self.tier_blocks = list(tier_blocks)
        self.capacity = sum(self.tier_blocks)
        self.bounds = []  # cumulative capacity: depth d (1 = most recent) is in tier i when d <= bounds[i]
        acc = 0
        for b in self.tier_blocks:
            acc += b
            self.bounds.append(acc)
        self.lo = [0] * sessions
        self.hi = [0] * sessions
        self.seq = [-1] * sessions
        self.runs: deque[tuple[int, int]] = deque()  # (insertion number, session), oldest first
        self.used = 0
        self.next_seq = 0
        self.fen = _Fenwick(max_requests)

    def _more_recent_than(self, seq: int) -> int:
        return self.used - self.fen.prefix(seq)

    def _split_by_tier(self, shallow: int, deep: int) -> list[int]:
        """How many of the depths shallow..deep (inclusive, 1-based) each tier holds."""
        out = []
        top = 0
        for bound in self.bounds:
            out.append(max(0, min(deep, bound) - max(shallow, top + 1) + 1))
            top = bound
        return out

    def request(self, session: int, reusable_blocks: int, stored_blocks: int) -> RequestOutcome:
        """One request: look up `reusable_blocks` of the chain, then leave blocks 0..stored_blocks-1 cached."""
        lo, hi, seq = self.lo[session], self.hi[session], self.seq[session]
        live = seq >= 0 and hi > lo
        hit = min(hi, reusable_blocks) if live and lo == 0 else 0
        by_tier = [0] * len(self.bounds)
        if hit:
            # Block j of the run [0, hi) sits at depth newer + (hi - j): block 0, the head, is the deepest.
            newer = self._more_recent_than(seq)
            by_tier = self._split_by_tier(newer + hi - hit + 1, newer + hi)
        present = max(0, min(hi, stored_blocks) - lo) if live else 0
        written = stored_blocks - present
        if live:  # the request pins its blocks: they leave the list now and come back as the newest run
            self.fen.add(seq, -(hi - lo))
            self.used -= hi - lo
        self.seq[session] = -1
        evicted = self._make_room(stored_blocks)
        keep = min(stored_blocks, self.capacity)
        evicted += stored_blocks - keep  # a chain longer than the whole cache keeps only its newest blocks
        if keep:
            n = self.next_seq
            self.next_seq += 1
            self.runs.append((n, session))
            self.fen.add(n, keep)
            self.used += keep
            self.lo[session], self.hi[session], self.seq[session] = stored_blocks - keep, stored_blocks, n
            if len(self.runs) > 2 * len(self.seq) + 64:  # stale runs dropped now and then: memory follows sessions
                self.runs = deque(r for r in self.runs if self.seq[r[1]] == r[0])
        else:
            self.lo[session] = self.hi[session] = 0
        return RequestOutcome(hit, written, evicted, by_tier)

    def _make_room(self, incoming: int) -> int:
        need = self.used + incoming - self.capacity
        evicted = 0
        runs = self.runs
        while need > 0 and runs:
            n, s = runs.popleft()
            if self.seq[s] != n:
                continue  # stale: the session has a newer run
            size = self.hi[s] - self.lo[s]
            take = min(size, need)
            self.lo[s] += take  # the oldest blocks of a run are its head side
            self.fen.add(n, -take)
            self.used -= take
            need -= take
            evicted += take
            if take < size:
                runs.appendleft((n, s))
            else:
                self.seq[s] = -1
        return evicted


@dataclass(slots=True)
class RoundResult:
    """One round over all sessions. Per-request figures are means over the round's requests."""

    round: int
    prompt_tokens_per_request: int
    working_set_tokens: int
    working_set_bytes: float
    cache_increment_bytes: float
    ideal_hit_rate: float
    predicted_hit_rate: float
    hit_share_of_ideal: float | None
    sessions_with_hits: int
    recomputed_tokens_per_request: float
    excess_recompute_tokens_per_request: float
    excess_recompute_share: float | None
    bytes_written: float
    bytes_written_total: float
    bytes_evicted: float
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class PlanResult:
    name: str
    tiers: list[TierSpec]
    policy: str
    order: str
    workload: Workload
    rounds: list[RoundResult]
    capacity_bytes: float
    collapse_round: int | None
    first_eviction_round: int | None
    rounds_capacity_holds: int | None
    rounds_largest_tier_holds: int | None
    mp: MPParams | None = None

    @property
    def bytes_written_total(self) -> float:
        return self.rounds[-1].bytes_written_total if self.rounds else 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "tiers": [asdict(t) for t in self.tiers],
            "policy": self.policy,
            "order": self.order,
            "answer_kv": self.workload.answer_kv,
            "capacity_bytes": self.capacity_bytes,
            "collapse_round": self.collapse_round,
            "first_eviction_round": self.first_eviction_round,
            "rounds_capacity_holds": self.rounds_capacity_holds,
            "rounds_largest_tier_holds": self.rounds_largest_tier_holds,
            "bytes_written_total": self.bytes_written_total,
            "rounds": [asdict(r) for r in self.rounds],
            **({"lmcache_mp": asdict(self.mp)} if self.mp else {}),
        }


def rounds_held(workload: Workload, capacity_blocks: int) -> int | None:
    """How many rounds fit before the sessions' kept blocks exceed `capacity_blocks`; None when they never grow."""
    per_session = capacity_blocks // workload.concurrency
    if workload.stored_blocks(1) > per_session:
        return 0
    step = workload.output_len + workload.input_len
    if step == 0:
        return None
    # stored_blocks(r) <= per_session  <=>  kept_tokens(r) <= (per_session + 1) * block - 1
    limit = (per_session + 1) * workload.block_size - 1
    return (limit - workload.kept_tokens(1)) // step + 1


def simulate(
    workload: Workload,
    tiers: Sequence[TierSpec],
    *,
    name: str = "plan",
    policy: str = "lru",
    order: str = "fixed",
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    mp: MPParams | None = None,
) -> PlanResult:
    """Simulate every round of `workload` over `tiers` (fastest first); see the module docstring. With
    policy="lmcache-mp", `tiers` are LMCache's L1 and optionally one L2, `mp` its eviction settings and ticks."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    if order not in ORDERS:
        raise ConfigError(f"unknown order {order!r} (one of {', '.join(ORDERS)})")
    if not tiers:
        raise ConfigError(f"configuration {name!r} has no tier")
    w = workload
    tier_blocks = [int(t.capacity_bytes // w.block_bytes) for t in tiers]
    capacity_blocks = sum(tier_blocks)  # exclusive tiers
    if policy == "lmcache-mp":
        LMCacheMP.check_tiers(len(tiers), name)
        mp = mp or MPParams()
        capacity_blocks = max(tier_blocks)  # L2 holds every L1 block too
        l1 = LMCacheMP(tier_blocks[0], tier_blocks[1] if len(tiers) > 1 else 0, mp)

        def serve(sessions: list[int], reusable: int, stored: int) -> list[RequestOutcome]:
            return [
                RequestOutcome(hit, written, evicted, [hit - from_l2, from_l2][: len(tiers)])
                for hit, from_l2, written, _dropped, evicted in l1.serve_round(sessions, reusable, stored)
            ]
    else:
        mp = None
        cache = ChainLRU(tier_blocks, w.concurrency, w.concurrency * w.rounds)

        def serve(sessions: list[int], reusable: int, stored: int) -> list[RequestOutcome]:
            return [cache.request(s, reusable, stored) for s in sessions]

    names = [t.name for t in tiers]
    rounds: list[RoundResult] = []
    total_written = 0.0
    prev_ws = 0
    first_eviction = collapse = None
    sessions = list(range(w.concurrency))
    rng = random.Random(seed)
    for r in range(1, w.rounds + 1):
        if order == "shuffled":
            rng.shuffle(sessions)
        prompt = w.prompt_tokens(r)
        reusable = w.reusable_blocks(r)
        stored = w.stored_blocks(r)
        hit_blocks = written = evicted = sessions_hit = 0
        by_tier = [0] * len(tiers)
        for out in serve(sessions, reusable, stored):
            hit_blocks += out.hit_blocks
            written += out.written_blocks
            evicted += out.evicted_blocks
            sessions_hit += out.hit_blocks > 0
            for i, n in enumerate(out.hit_blocks_by_tier):
                by_tier[i] += n
        c = w.concurrency
        prompt_total = prompt * c
        hit_tokens = hit_blocks * w.block_size
        ideal = reusable * w.block_size / prompt
        predicted = hit_tokens / prompt_total
        recomputed = prompt - hit_tokens / c
        excess = (reusable * c - hit_blocks) * w.block_size / c
        ws_tokens = c * stored * w.block_size
        written_bytes = written * w.block_bytes
        total_written += written_bytes
        if evicted and first_eviction is None:
            first_eviction = r
        if collapse is None and r > 1 and ideal > 0 and predicted < COLLAPSE_FRACTION * ideal:
            collapse = r
        rounds.append(
            RoundResult(
                round=r,
                prompt_tokens_per_request=prompt,
                working_set_tokens=ws_tokens,
                working_set_bytes=ws_tokens * w.kv_bytes_per_token,
                cache_increment_bytes=(ws_tokens - prev_ws) * w.kv_bytes_per_token,
                ideal_hit_rate=round(ideal, 6),
                predicted_hit_rate=round(predicted, 6),
                hit_share_of_ideal=round(predicted / ideal, 6) if ideal else None,
                sessions_with_hits=sessions_hit,
                recomputed_tokens_per_request=round(recomputed, 1),
                excess_recompute_tokens_per_request=round(excess, 1),
                excess_recompute_share=round(excess / (reusable * w.block_size), 6) if reusable else None,
                bytes_written=written_bytes,
                bytes_written_total=total_written,
                bytes_evicted=evicted * w.block_bytes,
                hit_tokens_by_tier={n: b * w.block_size for n, b in zip(names, by_tier)},
            )
        )
        prev_ws = ws_tokens
        if progress is not None:
            progress(r)
    return PlanResult(
        name=name,
        tiers=list(tiers),
        policy=policy,
        order=order,
        workload=w,
        rounds=rounds,
        capacity_bytes=capacity_blocks * w.block_bytes,
        collapse_round=collapse,
        first_eviction_round=first_eviction,
        rounds_capacity_holds=rounds_held(w, capacity_blocks),
        rounds_largest_tier_holds=rounds_held(w, max(tier_blocks)),
        mp=mp,
    )
