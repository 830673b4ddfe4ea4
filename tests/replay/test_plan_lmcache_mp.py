"""`kvtier plan --policy lmcache-mp`: LMCache MP's periodic L1 eviction, against a plain reference simulation of the
same rules on random workloads, and against the hit rates measured on the real stack (benchmarks/collapse.py's
recorded runs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kvconnector.backend_config import BackendConfig
from replay.plan import MPParams, TierSpec, Workload, simulate
from replay.plan import cli as plan_cli
from replay.plan.lmcache_mp import LMCacheMP

FIGURES = Path(__file__).resolve().parents[2] / "benchmarks/figures/collapse"


class RefMP:
    """The rules of replay/plan/lmcache_mp.py written the plain way: every key has a last-use stamp, LRU order is
    the order of stamps. In L1 a store's or a touch's blocks get stamps from the chain's tail to its head (the head
    most recent), as LMCache's LRU policy walks `reversed(keys)`; in L2 (kvtier's store) from head to tail, as the
    store controller hands them over and the loads read them, and a key already there keeps its stamp."""

    def __init__(self, l1, l2, p):
        self.cap1, self.cap2, self.p = l1, l2, p
        self.l1, self.l2 = {}, {}
        self.clock = 0

    def _stamp(self, d, keys, head_first=False):
        for k in sorted(keys, key=lambda k: k[1] if head_first else -k[1]):
            self.clock += 1
            d[k] = self.clock

    def lookup(self, s, reusable, staged):
        hit = 0
        while hit < reusable and ((s, hit) in self.l1 or (s, hit) in self.l2):
            hit += 1
        in_l2 = [j for j in range(hit) if (s, j) not in self.l1]
        if in_l2 and len(self.l1) + staged + len(in_l2) > self.cap1:
            return min(in_l2), 0
        self._stamp(self.l2, [(s, j) for j in range(hit) if (s, j) not in self.l1], head_first=True)
        return hit, len(in_l2)

    def store(self, s, start, end):
        missing = [(s, j) for j in range(start, end) if (s, j) not in self.l1]
        if len(self.l1) + len(missing) > self.cap1:
            return 0, len(missing)
        self._stamp(self.l1, missing)
        if self.cap2:
            for k in sorted(missing, key=lambda k: k[1]):  # one put after another: room made by one is seen by the next
                if k not in self.l2:
                    self._stamp(self.l2, [k])
                    while len(self.l2) > self.cap2:
                        del self.l2[min(self.l2, key=self.l2.get)]
        return len(missing), 0

    def touch(self, s, end):
        self._stamp(self.l1, [(s, j) for j in range(end) if (s, j) in self.l1])

    def tick(self):
        n = len(self.l1)
        if n == 0 or n < self.p.watermark * self.cap1:
            return 0
        victims = sorted(self.l1, key=self.l1.get)[: max(1, int(n * self.p.evict_ratio))]
        for k in victims:
            del self.l1[k]
        return len(victims)

    def serve_round(self, sessions, reusable, stored):
        staged, looked = 0, []
        for s in sessions:
            hit, from_l2 = self.lookup(s, reusable, staged)
            staged += from_l2
            looked.append((s, hit, from_l2))
        out = [[hit, from_l2, *self.store(s, hit, stored), 0] for s, hit, from_l2 in looked]
        evicted = sum(self.tick() for _ in range(self.p.ticks_during))
        for s in sessions:
            self.touch(s, stored)
        evicted += sum(self.tick() for _ in range(self.p.ticks_between))
        out[-1][4] = evicted
        return [tuple(o) for o in out]


def _random_params(rng):
    return MPParams(
        watermark=rng.choice([0.05, 0.2, 0.5, 0.8, 1.0]),
        evict_ratio=rng.choice([0.1, 0.25, 0.5, 1.0]),
        ticks_during=rng.randint(0, 2),
        ticks_between=rng.randint(0, 3),
    )


@pytest.mark.parametrize("seed", range(10))
def test_operations_agree_with_the_reference(seed):
    """Any interleaving of lookups, stores, touches and ticks, not only simulate()'s round order."""
    rng = random.Random(seed)
    p = _random_params(rng)
    l1, l2 = rng.randint(1, 30), rng.choice([0, rng.randint(1, 60)])
    fast, ref = LMCacheMP(l1, l2, p), RefMP(l1, l2, p)
    for _ in range(300):
        s, op = rng.randrange(5), rng.random()
        if op < 0.3:
            args = (s, rng.randint(0, 12), rng.randint(0, 10))
            assert fast.lookup(*args) == ref.lookup(*args)
        elif op < 0.6:
            start = rng.randint(0, 8)
            args = (s, start, start + rng.randint(0, 8))
            assert fast.store(*args) == ref.store(*args)
        elif op < 0.85:
            n = rng.randint(0, 12)
            fast.touch(s, n)
            ref.touch(s, n)
        else:
            assert fast.tick() == ref.tick()
        assert list(fast.l1) == sorted(ref.l1, key=ref.l1.get)  # same keys in the same LRU order
        assert list(fast.l2) == sorted(ref.l2, key=ref.l2.get)
        assert len(fast.l1) <= l1 and (not l2 or len(fast.l2) <= l2)


@pytest.mark.parametrize("seed", range(10))
def test_simulate_agrees_with_the_reference_round_by_round(seed):
    rng = random.Random(100 + seed)
    p = _random_params(rng)
    w = Workload(
        concurrency=rng.randint(1, 6),
        rounds=rng.randint(2, 10),
        input_len=rng.randint(1, 300),
        output_len=rng.randint(0, 100),
        block_size=rng.choice([16, 64]),
        kv_bytes_per_token=1,
        first_input_len=rng.randint(1, 400),
    )
    tiers = [TierSpec("l1", rng.randint(1, 60) * w.block_size)]
    if rng.random() < 0.5:
        tiers.append(TierSpec("l2", rng.randint(1, 200) * w.block_size))
    plan = simulate(w, tiers, policy="lmcache-mp", mp=p)
    ref = RefMP(
        int(tiers[0].capacity_bytes // w.block_size),
        int(tiers[1].capacity_bytes // w.block_size) if len(tiers) > 1 else 0,
        p,
    )
    for r, got in zip(range(1, w.rounds + 1), plan.rounds):
        out = ref.serve_round(list(range(w.concurrency)), w.reusable_blocks(r), w.stored_blocks(r))
        hit = sum(o[0] for o in out) * w.block_size
        assert got.predicted_hit_rate == round(hit / (w.concurrency * w.prompt_tokens(r)), 6)
        assert got.bytes_written == sum(o[2] for o in out) * w.block_bytes
        assert got.bytes_evicted == sum(o[4] for o in out) * w.block_bytes
        assert sum(got.hit_tokens_by_tier.values()) == hit


def test_tails_go_first_so_a_chain_keeps_its_head():
    """LMCache's LRU walks a request's keys backwards: the tick takes the oldest session's tail, and the session
    still hits its head next round (a slope); the chained LRU of vLLM's kind would have lost the whole chain."""
    mp = LMCacheMP(10, 0, MPParams(watermark=0.5, evict_ratio=0.3, ticks_during=0, ticks_between=1))
    mp.serve_round([0, 1], 0, 4)  # 8 blocks >= 5: one tick takes int(8 * 0.3) = 2, session 0's last two
    assert mp.lookup(0, 4) == (2, 0)
    assert mp.lookup(1, 4) == (4, 0)


def test_l2_drops_the_oldest_chain_head_first_so_the_whole_chain_misses():
    """kvtier's LRU under LMCache gets a store's chunks head first: out of room, it evicts the oldest session's head,
    and that session hits nothing of the chain behind it (the published GP7000 measurement's cascade,
    replay/plan/README.md; unlike L1's tails-first slope)."""
    mp = LMCacheMP(100, 7, MPParams(watermark=1.0, evict_ratio=1.0, ticks_during=0, ticks_between=0))
    mp.store(0, 0, 4)
    mp.store(1, 0, 4)  # 8 > 7: (0, 0) goes
    mp.l1.clear()  # as a tick would: only L2 is left
    assert list(mp.l2)[:3] == [(0, 1), (0, 2), (0, 3)]
    assert mp.lookup(0, 4) == (0, 0)
    assert mp.lookup(1, 4) == (4, 4)
    assert list(mp.l2)[-4:] == [(1, 0), (1, 1), (1, 2), (1, 3)]  # the loads, tail most recent
    mp.store(0, 0, 4)  # the head again makes room with (0, 1), which is then put again, ... and (1, 0) goes
    assert list(mp.l2) == [(1, 1), (1, 2), (1, 3), (0, 0), (0, 1), (0, 2), (0, 3)]
    assert mp.lookup(1, 4) == (0, 0)


def test_a_store_that_finds_the_l1_full_is_dropped_and_never_reaches_l2():
    mp = LMCacheMP(5, 100, MPParams(watermark=1.0, evict_ratio=0.5, ticks_during=0, ticks_between=0))
    assert mp.store(0, 0, 4) == (4, 0)
    assert mp.store(1, 0, 2) == (0, 2)  # 4 + 2 > 5: the whole batch is refused, nothing evicted for it
    assert mp.lookup(1, 2) == (0, 0)


def test_an_l2_hit_needs_room_in_l1():
    """L2 hits are loaded through L1; concurrent lookups that do not fit hit only what L1 holds."""
    mp = LMCacheMP(6, 100, MPParams(watermark=1.0, evict_ratio=1.0, ticks_during=0, ticks_between=0))
    for s in (0, 1):
        mp.store(s, 0, 4)
        mp.touch(s, 4)
        mp.l1.clear()  # as an eviction would: both chains only in L2 now
    assert mp.lookup(0, 4, staged=0) == (4, 4)
    assert mp.lookup(1, 4, staged=4) == (0, 0)  # 4 + 4 > 6


def test_policy_flags_change_the_plan_and_lru_is_unchanged():
    base = dict(concurrency=4, rounds=12, input_len=268, output_len=32, first_input_len=265, block_size=256)
    base |= dict(kv_bytes_per_token="512B", tiers=["l1=0.016GiB"])

    def plan(**kw):
        cfg = plan_cli.PlanConfig(**{**base, **kw})
        return [r["predicted_hit_rate"] for r in plan_cli.run(cfg, [])[0]["configurations"][0]["rounds"]]

    mp = dict(policy="lmcache-mp", l1_watermark=0.25, l1_evict_ratio=0.25)
    assert plan() == plan(l1_watermark=0.25, l1_evict_ratio=0.25)  # the lru policy ignores them
    for key, a, b in [
        ("l1_watermark", 0.25, 0.2),
        ("l1_evict_ratio", 0.25, 0.5),
        ("ticks_during", 1, 0),
        ("ticks_between", 1, 0),
    ]:
        assert plan(**{**mp, key: a}) != plan(**{**mp, key: b}), key


def _recorded_runs():
    return sorted(FIGURES.glob("collapse-*.json"))


def _flag(argv, name, default):
    return type(default)(argv[argv.index(name) + 1]) if name in argv else default


def _replan(doc):
    """The plan of a recorded run from what the run recorded: its workload and the flags of its command."""
    argv = doc["command"].split()
    old = "plan_lmcache_mp" not in doc  # runs before the policy: their defaults, and no ticks recorded
    wl = doc["workload"]
    w = Workload(
        concurrency=wl.get("concurrency") or _flag(argv, "--concurrency", 4),
        rounds=max(r["round"] for r in doc["rows"]),
        input_len=wl["tokens_per_round"],
        output_len=wl["output_len"],
        first_input_len=wl["first_prompt_tokens"],
        block_size=wl.get("chunk_size") or _flag(argv, "--chunk-size", 256),
        kv_bytes_per_token=512,
    )
    l1 = doc.get("l1_bytes") or int(float(f"{_flag(argv, '--l1-mb', 16.0) / 1e3:g}") * 2**30)
    if old:
        pause = _flag(argv, "--round-pause", 3.0)
        p = MPParams(_flag(argv, "--l1-watermark", 0.25), _flag(argv, "--l1-evict-ratio", 0.25), 1, int(pause))
    else:
        p = MPParams(**doc["plan_lmcache_mp"])
    # dram: the L1 over a small kvtier tier, filled to kvtier's target usage ratio, as collapse.py plans it
    dram = int(_flag(argv, "--dram-mb", 5.0) * 1e6 * BackendConfig.model_fields["target_usage_ratio"].default)
    tiers = {
        "l1only": [TierSpec("l1", l1)],
        "tiered": [TierSpec("l1", l1), TierSpec("disk", 1e12)],
        "dram": [TierSpec("l1", l1), TierSpec("dram", dram)],
    }
    configs = {row["config"] for row in doc["rows"]}
    return {c: simulate(w, t, policy="lmcache-mp", mp=p) for c, t in tiers.items() if c in configs}, p


# Worst per-round gap of the runs with an eviction ratio below 1, as replay/plan/README.md reports them: what survives
# a partial eviction depends on whether a tick falls between a round's stores and its requests' ends, which the
# rounds-and-ticks model cannot know (1 tick there is assumed; 0 fits other rounds of the same runs).
SLOPE_GAPS = {
    "collapse-12rounds-2026": 0.18,
    "collapse-8rounds-2026": 0.07,
    "collapse-defaults-lmcache": 0.12,
    "collapse-12rounds-ratio025": 0.18,
}
# The dram configuration's head-first loss is the plan's but not its pace (benchmarks/README.md: off by 0.24, not
# yet explained): held to that gap so a model change that widens it fails.
CONFIG_GAPS = {"dram": 0.24}


@pytest.mark.parametrize("path", _recorded_runs(), ids=lambda p: p.stem)
def test_recorded_runs(path):
    """Replanned from each recorded run's own parameters: runs with an eviction ratio of 1 (the L1 emptied at the
    first tick over the watermark, whatever its phase) within 5 points of every measured round, kvtier's target;
    the slope runs within the gaps README.md reports for them, which still separates them from the on-demand LRU
    model those runs printed (off by 0.4-0.86)."""
    doc = json.loads(path.read_text())
    plans, mp = _replan(doc)
    worst = {}
    for row in doc["rows"]:
        pred = plans[row["config"]].rounds[row["round"] - 1].predicted_hit_rate
        worst[row["config"]] = max(worst.get(row["config"], 0), abs(pred - row["measured"]))
    tol = 0.05 if mp.evict_ratio == 1 else next(v for k, v in SLOPE_GAPS.items() if path.stem.startswith(k))
    for config, gap in worst.items():
        assert gap <= CONFIG_GAPS.get(config, tol) + 1e-9, worst
