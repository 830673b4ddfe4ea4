"""`kvtier plan --policy lmcache-mp`: LMCache 0.5.6's multiprocess L1 (and an optional L2 under it), block by block.

What LMCache MP does (lmcache/v1/distributed/, read in 0.5.6), and what this model keeps of it:
- Eviction is not on demand. `storage_controllers/eviction_controller.py` wakes once a second (a *tick*); when the
  L1's usage is at or above `--eviction-trigger-watermark` of its size it evicts `int(keys x --eviction-ratio)`
  keys (at least one) in LRU order. Between ticks the L1 only fills.
- A store that finds no room is dropped: `L1Manager.reserve_write` allocates a store's missing chunks as one batch
  (`batched_allocate` is all or nothing) and fails them all with OUT_OF_MEMORY; nothing is evicted for it. With an
  L2, a dropped chunk never reaches it either (the store controller copies L1 writes down).
- LRU order (`eviction_policy/lru.py`): a store's chunks enter as most recent, and a request's end touches every
  chunk of its prompt (`lookup.py`, end of session), both in reversed chain order, so a chain's *tail* is older
  than its head: eviction eats sessions' tails first, oldest session first, and a chain keeps a prefix. Lookups do
  not touch; between a request's store and its end its old prefix keeps last round's recency, so a tick in that
  window can cut a chain in the middle and leave its newer blocks orphaned (cached, unreachable) until the gap is
  stored again.
- vLLM's connector stores from the hit onward (`num_stored_tokens` starts at the LMCache hit), whole chunks only;
  chunks already resident are not written again (KEY_NOT_WRITABLE), so a refilled gap reconnects orphans.
- An L2 hit is loaded through L1 (`prefetch_controller.py` reserves room in L1 for it, one batch): while a round's
  lookups hold such room, a load that does not fit fails and the hit ends where the chain leaves L1.
- L2 (`tiers[1]`, kvtier's store under `KvtierL2Adapter`): every chunk newly stored in L1 is written through, in
  the order the store handed them to L1 (`store_controller.py` submits `finish_write`'s keys as they come, chain
  order; the LRU's reversal is L1's alone), so in L2 a chain's *head* is its oldest block. kvtier evicts on demand,
  LRU (`store.py`): a put of a key it holds changes nothing, a lookup only pins, a load (`get`) makes the block
  recent, again in chain order. Under pressure it therefore drops the oldest session's head first, and the whole
  chain behind it becomes unreachable: the head-first cascade of the published
  GP7000 long-session measurement (replay/plan/README.md). A lookup hits the chain's prefix present in L1
  or L2.

Time is reduced to ticks: a round is all sessions' lookups (concurrent: the closed loop sends them together), then
their stores in session order, then `ticks_during` ticks (the decode after the prefills), then the requests' ends
in session order, then `ticks_between` ticks (the pause before the next round). Not modelled: a tick between
two stores of one round (vLLM's chunked prefill spreads stores over steps; collapse.py gives vLLM a batch large
enough for a round's prefills in one step), read locks (a chunk being read is skipped by a tick).

Invariants: `l1` holds at most `l1_blocks` keys and is ordered oldest first; a key is (session, block index); `l2`
holds at most `l2_blocks` keys, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvconnector.errors import ConfigError

__all__ = ["LMCacheMP", "MPParams"]


@dataclass(frozen=True, slots=True)
class MPParams:
    """LMCache MP's L1 eviction settings (its defaults) and the ticks of one round."""

    watermark: float = 0.8
    evict_ratio: float = 0.2
    ticks_during: int = 1
    ticks_between: int = 3

    def __post_init__(self) -> None:
        if not (0 < self.watermark <= 1 and 0 < self.evict_ratio <= 1):
            raise ConfigError(
                f"l1 watermark and evict ratio must be in (0, 1], got {self.watermark}, {self.evict_ratio}"
            )
        if self.ticks_during < 0 or self.ticks_between < 0:
            raise ConfigError(f"ticks must be 0 or more, got {self.ticks_during}, {self.ticks_between}")


class LMCacheMP:
    """LMCache MP's L1 of `l1_blocks` chunks over an optional L2 of `l2_blocks` (0: none); see the module docstring."""

    def __init__(self, l1_blocks: int, l2_blocks: int, params: MPParams) -> None:
        self.l1_blocks = l1_blocks
        self.l2_blocks = l2_blocks
        self.p = params
        self.l1: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.l2: OrderedDict[tuple[int, int], None] = OrderedDict()

    def lookup(self, s: int, reusable: int, staged: int = 0) -> tuple[int, int]:
        """The chain prefix present in L1 or L2, capped at `reusable`: (hit blocks, of which from L2). The L2 part
        is loaded through L1 (one batch, all or nothing): with `staged` blocks of other loads in flight and no room
        for it, the hit stops where L1's part does."""
        l1, l2 = self.l1, self.l2
        hit = from_l2 = 0
        first_l2 = None
        while hit < reusable:
            k = (s, hit)
            if k not in l1:
                if k not in l2:
                    break
                from_l2 += 1
                if first_l2 is None:
                    first_l2 = hit
            hit += 1
        if from_l2 and len(l1) + staged + from_l2 > self.l1_blocks:
            return first_l2, 0
        for j in range(hit):  # the loads (L1 misses) touch kvtier's LRU, in chain order: the tail most recent
            if (s, j) not in l1:
                l2.move_to_end((s, j))
        return hit, from_l2

    def store(self, s: int, start: int, end: int) -> tuple[int, int]:
        """Store blocks start..end-1 of session s: (written, dropped). All of the missing ones or none."""
        l1 = self.l1
        missing = [(s, j) for j in range(start, end) if (s, j) not in l1]
        if len(l1) + len(missing) > self.l1_blocks:
            return 0, len(missing)
        for k in reversed(missing):  # the chain's first block ends up the most recent
            l1[k] = None
        if self.l2_blocks:
            l2 = self.l2
            for k in missing:  # chain order, the head oldest; a key kvtier holds is left as it is
                if k not in l2:
                    l2[k] = None
                    if len(l2) > self.l2_blocks:
                        l2.popitem(last=False)
        return len(missing), 0

    def touch(self, s: int, end: int) -> None:
        """A request's end: every resident block of its prompt becomes recent, the head most."""
        l1 = self.l1
        for j in range(end - 1, -1, -1):
            if (s, j) in l1:
                l1.move_to_end((s, j))

    def tick(self) -> int:
        """One wake-up of the eviction loop: blocks evicted."""
        l1 = self.l1
        if not l1 or len(l1) < self.p.watermark * self.l1_blocks:
            return 0
        n = max(1, int(len(l1) * self.p.evict_ratio))
        for _ in range(n):
            l1.popitem(last=False)
        return n

    def ticks(self, n: int) -> int:
        """`n` ticks in a row: blocks evicted. A tick that evicts nothing leaves the L1 as it was, so every later one
        would too: the loop ends there, and its length is bounded by the L1's blocks, not by `n` (--ticks-between
        100000000 costs what a few ticks cost)."""
        evicted = 0
        for _ in range(n):
            e = self.tick()
            if not e:
                break
            evicted += e
        return evicted

    def serve_round(self, sessions: list[int], reusable: int, stored: int) -> list[tuple[int, int, int, int, int]]:
        """One synchronized round; per session (hit, hit from L2, written, dropped, evicted during its round)."""
        looked = []
        staged = 0  # L2 blocks being loaded through L1 by this round's concurrent lookups, freed once read
        for s in sessions:
            hit, from_l2 = self.lookup(s, reusable, staged)
            staged += from_l2
            looked.append((s, hit, from_l2))
        out = []
        for s, hit, from_l2 in looked:
            written, dropped = self.store(s, hit, stored)
            out.append([hit, from_l2, written, dropped, 0])
        evicted = self.ticks(self.p.ticks_during)
        for s in sessions:
            self.touch(s, stored)
        evicted += self.ticks(self.p.ticks_between)
        if out:
            out[-1][4] = evicted  # the round's evictions, counted once
        return [tuple(o) for o in out]

    @classmethod
    def check_tiers(cls, n: int, name: str) -> None:
        if n not in (1, 2):
            raise ConfigError(f"configuration {name!r}: policy lmcache-mp takes an L1 tier and at most one L2 tier")
