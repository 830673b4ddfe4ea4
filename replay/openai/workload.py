"""From workload sources to session plans the driver sends: prompt texts, token budgets, arrival times.

Texts of a given token length (BurstGPT rows, synthetic prompts) are random walks over a fixed word list, sized with the
*server's* tokenizer when it has vLLM's ``/tokenize`` endpoint (each word counted once at start-up), else a
local estimate (about 4 characters per token). `TextMaker.mode` says which, and the
summary reports it; the server's `usage.prompt_tokens` gives the exact count afterwards either way.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from replay.sources.base import Conversation, WorkloadError
from replay.sources.block_traces import BlockTrace
from replay.sources.trace_timing import ideal_starts, pause_s

__all__ = [
    "SessionPlan",
    "TextMaker",
    "TurnPlan",
    "linked_plans_from_block_trace",
    "long_session_plans",
    "plans_from_block_trace",
    "plans_from_conversations",
    "synthetic_plans",
]

_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point number "
    "group problem fact cache memory tier block token prefix server request model layer store disk page flash "
    "read write latency round session reuse queue batch stream vector matrix kernel device network packet route "
    "table index value count limit range order shape weight scale level state event signal field record entry "
    "river mountain garden window letter market winter summer music paper story bridge forest silver planet"
).split()


@dataclass(frozen=True, slots=True)
class TurnPlan:
    user_text: str
    max_tokens: int
    target_input_tokens: int
    arrival_offset_ns: int | None = None  # trace time from the run start; None = as soon as the previous turn allows
    # Makes the text when the turn is sent, for sources whose every prompt is made (a block-hash trace): the run
    # starts at once and holds only the prompts in flight, not one per row. None: `user_text` is the text.
    make_text: Callable[[], str] | None = field(default=None, compare=False)
    # A linked session's call (SessionPlan.linked): the turn whose end it follows (-1: the run's start), the turns
    # that must have ended first (sub-agents it joins), and the pause after the turn it follows.
    after: int = -1
    joins: tuple[int, ...] = ()
    pause_ns: int = 0

    def text(self) -> str:
        return self.user_text if self.make_text is None else self.make_text()


@dataclass(frozen=True, slots=True)
class SessionPlan:
    session_id: str
    turns: tuple[TurnPlan, ...]
    system_prompt: str | None = None
    # The turns are the calls of an agentic trace's conversation and its sub-agents (--trace-timing think): each
    # stands alone (its prompt carries its history) and goes when what it follows and joins have ended.
    linked: bool = False


class TextMaker:
    """Makes texts of about N tokens from a fixed word list; `prepare` calibrates it on the server's tokenizer.

    Calibration asks the server's ``/tokenize`` for the token count of each word (with its leading space) once, about
    150 small calls at start-up; a text is then a seeded random walk over the words whose counts add up to N. Byte-level
    BPE and SentencePiece tokenizers do not merge across a space, so the sum is the text's count give or take a token
    at the start. Without ``/tokenize`` every word counts as len/4 tokens (the documented estimate).
    """

    def __init__(self, seed: int = 0):
        self._seed = seed
        self._words = list(dict.fromkeys(_WORDS))
        self._cost = {w: max(1, round((len(w) + 1) / 4)) for w in self._words}
        self.mode = "estimate:chars/4"
        self.fallback_reason: str | None = "not probed"

    async def prepare(self, session: aiohttp.ClientSession, base_url: str, model: str, timeout_s: float = 30.0) -> None:
        """Calibrate on the server's ``/tokenize`` at `base_url` (the server root); the whole calibration gets at
        most `timeout_s`, after which the estimate is used and `fallback_reason` says why."""
        base = base_url.rstrip("/")

        async def count(text: str) -> int:
            async with session.post(f"{base}/tokenize", json={"model": model, "prompt": text}) as r:
                if r.status != 200:
                    raise LookupError(f"/tokenize answered HTTP {r.status}")
                body = await r.json()
                n = body.get("count", len(body.get("tokens") or []))
                return int(n)

        async def calibrate() -> tuple[int, list[int]]:
            empty = await count("x")  # BOS and the like, plus the one token of "x"
            return empty, await asyncio.gather(*(count("x " + w) for w in self._words))

        try:
            # One deadline for the whole calibration, so a server whose /tokenize hangs delays the start by no more.
            empty, counts = await asyncio.wait_for(calibrate(), timeout_s)
        except TimeoutError:
            self.fallback_reason = f"/tokenize did not answer within {timeout_s:g} s"
            return
        except LookupError as exc:
            self.fallback_reason = str(exc)
            return
        except (aiohttp.ClientError, ValueError, TypeError, OSError) as exc:
            self.fallback_reason = f"/tokenize unavailable ({type(exc).__name__})"
            return
        self._cost = {w: max(1, c - empty) for w, c in zip(self._words, counts)}
        self.mode = "server:/tokenize"
        self.fallback_reason = None

    async def make(self, n_tokens: int, rng: random.Random) -> str:
        return self.text(n_tokens, rng)

    def block_prompt(self, hash_ids: tuple[int, ...], input_tokens: int, block_tokens: int, unique: str) -> str:
        """A prompt of `input_tokens` whose k-th block of `block_tokens` is the same text wherever the trace has the
        same k-th id (and the same ids before it), so prompts sharing k leading ids share their first k blocks of
        tokens and differ from the first different id on. Each block's text depends only on its id (seeded by it);
        token counts add up across blocks because every word after the first carries its leading space, as the
        calibration counted it. Blocks past the ids (a trace may hash fewer) are text no other prompt has."""
        parts = []
        for k in range(-(-input_tokens // block_tokens)):
            n = min(block_tokens, input_tokens - k * block_tokens)
            seed = f"{self._seed}:block:{hash_ids[k]}" if k < len(hash_ids) else f"{self._seed}:{unique}:{k}"
            parts.append(self.text(n, random.Random(seed)))
        return " ".join(parts)

    def text(self, n_tokens: int, rng: random.Random) -> str:
        n_tokens = max(1, n_tokens)
        ones = [w for w in self._words if self._cost[w] == 1] or self._words
        out: list[str] = []
        used = 0
        words, cost = self._words, self._cost
        while used < n_tokens:
            w = words[rng.randrange(len(words))]
            if used + cost[w] > n_tokens:
                w = ones[rng.randrange(len(ones))]
            out.append(w)
            used += cost[w]
        return " ".join(out)


def _max_tokens(turn_out: int, fixed: int | None, cap: int | None) -> int:
    n = fixed if fixed is not None else turn_out
    if cap is not None:
        n = min(n, cap)
    return max(1, n)


async def plans_from_conversations(
    convs: list[Conversation],
    maker: TextMaker,
    rng: random.Random,
    *,
    num_requests: int | None,
    fixed_max_tokens: int | None,
    max_tokens_cap: int | None,
    trace_offsets_ns: list[int] | None = None,
) -> list[SessionPlan]:
    """ShareGPT (text) or BurstGPT (token counts, texts made to length) conversations -> plans, capped at N requests.

    trace_offsets_ns: the per-turn schedule for traced sources, in the same flattened turn order (-1 = beyond duration).
    """
    plans: list[SessionPlan] = []
    total = 0
    k = 0
    for conv in convs:
        if num_requests is not None and total >= num_requests:
            break
        turns = []
        for t in conv.turns:
            off = None
            if trace_offsets_ns is not None:
                off = trace_offsets_ns[k]
            k += 1
            if num_requests is not None and total >= num_requests:
                continue
            if off is not None and off < 0:
                continue
            text = t.text if t.text is not None else await maker.make(t.input_tokens, rng)
            turns.append(
                TurnPlan(text, _max_tokens(t.output_tokens, fixed_max_tokens, max_tokens_cap), t.input_tokens, off)
            )
            total += 1
        if turns:
            plans.append(SessionPlan(conv.conversation_id, tuple(turns), conv.system_prompt))
    return plans


# Plans made between two yields to the event loop, so a signal is heard while a long trace is planned.
_PLANS_PER_YIELD = 4096


async def plans_from_block_trace(
    trace: BlockTrace,
    maker: TextMaker,
    *,
    fixed_max_tokens: int | None,
    max_tokens_cap: int | None,
    trace_offsets_ns: list[int] | None,
) -> list[SessionPlan]:
    """A block-hash trace (Mooncake) -> one single-turn plan per request, at its trace time (-1 = past the window;
    `trace_offsets_ns` None: a trace without times, paced by the run), its prompt made block by block from its hash
    ids (TextMaker.block_prompt) when it is sent, not here, or the trace's own text where it has one."""
    plans = []
    offsets = trace_offsets_ns if trace_offsets_ns is not None else [None] * len(trace.requests)
    for i, (req, off) in enumerate(zip(trace.requests, offsets, strict=True)):
        if i % _PLANS_PER_YIELD == _PLANS_PER_YIELD - 1:
            await asyncio.sleep(0)
        if off is not None and off < 0:
            continue
        text, make = _trace_prompt(maker, trace, i)
        max_tokens = _max_tokens(req.output_tokens, fixed_max_tokens, max_tokens_cap)
        plans.append(SessionPlan(f"{trace.name}-{i}", (TurnPlan(text, max_tokens, req.input_tokens, off, make),)))
    return plans


def _trace_prompt(maker: TextMaker, trace: BlockTrace, i: int) -> tuple[str, Callable[[], str] | None]:
    """Request i's prompt: its own text (TurnPlan.user_text), or the maker of its blocks' text (TurnPlan.make_text)."""
    r = trace.requests[i]
    if r.text is not None:
        return r.text, None
    return "", functools.partial(maker.block_prompt, r.hash_ids, r.input_tokens, trace.block_tokens, f"request:{i}")


async def linked_plans_from_block_trace(
    trace: BlockTrace,
    maker: TextMaker,
    *,
    fixed_max_tokens: int | None,
    max_tokens_cap: int | None,
    max_idle_s: float,
    speedup: float,
    duration_s: float | None,
) -> list[SessionPlan]:
    """A trace with sessions -> one linked plan per conversation (its calls and its sub-agents' calls, linked as
    the trace links them: replay/sources/trace_timing.py), conversations in the order they start. A call that even
    an infinitely fast server would start past the window (its chain of pauses alone reaches it) is left out, and
    so is everything that waits for it."""
    reqs = trace.requests
    earliest = ideal_starts(reqs, max_idle_s, with_api=False)
    limit_s = math.inf if duration_s is None else duration_s * speedup
    # the conversation of each call: the requests joined by their links
    root = list(range(len(reqs)))

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, r in enumerate(reqs):
        for j in (r.after, *r.joins):
            if j >= 0:
                root[find(i)] = find(j)
    members: dict[int, list[int]] = {}
    for i in range(len(reqs)):
        if earliest[i] < limit_s:
            members.setdefault(find(i), []).append(i)
    plans = []
    for n, (_, calls) in enumerate(sorted(members.items(), key=lambda kv: (earliest[kv[1][0]], kv[0]))):
        if n % _PLANS_PER_YIELD == _PLANS_PER_YIELD - 1:
            await asyncio.sleep(0)
        at = {i: k for k, i in enumerate(calls)}
        turns = []
        for i in calls:
            r = reqs[i]
            text, make = _trace_prompt(maker, trace, i)
            max_tokens = _max_tokens(r.output_tokens, fixed_max_tokens, max_tokens_cap)
            pause_ns = round(pause_s(r, max_idle_s) / speedup * 1e9)
            after = at[r.after] if r.after >= 0 else -1
            turns.append(
                TurnPlan(text, max_tokens, r.input_tokens, None, make, after, tuple(at[j] for j in r.joins), pause_ns)
            )
        plans.append(SessionPlan(f"{trace.name}-{calls[0]}", tuple(turns), linked=True))
    return plans


def _length(mean: int, range_ratio: float, rng: random.Random) -> int:
    if range_ratio <= 0:
        return mean
    lo, hi = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
    return rng.randint(lo, hi)


async def synthetic_plans(
    maker: TextMaker,
    rng: random.Random,
    *,
    sessions: int,
    turns: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    prefix_groups: int = 1,
) -> list[SessionPlan]:
    """Synthetic sessions: a shared prefix per group (round-robin), then unique inputs; lengths fixed or uniform
    in [L*(1-r), L*(1+r)]."""
    prefixes = [await maker.make(prefix_len, rng) for _ in range(max(1, prefix_groups))] if prefix_len > 0 else []
    plans = []
    for s in range(sessions):
        tp = []
        for t in range(turns):
            n_in = _length(input_len, range_ratio, rng)
            text = await maker.make(n_in, rng)
            if t == 0 and prefixes:
                text = prefixes[s % len(prefixes)] + "\n" + text
                n_in += prefix_len
            tp.append(TurnPlan(text, _length(output_len, range_ratio, rng), n_in))
        plans.append(SessionPlan(f"syn-{s}", tuple(tp)))
    return plans


async def long_session_plans(
    convs: list[Conversation] | None,
    maker: TextMaker,
    rng: random.Random,
    *,
    concurrency: int,
    rounds: int,
    output_len: int,
    input_len: int,
    prefix_len: int,
) -> tuple[list[SessionPlan], int]:
    """C sessions of N rounds each, output forced to `output_len`. ShareGPT sessions reuse a conversation's questions
    in order and cycle them when it has fewer than N; returns (plans, cycled_turns)."""
    plans, cycled = [], 0
    if convs is not None:
        pool = sorted(convs, key=lambda c: -len(c.turns))[:concurrency]
        if len(pool) < concurrency:
            raise WorkloadError(f"long-session mode needs {concurrency} conversations, the dataset has {len(pool)}")
        for c in pool:
            tp = []
            for r in range(rounds):
                t = c.turns[r % len(c.turns)]
                cycled += r >= len(c.turns)
                tp.append(TurnPlan(t.text or "", output_len, t.input_tokens))
            plans.append(SessionPlan(c.conversation_id, tuple(tp), c.system_prompt))
        return plans, cycled
    syn = await synthetic_plans(
        maker,
        rng,
        sessions=concurrency,
        turns=rounds,
        input_len=input_len,
        output_len=output_len,
        prefix_len=prefix_len,
        prefix_groups=concurrency,
    )
    return syn, 0
