"""One simulated request of the in-process driver, against the tiered store (mixed into SyntheticDriver, whose
store, I/O pool and statistics it uses).

A request, in order: (prefix caching) read the conversation's system-prompt KV, or write it on a miss; (RAG) read
its top-k document chunks as one burst; (multi-turn) read the previous turn's KV; (prefill) write the KV of the
tokens this turn adds (its input plus the previous answer); (decode) read it ceil(generate_tokens / batch size) times,
with simulated generation time between batches. --prefill-only skips decode; --decode-only only reads pre-populated
entries.

--prefix-model chained replaces all of that with sessions in lockstep rounds whose KV is a chain of blocks, reused up
to the first block missing from every tier (replay/synthetic/chained.py; one row per round in `RunOutcome.rounds`).

--request-model reference does what the MLPerf reference does instead, so the same flags give comparable numbers:
synthetic users draw their sizes once and each request below them (workload.reference_user_ranges), a request's
entry holds its whole context (the source's context tokens), every earlier turn of the conversation is
read back, a request of 10,000 context tokens or more is prefill only (no decode), decode is one read plus
ceil(generate_tokens / batch size) more with the generation time after them (a missing entry is written again),
--max-concurrent-allocs bounds the prefill writes only, and the I/O pool has min(users, 500) threads (the
reference's request threads) unless --io-workers is given.
"""

from __future__ import annotations

import asyncio
import math
import random
import time

import xxhash

from .stats import ClassStats
from .workload import Session

# --request-model reference: requests with this many context tokens or more are prefill only (the reference's rule).
REFERENCE_PREFILL_ONLY_TOKENS = 10_000


def system_prompt_key(text: str) -> str:
    return "sys/" + xxhash.xxh3_64_hexdigest(text.encode())


def rag_key(doc: int, chunk: int) -> str:
    return f"rag/d{doc}/c{chunk}"


class SimulatedRequest:
    """The request path of SyntheticDriver: prefix, RAG, previous turn, prefill, decode, each through the I/O pool."""

    # ---- one request -----------------------------------------------------------------------------------------------
    async def _io(self, priority: tuple, phase: str, fn, *args):
        if self.phase_hook is None:
            return await self._pool.run(priority, fn, *args)
        hook = self.phase_hook

        def call():
            hook(phase)
            return fn(*args)

        return await self._pool.run(priority, call)

    async def _rate_limit(self) -> None:
        """Global request-rate cap: requests start at most `request_rate` per second, in slots."""
        if not self.cfg.request_rate:
            return
        now = time.monotonic()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.cfg.request_rate
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _prefix(self, prio: tuple, session: Session, rng: random.Random) -> int:
        prompt = self.cfg.prefix_cache.system_prompts[session.system_prompt]
        key = system_prompt_key(prompt.text)
        nbytes = self.workload.entry_tokens(prompt.tokens) * self.bytes_per_token
        r = await self._io(prio, "prefix", self.store.get, key)
        if r.hit:
            self.req.prefix_hits += 1
            self.req.prefix_bytes_saved += nbytes
            return r.timing.total_ns
        self.req.prefix_misses += 1
        if self.cfg.request_model == "reference":
            # The reference looks a system prompt's entry up and never stores one (kv_cache/prefix_cache.py and
            # benchmark.py of mlcommons/storage: no allocate_cache for kv_system_* keys): every look-up misses.
            return r.timing.total_ns
        w = await self._io(prio, "prefix", self.store.put, key, self.payload.chunks(nbytes, rng))  # for the next one
        return r.timing.total_ns + w.timing.total_ns

    async def _rag(self, prio: tuple, rng: random.Random) -> int:
        rc = self.cfg.rag
        chunks = self.workload.rag_docs
        docs = len(chunks)
        # zipfian: retrieval favours some documents (1/rank), as real corpora do; uniform (random): any document.
        weights = [1 / (d + 1) for d in range(docs)] if rc.retrieval_distribution == "zipfian" else None
        picks = set()
        for _ in range(rc.top_k):
            d = rng.choices(range(docs), weights=weights)[0]
            picks.add((d, rng.randrange(chunks[d])))
        t0 = time.perf_counter_ns()
        results = await asyncio.gather(*(self._io(prio, "rag", self.store.get, rag_key(d, c)) for d, c in picks))
        storage = sum(r.timing.total_ns for r in results)
        for (d, c), r in zip(picks, results):
            if not r.hit:  # chunk KV evicted: recomputed and stored again
                self.req.rag_chunk_misses += 1
                w = await self._io(
                    prio,
                    "rag",
                    self.store.put,
                    rag_key(d, c),
                    self.payload.chunks(
                        self.workload.entry_tokens(rc.chunk_tokens_for(self.bytes_per_token)) * self.bytes_per_token,
                        rng,
                    ),
                )
                storage += w.timing.total_ns
        self.req.rag_queries += 1
        self.req.rag_chunk_reads += len(picks)
        self.req.rag_burst.record_ns(time.perf_counter_ns() - t0)
        return storage

    def _reference_prefill_only(self, context_tokens: int) -> bool:
        """The reference marks a request of REFERENCE_PREFILL_ONLY_TOKENS or more context tokens PREFILL: it is
        written and never decoded (--decode-only reads pre-populated entries whatever their size)."""
        return context_tokens >= REFERENCE_PREFILL_ONLY_TOKENS and not self.cfg.decode_only

    async def _reference_decode(
        self, prio: tuple, key: str, read_key: str, tokens: int, generate_tokens: int, rng: random.Random
    ) -> tuple[int, int, int, int, int]:
        """The reference's decode: one read of the entry, then ceil(generate_tokens / batch size) more, and the
        simulated generation time once after them; a missing entry is written again instead (not on a decode-only
        node). Returns (storage ns, generation ns, reads, misses, bytes read)."""
        cfg = self.cfg
        r = await self._io(prio, "decode", self.store.get, read_key)
        storage_ns, reads, misses, nbytes = r.timing.total_ns, 1, int(not r.hit), r.timing.nbytes
        if not r.hit:
            if not cfg.decode_only:
                chunks = self.payload.chunks(tokens * self.bytes_per_token, rng)
                w = await self._io(prio, "prefill", self.store.put, key, chunks)
                storage_ns += w.timing.total_ns
        else:
            for _ in range(max(1, math.ceil(generate_tokens / cfg.decode.batch_size))):
                r = await self._io(prio, "decode", self.store.get, read_key)
                storage_ns += r.timing.total_ns
                reads += 1
                misses += not r.hit
                nbytes += r.timing.nbytes
        gen_ns = 0
        if cfg.ms_per_token and generate_tokens > 0:
            g0 = time.perf_counter_ns()
            await asyncio.sleep(generate_tokens * cfg.ms_per_token / 1000)
            gen_ns = time.perf_counter_ns() - g0
        return storage_ns, gen_ns, reads, misses, nbytes

    async def _request(
        self,
        session: Session,
        key: str,
        prev_keys: tuple[str, ...],
        new_tokens: int,
        generate_tokens: int,
        rng: random.Random,
        first_turn: bool,
        t_submit: int | None = None,
    ) -> None:
        """One request; `t_submit` is when it was made, if it waited in a queue since (else now)."""
        cfg = self.cfg
        t_submit = time.perf_counter_ns() if t_submit is None else t_submit
        prio = (self._qos_key[session.qos], t_submit)
        await self._rate_limit()
        storage_ns = 0
        multi_turn_hits = multi_turn_misses = 0
        read_key = key
        prefill_bytes = 0
        reference = cfg.request_model == "reference"
        # kvtier: --max-concurrent-allocs bounds requests in their storage phase; the reference bounds the prefill
        # write only (and by default nothing: its request threads, min(users, 500), are the only bound).
        alloc = None if reference else self._alloc
        if alloc:
            await alloc.acquire()
        try:
            t_start = time.perf_counter_ns()
            if session.system_prompt is not None and first_turn and not cfg.decode_only:
                storage_ns += await self._prefix(prio, session, rng)
            if cfg.enable_rag and not cfg.decode_only and rng.random() < cfg.rag.probability:
                storage_ns += await self._rag(prio, rng)
            if cfg.decode_only:
                read_key = rng.choice(self.prepopulated)
            else:
                for prev_key in prev_keys:
                    r = await self._io(prio, "multi_turn", self.store.get, prev_key)
                    storage_ns += r.timing.total_ns
                    multi_turn_hits += r.hit
                    multi_turn_misses += not r.hit
                chunks = self.payload.chunks(new_tokens * self.bytes_per_token, rng)
                if reference and self._alloc:
                    async with self._alloc:
                        w = await self._io(prio, "prefill", self.store.put, key, chunks)
                else:
                    w = await self._io(prio, "prefill", self.store.put, key, chunks)
                storage_ns += w.timing.total_ns
                prefill_bytes = new_tokens * self.bytes_per_token if w.stored else 0
        finally:
            if alloc:
                alloc.release()
        gen_ns = 0
        batches = 0
        decode_misses = 0
        decode_bytes = 0
        if reference and not cfg.prefill_only and not self._reference_prefill_only(new_tokens):
            ns, gen_ns, batches, decode_misses, decode_bytes = await self._reference_decode(
                prio, key, read_key, new_tokens, generate_tokens, rng
            )
            storage_ns += ns
        elif not cfg.prefill_only and not reference:
            batches = max(1, math.ceil(generate_tokens / cfg.decode.batch_size))
            for b in range(batches):
                tokens = min(cfg.decode.batch_size, generate_tokens - b * cfg.decode.batch_size)
                if cfg.ms_per_token and tokens > 0:
                    g0 = time.perf_counter_ns()
                    await asyncio.sleep(tokens * cfg.ms_per_token / 1000)
                    gen_ns += time.perf_counter_ns() - g0
                r = await self._io(prio, "decode", self.store.get, read_key)
                storage_ns += r.timing.total_ns
                decode_misses += not r.hit
                decode_bytes += r.timing.nbytes
        self._record_request(
            session,
            t_submit,
            t_start,
            prompt_tokens=new_tokens,
            generated_tokens=generate_tokens,
            storage_ns=storage_ns,
            gen_ns=gen_ns,
            prefill_bytes=prefill_bytes,
            multi_turn=(multi_turn_hits, multi_turn_misses),
            decode=(batches, decode_misses, decode_bytes),
        )

    def _record_request(
        self,
        session: Session,
        t_submit: int,
        t_start: int,
        *,
        prompt_tokens: int,
        generated_tokens: int,
        storage_ns: int,
        gen_ns: int,
        prefill_bytes: int,
        multi_turn: tuple[int, int],
        decode: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """Count one whole request (a request cut by the end of the window is not counted)."""
        cfg = self.cfg
        e2e = time.perf_counter_ns() - t_submit
        req = self.req
        req.completed += 1
        req.prompt_tokens += prompt_tokens
        req.generated_tokens += generated_tokens
        req.end_to_end.record_ns(e2e)
        req.storage_io.record_ns(storage_ns)
        req.generation.record_ns(gen_ns)
        req.queue_wait.record_ns(t_start - t_submit)
        req.decode_reads += decode[0]
        req.decode_misses += decode[1]
        req.decode_bytes_read += decode[2]
        req.prefill_bytes_written += prefill_bytes
        req.by_profile[session.profile] = req.by_profile.get(session.profile, 0) + 1
        cls = req.by_class.setdefault(session.qos, ClassStats())
        cls.requests += 1
        cls.end_to_end.record_ns(e2e)
        cls.service.record_ns(e2e - gen_ns)
        if self._class_window is not None and session.qos in self._class_window:
            self._class_window[session.qos].record_ns(e2e - gen_ns)
        req.multi_turn_hits += multi_turn[0]
        req.multi_turn_misses += multi_turn[1]
        if cfg.max_requests and req.completed >= cfg.max_requests:
            self._done.set()
