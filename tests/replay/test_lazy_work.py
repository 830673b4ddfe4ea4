"""Work and memory follow what a run does, not the size of a number the user gave: synthetic conversations are made
turn by turn as a driver reaches them (max_turns 10^8 with end_probability 0 is a conversation like any other),
kvtier plan's model grows its structures with the requests simulated, and lmcache-mp ticks stop once one evicts
nothing. Memory checks read the child's peak RSS (getrusage of children) with wide margins."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

import pytest
from bench_helpers import write_config
from helpers import wait_for

from replay.plan.lmcache_mp import LMCacheMP, MPParams
from replay.plan.model import ChainLRU, _Fenwick
from replay.sources.synthetic_users import LazyTurns, SyntheticUser, draw_turn_count
from replay.synthetic.view import STATUS_ENV

USER = SyntheticUser(0, "chatbot", (10, 20), (1, 5), (0.0, 0.0))


# ---- synthetic conversations ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_turns", [10**8, 10**12, 2**62])
def test_a_conversation_of_any_length_costs_only_the_turns_reached(max_turns):
    t0 = time.monotonic()
    conv = next(USER.conversations(random.Random(1), True, 0.0, max_turns))
    turns = conv.turns
    assert len(turns) == max_turns
    first = [turns[i] for i in range(5)]
    assert time.monotonic() - t0 < 1.0
    assert isinstance(turns, LazyTurns) and len(turns._made) == 5  # nothing past what was asked for
    assert [turns[i] for i in range(5)] == first  # the same turns when asked again
    assert all(10 <= t.input_tokens <= 20 and 1 <= t.output_tokens <= 5 for t in first)


def test_lazy_turns_behave_as_a_sequence():
    turns = LazyTurns(6, random.Random(3), (1, 100), (1, 100))
    whole = list(turns)
    assert len(whole) == 6 and tuple(whole) == turns[:] == turns[0:6]
    assert turns[:1] == (whole[0],) and turns[4:] == tuple(whole[4:]) and turns[::-2] == tuple(whole[::-2])
    assert turns[-1] == whole[-1] and turns[7:] == ()
    with pytest.raises(IndexError):
        turns[6]
    with pytest.raises(IndexError):
        turns[-7]


@pytest.mark.parametrize("p, mean", [(0.2, 5.0), (0.5, 2.0), (0.05, 20.0)])
def test_the_drawn_length_is_geometric_as_before(p, mean):
    # Before: a turn, then end with p, up to max_turns; the mean of that is 1/p when the cap is far.
    rng = random.Random(7)
    n = [draw_turn_count(rng, True, p, 10**9) for _ in range(20_000)]
    assert min(n) == 1 and statistics.fmean(n) == pytest.approx(mean, rel=0.08)


@pytest.mark.parametrize(
    "multi, p, cap, expect", [(False, 0.0, 10**9, {1}), (True, 1.0, 50, {1}), (True, 0.0, 7, {7}), (True, 0.9, 1, {1})]
)
def test_the_drawn_length_edges(multi, p, cap, expect):
    rng = random.Random(5)
    assert {draw_turn_count(rng, multi, p, cap) for _ in range(200)} == expect


def test_the_cap_holds_for_a_small_end_probability():
    rng = random.Random(9)
    assert max(draw_turn_count(rng, True, 1e-12, 64) for _ in range(1000)) == 64


def _bench():
    return [sys.executable, "-m", "replay.cli", "bench"]


# Runs a command and prints its peak RSS in KiB on stderr's last line: this wrapper's RUSAGE_CHILDREN holds only that
# command (pytest's own would hold the largest child of the whole session, a vLLM server in the slow tier).
_PEAK_RSS = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)


def _run_measured(cmd: list[str], **kw) -> tuple[subprocess.CompletedProcess, float]:
    """subprocess.run of cmd, and its peak RSS in MB."""
    r = subprocess.run([sys.executable, "-c", _PEAK_RSS, *cmd], capture_output=True, text=True, **kw)
    *rest, peak_kib = r.stderr.rstrip("\n").split("\n")
    r.stderr = "\n".join(rest)
    return r, int(peak_kib) / 1024


@pytest.mark.slow
@pytest.mark.parametrize("max_turns", [10**7, 10**8, 10**12])
def test_a_bench_run_with_endless_conversations_keeps_its_window_and_memory(tmp_path, max_turns):
    cfg = write_config(tmp_path, conversation={"max_turns": max_turns, "end_probability": 0}, duration=2)
    t0 = time.monotonic()
    r, peak_mb = _run_measured(_bench() + ["--config", cfg], cwd=tmp_path, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["status"] == "completed" and doc["summary"]["total_requests"] > 0
    assert took < 2 + 20, took  # before: 25 s and 1.78 GB at 10^7; 10^8 ignored SIGTERM past 2.5 GB
    assert peak_mb < 1000


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigterm_stops_a_run_of_endless_conversations(tmp_path, sig):
    cfg = write_config(tmp_path, conversation={"max_turns": 10**8, "end_probability": 0}, duration=60)
    status = tmp_path / "live.status"
    proc = subprocess.Popen(
        _bench() + ["--config", cfg],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, **{STATUS_ENV: str(status)}),
    )
    try:
        wait_for(lambda: proc.poll() is None and status.exists(), timeout_s=120, what="the run's first snapshot")
        t0 = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    assert took < 15, took
    assert json.loads((tmp_path / "out.json").read_text())["status"] == "interrupted"


# ---- kvtier plan's model ---------------------------------------------------------------------------------------------
def test_the_fenwick_tree_grows_with_the_numbers_used_and_stays_exact():
    rng = random.Random(11)
    fen, ref = _Fenwick(10**15), [0] * 6000  # a caller's expectation of 10^15 requests costs nothing up front
    assert len(fen.tree) <= (1 << 16) + 1
    for k in range(30_000):
        i = rng.randrange(6000)
        d = rng.randint(-3, 5)
        fen.add(i, d)
        ref[i] += d
        if k % 101 == 0:
            j = rng.randrange(6000)
            assert fen.prefix(j) == sum(ref[: j + 1])
    assert fen.prefix(10**9) == sum(ref)  # past the end: everything


@pytest.mark.parametrize("sessions", [1, 10, 300])
@pytest.mark.slow
def test_chain_lru_memory_follows_sessions_not_requests(sessions):
    cache = ChainLRU([10**12], sessions, sessions * 10**9)  # room for everything: nothing is ever evicted
    for r in range(200_000 // sessions):
        for s in range(sessions):
            cache.request(s, r, r + 1)
    assert len(cache.runs) <= 2 * sessions + 64 + 1  # stale runs are dropped, not kept per request
    assert len(cache.fen.tree) <= 2 * 200_000 + 1


def test_a_thousand_million_ticks_cost_what_a_few_do():
    l1 = LMCacheMP(100, 0, MPParams(0.8, 0.2, 10**9, 10**9))
    t0 = time.monotonic()
    for r in range(1, 6):
        l1.serve_round(list(range(8)), r * 4, r * 5)
    assert time.monotonic() - t0 < 5
    assert len(l1.l1) < 0.8 * 100  # the ticks that ran still brought the L1 under its watermark


def test_ticks_stop_only_once_nothing_is_evicted():
    # The same rounds with 3 ticks and with 10^9: the first ticks do the eviction, the rest find nothing to do.
    a, b = LMCacheMP(100, 0, MPParams(0.5, 0.1, 3, 3)), LMCacheMP(100, 0, MPParams(0.5, 0.1, 10**9, 10**9))
    outs = []
    for cache in (a, b):
        outs.append([cache.serve_round(list(range(8)), r * 4, r * 5) for r in range(1, 8)])
    assert len(a.l1) >= len(b.l1)
    assert len(b.l1) < 0.5 * 100


# ---- ShareGPT read as it is parsed ----------------------------------------------------------------------------------
_LOAD_AND_MEASURE = """
import resource, sys
from replay.sources.sharegpt import estimate_tokens, load_sharegpt
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
convs, report = load_sharegpt(sys.argv[1], count_tokens=estimate_tokens)
print(len(convs), report.turns, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


@pytest.mark.slow
def test_sharegpt_loading_peaks_near_what_it_keeps_not_a_multiple_of_the_file(tmp_path):
    # 40 MB of conversations (non-ASCII text): read whole, the file's text, its parse and the kept conversations
    # were all alive at once (1.6x here, 3.3x for 1 GB of the public file); read piece by piece, about what is kept.
    convs = [
        {
            "id": str(i),
            "conversations": [
                {"from": "human", "value": f"{i} héllo wörld " * 200},
                {"from": "gpt", "value": "answer text " * 200},
            ],
        }
        for i in range(8000)
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(convs, ensure_ascii=False))
    size = path.stat().st_size
    r = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_MEASURE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    n, turns, grew = map(int, r.stdout.split())
    assert n == 8000 and turns == 8000
    assert grew < 1.3 * size, (grew, size)


@pytest.mark.parametrize("cut", [1, 5, 1000, 2_000_000])
def test_sharegpt_items_across_read_pieces_and_a_cut_tail(tmp_path, monkeypatch, cut):
    # Small pieces: every item spans several reads; the file cut `cut` bytes before its end keeps what precedes it.
    from replay.sources import sharegpt

    monkeypatch.setattr(sharegpt, "_READ_BYTES", 7)
    items = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": f"q{i} é" * (1 + i % 50)}, {"from": "gpt", "value": "a"}],
        }
        for i in range(300)
    ]
    data = ("\ufeff" + json.dumps(items, ensure_ascii=False, indent=1)).encode()
    path = tmp_path / "sg.json"
    path.write_bytes(data[: max(1, len(data) - cut)] if cut < len(data) else data[:10])
    if cut >= len(data):
        with pytest.raises(sharegpt.WorkloadError):
            sharegpt.load_sharegpt(path, count_tokens=sharegpt.estimate_tokens)
        return
    convs, report = sharegpt.load_sharegpt(path, count_tokens=sharegpt.estimate_tokens)
    whole = json.loads(data.decode("utf-8-sig")) if cut == 0 else items
    assert [c.conversation_id for c in convs] == [it["id"] for it in whole[: len(convs)]]
    assert [c.turns[0].text for c in convs] == [it["conversations"][0]["value"] for it in whole[: len(convs)]]
    assert len(convs) >= 300 - 1 - cut // 40 and report.skipped
