"""A synthesized session workload whose prefix hit rate, at a given cache size, is a chosen number
(`--target-hit-rate R --cache-tokens C`): a block-hash trace both drivers replay as they replay a real one.

Its shape: S sessions take turns in a fixed order (session 0, 1, ..., S-1, then 0 again). Every turn of a session sends
the session's shared context (its first `shared_blocks` blocks, the same ids each turn: a document, a code base, a
long system prompt) and then a question of its own (new ids), `prompt_tokens` in all. Under LRU (the model of
`kvtier plan --trace`, replay/plan/trace.py) a session's context was last used S turns ago, during which S requests of
`n` whole blocks each were used: its blocks are still cached exactly when S x n blocks fit the cache. So S is the
largest number of sessions whose turns fit FILL (nine tenths) of C: the working set nearly fills the cache, and a
cache much smaller loses every hit (LRU under a cyclic pattern keeps nothing it will use in time) while a larger one
gains nothing. The tenth left is for what a real cache's room loses to its nominal size (entry headers, allocation
rounding, another tier's copies): at exactly C the cyclic pattern sits on LRU's cliff, and a store 1% smaller than
its plan hit a third of its target in kvtier bench.

The hit rate over N requests is then exact: the first turn of each session misses, every later turn hits its
context, `shared_blocks x block` tokens of `prompt_tokens`: (N - S) / N x shared / prompt. `shared_blocks` is the
whole number of blocks closest to the target; the block of a prompt's last token never hits (the server computes
that token anyway), so at most all blocks but the last are shared. A target beyond what N requests can reach is
refused with the number of requests that would reach it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from replay.sources.base import LoadReport, WorkloadError
from replay.sources.block_traces import BlockTrace
from replay.sources.trace_request import TraceRequest

__all__ = ["DEFAULT_BLOCK_TOKENS", "DEFAULT_TURNS", "TargetShape", "shape_for", "target_trace"]

# vLLM's default block: the prefix cache's unit, and so the unit of a hit.
DEFAULT_BLOCK_TOKENS = 16
# More requests than a run could send: a target that needs them is out of reach (one within a block of 1 that every
# turn but none would have to hit).
MAX_REQUESTS = 10**9
# The share of --cache-tokens the sessions' turns fill (the module's docstring says why not all of it).
FILL = 0.9


@dataclass(frozen=True)
class TargetShape:
    """What the target asks for: the sessions, each turn's shared context in blocks, and the rate it gives (the
    plan's, over all `requests` in order)."""

    target: float
    cache_tokens: int
    block_tokens: int
    prompt_tokens: int
    requests: int
    sessions: int
    shared_blocks: int

    @property
    def hit_rate(self) -> float:
        hits = (self.requests - min(self.sessions, self.requests)) * self.shared_blocks * self.block_tokens
        return hits / (self.requests * self.prompt_tokens)

    def as_dict(self) -> dict:
        """The results' record: the shape and the rate it plans (`from_dict` reads it back)."""
        return {**dataclasses.asdict(self), "planned_hit_rate": round(self.hit_rate, 6)}

    @classmethod
    def from_dict(cls, d: dict) -> TargetShape:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})

    def first(self, requests: int) -> TargetShape:
        """The same sessions over the first `requests` requests only (a window that ended early)."""
        return dataclasses.replace(self, requests=max(requests, 1))


# Turns a session when the run does not say how many requests: the first turns, which miss, are a tenth of them.
DEFAULT_TURNS = 10


def shape_for(
    target: float, cache_tokens: float, *, block_tokens: int, prompt_tokens: int, requests: int | None = None
) -> TargetShape:
    """The workload's shape (`requests` None: DEFAULT_TURNS a session), or a WorkloadError of one line saying what
    would make the target reachable."""
    if not 0 <= target <= 1:
        raise WorkloadError(f"--target-hit-rate {target:g}: a fraction of the prompt tokens, 0 to 1")
    whole = prompt_tokens // block_tokens  # the blocks a turn leaves in the cache (a partial one is not kept)
    cache_blocks = int(cache_tokens // block_tokens) if math.isfinite(cache_tokens) else 0
    if whole < 2 or FILL * cache_blocks < whole:
        raise WorkloadError(
            f"--target-hit-rate needs prompts of at least two {block_tokens}-token blocks and a cache of at least one "
            f"prompt in {FILL:.0%} of it: --cache-tokens {cache_tokens:g} holds {cache_blocks:,} blocks, a prompt "
            f"of {prompt_tokens:,} tokens has {whole:,}"
        )
    sessions = int(FILL * cache_blocks) // whole

    def over(n: int) -> TargetShape:
        return _closest(target, int(cache_tokens), block_tokens, prompt_tokens, n, sessions)

    shape = over(requests or DEFAULT_TURNS * sessions)
    if not _reached(shape):
        # More requests make the sessions' first turns, which miss, a smaller share: the fewest that reach the
        # target, doubling until one does (within MAX_REQUESTS) and then halving the gap (`high` always reaches it).
        low = shape.requests
        while low <= MAX_REQUESTS and not _reached(over(low * 2)):
            low *= 2
        high = low * 2
        while low + 1 < high <= MAX_REQUESTS:
            mid = (low + high) // 2
            low, high = (low, mid) if _reached(over(mid)) else (mid, high)
        warm = (shape.requests - min(sessions, shape.requests)) / shape.requests
        remedy = f"give at least {high:,} requests" if high <= MAX_REQUESTS else "give a lower target"
        raise WorkloadError(
            f"--target-hit-rate {target:g}: {shape.requests:,} requests of {prompt_tokens:,} tokens reach at most "
            f"{warm * _most(shape) * block_tokens / prompt_tokens:.3f} with the {sessions:,} sessions that fill "
            f"--cache-tokens {cache_tokens:g} (each session's first turn misses): {remedy}"
        )
    return shape


def _most(shape: TargetShape) -> int:
    """The blocks a turn can share: every block but the one of the prompt's last token (the server computes it)."""
    return (shape.prompt_tokens - 1) // shape.block_tokens


def _closest(target: float, cache: int, block: int, prompt: int, requests: int, sessions: int) -> TargetShape:
    """The shape with the whole number of shared blocks whose rate is closest to the target."""
    shape = TargetShape(target, cache, block, prompt, requests, sessions, 0)
    warm = max(requests - sessions, 0) / requests  # the share of turns that are not a session's first
    shared = min(_most(shape), round(target * prompt / (warm * block))) if warm else 0
    return dataclasses.replace(shape, shared_blocks=shared)


def _reached(shape: TargetShape) -> bool:
    """Within a block of the prompt: one block more or less moves the rate by at most that much."""
    return abs(shape.hit_rate - shape.target) <= shape.block_tokens / shape.prompt_tokens


def target_trace(shape: TargetShape, output_tokens: int) -> BlockTrace:
    """The requests in their order, all at time 0 (the run paces them: --users, a concurrency or a rate)."""
    n_blocks = math.ceil(shape.prompt_tokens / shape.block_tokens)
    own = n_blocks - shape.shared_blocks
    # ids: session s's context is s * shared + k; each question's blocks are new ids after every context's
    base = shape.sessions * shape.shared_blocks
    requests = []
    for i in range(shape.requests):
        s = i % shape.sessions
        context = range(s * shape.shared_blocks, (s + 1) * shape.shared_blocks)
        question = range(base + i * own, base + (i + 1) * own)
        requests.append(TraceRequest(0.0, shape.prompt_tokens, output_tokens, (*context, *question)))
    report = LoadReport(source="hit-rate", tokenizer="synthesized token counts")
    report.conversations, report.turns = shape.sessions, shape.requests
    return BlockTrace(f"hit-rate-{shape.target:g}", tuple(requests), shape.block_tokens, report)
