"""Prefix hit rates of a block-hash trace over LRU caches of any size, from one pass over the trace.

What it models: a KV cache of whole blocks under LRU (vLLM's prefix cache, LMCache's chunks, kvtier's tiers). A
request looks its blocks up in order and its hit stops at the first block missing from the cache (a block's KV depends
on every token before it, so vLLM's and LMCache's lookups stop there too); then every block of the request is used,
hits refreshed and misses computed and stored (its whole blocks: a trailing partial block is not kept). Tiers, fastest
first, form one exclusive waterfall (a block lives in one tier, new and hit blocks go to the top, a full tier's least
recent block moves down, the bottom tier drops it), which for hits and misses is one LRU list as long as all tiers
together; a hit's tier is where its recency puts it. This is the model of `replay/plan/model.py`, for requests whose
blocks form a tree instead of chains.

Why one pass serves every capacity: every block of every request is used whether it hits or not, so the sequence of
block uses does not depend on the cache, and LRU is a stack algorithm (Mattson et al., "Evaluation techniques for
storage hierarchies", IBM Systems Journal 1970): a cache of C blocks holds a block exactly when fewer than C distinct
blocks were used since its previous use (its depth). A request's depths are taken at its lookup, before it uses any
block; with the prefix rule its block k hits when the largest depth among blocks 0..k is below C, and a hit comes from
the tier its own depth falls in. So the trace is reduced once to, per block, that prefix-maximum depth, its own depth
and its tokens; any capacity, sweep or tier split is then a sum.

Tokens: as vLLM counts them, a hit brings whole blocks only, and never the block that holds the prompt's last token
(the server computes that token anyway, so a prompt of exactly k blocks hits at most k - 1). The hit rate is hit
tokens over prompt tokens, over the whole trace; a trace without a prompt token has none (None).

Capacities: any number of tokens, 2^63 blocks and 10^30 tokens included. A depth is below the number of distinct
blocks, so a cache of that many blocks already holds every block seen before; a larger one is taken as that many
before it meets the int64 depths (where 2^63 and more would have compared above NEVER and counted first uses as hits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from replay.sources.block_traces import BlockTrace

__all__ = ["ReuseProfile", "curve", "reuse_profile", "sweep_capacities"]

NEVER = np.iinfo(np.int64).max  # the distance of a block's first use: no cache holds it


@dataclass(frozen=True)
class ReuseProfile:
    """Per block use of a trace: the prefix-maximum depth at lookup (a hit iff below the capacity in blocks), its own
    depth (the tier it is in), and the tokens it brings on a hit."""

    name: str
    block_tokens: int
    requests: int
    prompt_tokens: int
    unique_blocks: int
    prefix_depth: np.ndarray
    own_depth: np.ndarray
    tokens: np.ndarray

    def blocks(self, capacity_tokens: float) -> int:
        """The capacity in whole blocks, at most the distinct blocks (a larger cache holds no more of the trace), so
        it compares with the int64 depths as the Python int it is."""
        if not capacity_tokens > 0:
            return 0
        if capacity_tokens >= self.unique_blocks * self.block_tokens:  # inf included
            return self.unique_blocks
        return int(capacity_tokens // self.block_tokens)  # whole blocks only

    def hit_tokens(self, capacity_tokens: float) -> int:
        return int(self.tokens[self.prefix_depth < self.blocks(capacity_tokens)].sum())

    def _rate(self, tokens: float) -> float | None:
        return tokens / self.prompt_tokens if self.prompt_tokens else None

    def hit_rate(self, capacity_tokens: float) -> float | None:
        """Hit tokens over prompt tokens; None for a trace without a prompt token."""
        return self._rate(self.hit_tokens(capacity_tokens))

    @property
    def max_hit_rate(self) -> float | None:
        """An infinite cache: every block seen before hits (the trace's theoretical maximum)."""
        return self._rate(int(self.tokens[self.prefix_depth < NEVER].sum()))

    def tier_hit_rates(self, tier_tokens: Sequence[float]) -> list[float | None]:
        """Hit rate served by each tier of an exclusive waterfall of these sizes (fastest first); the sum is the hit
        rate of one cache as large as all of them."""
        # Python ints summed, then bounded: the bound of tier i is the capacity of tiers 0..i together.
        bounds, total = [], 0
        for t in tier_tokens:
            total += self.blocks(t)
            bounds.append(min(total, self.unique_blocks))
        hit = self.prefix_depth < (bounds[-1] if bounds else 0)
        tier = np.searchsorted(np.array(bounds, dtype=np.int64), self.own_depth[hit], side="right")
        return [self._rate(float(v)) for v in np.bincount(tier, self.tokens[hit], len(bounds))]


def reuse_profile(trace: BlockTrace, progress: Callable[[int, int], None] | None = None) -> ReuseProfile:
    """One pass over the trace (O(uses x log uses)): depths by a Fenwick tree over use times holding a 1 at the time of
    each block's latest use; a block's depth is the number of 1s after its previous use."""
    total = sum(min(len(r.hash_ids), r.input_tokens // trace.block_tokens) for r in trace.requests)
    tree = [0] * (total + 1)
    last: dict[int, int] = {}
    prefix = np.empty(total, dtype=np.int64)
    own = np.empty(total, dtype=np.int64)
    tokens = np.zeros(total, dtype=np.int64)
    now = 0
    prompt_tokens = 0
    b = trace.block_tokens
    for n, req in enumerate(trace.requests):
        prompt_tokens += req.input_tokens
        running = -1
        # Depths as the lookup sees them, before this request moves any of its blocks up (the tier a hit comes from).
        # Only whole blocks are kept (vLLM hashes full blocks only; LMCache stores full chunks only: on the live stack
        # the lookups counted equal the prompts' full blocks), so a trailing partial block takes no room in the cache.
        ids = req.hash_ids[: req.input_tokens // b]
        depths = [NEVER if (t := last.get(h)) is None else _count_after(tree, t, now) for h in ids]
        for k, (h, d) in enumerate(zip(ids, depths, strict=True)):
            before = last.get(h)
            if before is not None:
                _add(tree, before, -1)
            _add(tree, now, 1)
            last[h] = now
            running = max(running, d)
            prefix[now], own[now] = running, d
            tokens[now] = b if (k + 1) * b < req.input_tokens else 0  # whole, and not the last token's block
            now += 1
        if progress is not None and n % 1000 == 999:
            progress(n + 1, len(trace.requests))
    return ReuseProfile(trace.name, b, len(trace.requests), prompt_tokens, len(last), prefix, own, tokens)


def _add(tree: list[int], i: int, delta: int) -> None:
    i += 1
    n = len(tree)
    while i < n:
        tree[i] += delta
        i += i & -i


def _count_after(tree: list[int], before: int, now: int) -> int:
    """How many 1s lie at times before+1 .. now-1."""
    return _prefix(tree, now) - _prefix(tree, before + 1)


def _prefix(tree: list[int], i: int) -> int:
    s = 0
    while i > 0:
        s += tree[i]
        i -= i & -i
    return s


def sweep_capacities(lo: float, hi: float, per_decade: int = 4) -> list[float]:
    """Capacities in tokens from lo to hi, evenly spaced on a log scale (per_decade points per factor of 10)."""
    decades = np.log10(hi) - np.log10(lo)
    points = max(2, int(round(decades * per_decade)) + 1)
    return [float(x) for x in np.logspace(np.log10(lo), np.log10(hi), points)]


def curve(profile: ReuseProfile, capacities: Iterable[float]) -> list[float | None]:
    return [profile.hit_rate(c) for c in capacities]
