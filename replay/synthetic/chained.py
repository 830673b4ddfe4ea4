"""`kvtier bench --prefix-model chained`: multi-round sessions whose KV is a chain of blocks, as an engine's prefix
cache keeps it, over the real tiered store.

The model is the one `kvtier plan` simulates (replay/plan/model.py), here with real entries, real tiers and real I/O:
- Every user runs one session; sessions advance one turn per round together (round r + 1 starts when every session's
  turn r is done), as `kvtier replay --rounds` drives a server. A turn's prompt is the previous prompt, the previous
  answer and the turn's input.
- A session's KV is a chain of `block_size`-token blocks. Block k is the entry `<session>/b<k>`: a session's history
  only grows, so (session, k) names the KV of tokens 0..(k+1)*block_size exactly, as a chained hash does.
- A request looks its blocks up in chain order and stops at the first one missing from every tier: later blocks are
  of no use without it (a lost head block costs the whole prefix). Never the block of the prompt's last token, which a
  server always computes. The hit blocks become most recent in their tier.
- The rest of the prompt is computed (simulated GPU time, generation.prefill_ms_per_token of the generation mode) and
  its whole blocks written; blocks still stored past the first miss are left as they are. Look-up and compute are
  one request at a time, in the order the requests arrive (one GPU, on which an engine schedules a request's prefill
  and looks its prefix up then); the writes run after it, beside the next request's turn. Looking every request up
  at once on arrival instead lets the chains written last in a round survive into the next (18-42% hits where the
  sequential model, and the vLLM run of the published GP7000 long-session measurement (replay/plan/README.md),
  collapse to 0).
- Decode is simulated generation time (the KV stays on the GPU while it is made), then the answer's whole blocks are
  written too (the engine's prefix cache keeps generated blocks), so the next turn can reuse prompt and answer:
  `kvtier plan --answer-kv reused`. Decode reads nothing from the store in this model.
With a CPU tier smaller than the working set and no room below it, LRU evicts the oldest blocks, which are every
session's chain heads, and the hit rate falls off a cliff; a disk tier below takes the demoted blocks and keeps it.

Each round gets one row with the columns of replay's per-round table (replay/openai/report.py), computed from the
requests themselves (there is no server to scrape): hit rate = prompt tokens found in any tier / prompt tokens,
ideal = the part of each prompt sent before in its session, in whole blocks, never the last token. Beside them,
`predicted_hit_rate` is what `kvtier plan`'s chained-block LRU (replay.plan.ChainLRU) predicts for the same sessions,
turn sizes and tiers (each tier's blocks at its target usage ratio), sessions taken in their fixed order: the model
checked against the store.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvconnector.errors import ConfigError
from kvconnector.histogram import LatencyHistogram
from kvconnector.store import TieredStore

from ..plan.model import ChainLRU
from ..sources.base import Conversation
from ..sources.synthetic_users import SyntheticUser
from .config import BenchConfig
from .payload import RandomPayload
from .workload import Session, Workload

__all__ = ["ChainedRounds", "block_key"]


def block_key(session_id: str, k: int) -> str:
    return f"{session_id}/b{k}"


@dataclass
class _Round:
    requests: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    predicted_tokens: int = 0
    ideal_tokens: int = 0
    recomputed_tokens: int = 0
    written_bytes: int = 0
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    ttft: LatencyHistogram = field(default_factory=LatencyHistogram)
    tpot: LatencyHistogram = field(default_factory=LatencyHistogram)
    ttft_ns: int = 0  # summed over the round's requests, as the decode time
    decode_ns: int = 0


class RoundsDriver(Protocol):
    """What ChainedRounds uses of the SyntheticDriver that owns it: its store, workload, payload and accounting, and
    its I/O queue. Declared here so that this module does not import the driver, which imports it."""

    cfg: BenchConfig
    store: TieredStore
    workload: Workload
    payload: RandomPayload
    bytes_per_token: int
    req: Any  # driver.RequestStats
    _qos_key: dict
    _deadline_ns: int
    _done: asyncio.Event

    async def _io(self, priority: tuple, phase: str, fn, *args): ...

    async def _rate_limit(self) -> None: ...

    def _record_request(self, session: Session, t_submit: int, t_start: int, **counts) -> None: ...


def check_block_fits(driver: RoundsDriver, block_bytes: int, what: str, remedy: str) -> None:
    """A block no tier takes makes every block a refused store: a run of misses that measures nothing."""
    limit = int(driver.cfg.eviction.large_entry_limit_ratio * max(t.capacity_bytes for t in driver.store.tiers))
    if block_bytes > limit:
        raise ConfigError(f"{what} ({block_bytes:,} B) fits no tier (the largest takes {limit:,} B): {remedy}")


def tier_blocks(driver: RoundsDriver, block_bytes: int) -> list[int]:
    """kvtier plan's view of the store: the whole blocks each tier keeps at its target usage (a tier that cannot take
    one block holds none)."""
    ratio, big = driver.cfg.eviction.target_usage_ratio, driver.cfg.eviction.large_entry_limit_ratio
    return [
        int(ratio * t.capacity_bytes) // block_bytes if block_bytes <= big * t.capacity_bytes else 0
        for t in driver.store.tiers
    ]


class ChainedRounds:
    """Drives the sessions of one run in rounds on the driver's store, pool and accounting; `rows` is the per-round
    table once `run()` returns (rounds cut by the end of the window are not in it)."""

    def __init__(self, driver: RoundsDriver) -> None:
        self.d = driver
        self.block = driver.cfg.block_size
        self.block_bytes = self.block * driver.bytes_per_token
        check_block_fits(
            driver, self.block_bytes, f"--block-size {self.block}: one block", "give a smaller block or more room"
        )
        self.rows: list[dict] = []
        self.round = 0  # the round under way (1-based), for progress views
        self._gpu = asyncio.Lock()  # FIFO: waiters get it in the order they asked

    def progress(self) -> dict:
        """The round under way and the last whole round's hit rate against its ideal, for the progress view."""
        out: dict = {"round": self.round}
        if self.rows:
            last = self.rows[-1]
            out["last_round"] = {k: last[k] for k in ("round", "hit_rate", "ideal_hit_rate")}
        return out

    def _sessions(self) -> list[tuple]:
        """(user, session) per user. With `rounds`, synthetic users' sessions get exactly that many turns (sizes drawn
        from their template as usual), dataset sessions are cut to it."""
        d, n = self.d, self.d.cfg.rounds
        out = []
        for i in range(d.cfg.num_users):
            user = d.workload.new_user(i)
            if n and d.workload.kind == "synthetic":
                t = user.template
                su = SyntheticUser(i, user.profile, t.context_tokens, t.generate_tokens, t.think_time_s)
                conv = next(su.conversations(user.rng, True, 0.0, n))
                session = Session(conv.conversation_id, conv, user.profile, user.qos, None)
            else:
                session = d.workload.next_session(user)
                if session is None:
                    break
                if n and len(session.conversation.turns) > n:
                    c = session.conversation
                    session = Session(
                        session.session_id,
                        Conversation(c.conversation_id, c.turns[:n], c.system_prompt),
                        session.profile,
                        session.qos,
                        None,
                    )
            out.append((user, session))
        return out

    def _predictor(self, sessions: int, rounds: int) -> ChainLRU:
        """kvtier plan's model of this store (`tier_blocks`)."""
        blocks = tier_blocks(self.d, self.block_bytes)
        return ChainLRU(blocks, sessions, sessions * rounds + 1)

    async def run(self) -> None:
        d, bs = self.d, self.block
        plans = self._sessions()
        history = {s.session_id: 0 for _, s in plans}  # tokens of each session's chain so far (prompt + answer)
        rounds = max((len(s.conversation.turns) for _, s in plans), default=0)
        model = self._predictor(len(plans), rounds)
        for r in range(rounds):
            if time.perf_counter_ns() >= d._deadline_ns:
                break
            self.round = r + 1
            stats = _Round()
            bytes0 = self._tier_bytes()
            start = time.perf_counter_ns()
            live = []
            for i, (u, s) in enumerate(plans):
                if r < len(s.conversation.turns):
                    before, turn = history[s.session_id], s.conversation.turns[r]
                    prompt = d.workload.entry_tokens(max(1, before + turn.input_tokens))
                    live.append((u, s, prompt))
                    predicted = model.request(i, min(before, prompt - 1) // bs, (prompt + turn.output_tokens) // bs)
                    stats.predicted_tokens += predicted.hit_blocks * bs
            stats.requests = len(live)
            await asyncio.gather(*(self._turn(u, s, r, p, history, stats) for u, s, p in live))
            self.rows.append(self._row(r, stats, time.perf_counter_ns() - start, self._tier_bytes(bytes0)))
            if d.cfg.max_requests and d.req.completed >= d.cfg.max_requests:
                break
        d._done.set()

    def _row(self, r: int, st: _Round, wall_ns: int, kv_bytes: dict) -> dict:
        def rate(n: int) -> float | None:
            return round(n / st.prompt_tokens, 6) if st.prompt_tokens else None

        def ratio(a: float | None, b: float | None, digits: int = 4) -> float | None:
            return round(a / b, digits) if a is not None and b else None

        per_req = (lambda n: round(n / st.completed, 1)) if st.completed else (lambda n: None)
        hit, ideal = rate(st.hit_tokens), rate(st.ideal_tokens)
        excess = st.ideal_tokens - st.hit_tokens  # computed although a cache could have held it
        lived = st.completed * wall_ns
        return {
            "round": r + 1,
            "requests": st.requests,
            "completed": st.completed,
            "errors": st.requests - st.completed,
            "hit_rate": hit,
            "ideal_hit_rate": ideal,
            "hit_to_ideal": ratio(hit, ideal),
            "predicted_hit_rate": rate(st.predicted_tokens),
            "prefix_cache_hit_rate": None,  # no engine: every hit is a tier's
            "external_hit_rate": rate(st.hit_tokens),
            "ttft_p50_ms": round(st.ttft.percentile_ms(50), 3),
            "ttft_p95_ms": round(st.ttft.percentile_ms(95), 3),
            "tpot_p50_ms": round(st.tpot.percentile_ms(50), 3) if st.tpot.count else None,
            "requests_per_s": ratio(st.completed, wall_ns / 1e9),
            "ttft_share": ratio(st.ttft_ns, lived),
            "decode_share": ratio(st.decode_ns, lived),
            "prompt_tokens_per_request": per_req(st.prompt_tokens),
            "recomputed_tokens_per_request": per_req(st.prompt_tokens - st.hit_tokens),
            "reusable_tokens_per_request": per_req(st.ideal_tokens),
            "excess_recompute_per_request": per_req(excess),
            "excess_recompute_share": ratio(excess, st.ideal_tokens),
            "kv_written_bytes": st.written_bytes,
            "kv_bytes_by_tier": kv_bytes,
            "preemptions": None,
            "wall_s": round(wall_ns / 1e9, 4),
            "hit_tokens_by_tier": dict(st.hit_tokens_by_tier),
        }

    def _tier_bytes(self, since: dict | None = None) -> dict[str, dict[str, int]]:
        """Bytes written and read per tier (demotions included), since `since` when given: replay's kv_bytes_by_tier."""
        now = {s.name: {"write": s.write.nbytes, "read": s.read.nbytes} for s in self.d.store.stats}
        if since is None:
            return now
        return {t: {op: v - since.get(t, {}).get(op, 0) for op, v in ops.items()} for t, ops in now.items()}

    async def _write_blocks(self, prio: tuple, phase: str, sid: str, first: int, end: int, rng) -> tuple[int, int]:
        """Write blocks first..end-1 of a chain (one already stored is left as it is); (storage ns, bytes written)."""
        d, ns, written = self.d, 0, 0
        for k in range(first, end):
            w = await d._io(prio, phase, d.store.put, block_key(sid, k), d.payload.chunks(self.block_bytes, rng))
            ns += w.timing.total_ns
            written += self.block_bytes if w.stored else 0
        return ns, written

    async def _turn(self, user, session: Session, r: int, prompt: int, history: dict[str, int], st: _Round) -> None:
        d, cfg, bs, sid = self.d, self.d.cfg, self.block, session.session_id
        turn = session.conversation.turns[r]
        t_submit = time.perf_counter_ns()
        prio = (d._qos_key[session.qos], t_submit)
        await d._rate_limit()
        t_start = time.perf_counter_ns()
        before = history[sid]
        ideal_blocks = min(before, prompt - 1) // bs
        storage_ns = hits = gen_ns = 0
        by_tier: dict[str, int] = {}
        ms = cfg.generation.prefill_ms_per_token.get(cfg.generation_mode, 0.0)
        # Admission: the engine looks a request's prefix up when it schedules its prefill, one request after another
        # on the GPU, not when the request arrives; the wait for the GPU is part of the TTFT.
        async with self._gpu:
            for k in range((prompt - 1) // bs):  # the chain up to its first missing block
                g = await d._io(prio, "multi_turn", d.store.get, block_key(sid, k))
                storage_ns += g.timing.total_ns
                if not g.hit:
                    break
                hits += 1
                by_tier[g.tier] = by_tier.get(g.tier, 0) + bs
            computed = prompt - hits * bs
            if ms and computed:
                g0 = time.perf_counter_ns()
                await asyncio.sleep(computed * ms / 1000)
                gen_ns += time.perf_counter_ns() - g0
        ns, written = await self._write_blocks(prio, "prefill", sid, hits, prompt // bs, user.rng)
        storage_ns += ns
        ttft_ns = time.perf_counter_ns() - t_start
        out = turn.output_tokens
        decode_ns = 0
        if cfg.ms_per_token and out > 0 and not cfg.prefill_only:
            g0 = time.perf_counter_ns()
            await asyncio.sleep(out * cfg.ms_per_token / 1000)
            decode_ns = time.perf_counter_ns() - g0
            gen_ns += decode_ns
        total = prompt + out
        ns, answer = await self._write_blocks(prio, "decode", sid, prompt // bs, total // bs, user.rng)
        storage_ns += ns
        history[sid] = total
        d._record_request(
            session,
            t_submit,
            t_start,
            prompt_tokens=prompt,
            generated_tokens=out,
            storage_ns=storage_ns,
            gen_ns=gen_ns,
            prefill_bytes=written + answer,
            multi_turn=(int(hits > 0), int(hits == 0 and ideal_blocks > 0)),
        )
        st.completed += 1
        st.prompt_tokens += prompt
        st.hit_tokens += hits * bs
        st.ideal_tokens += ideal_blocks * bs
        st.written_bytes += written + answer
        st.ttft.record_ns(ttft_ns)
        st.ttft_ns += ttft_ns
        st.decode_ns += decode_ns
        if decode_ns and out > 1:
            st.tpot.record_ns(decode_ns // (out - 1))
        for tier, n in by_tier.items():
            st.hit_tokens_by_tier[tier] = st.hit_tokens_by_tier.get(tier, 0) + n
