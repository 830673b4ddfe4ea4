"""`kvtier plan --trace`: prefix hit rates of block-hash traces (replay/plan/trace.py) against a cache simulated block
by block, on the committed Mooncake samples and on random traces."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.plan.trace import reuse_profile, sweep_capacities
from replay.sources.base import LoadReport
from replay.sources.block_traces import BlockTrace, TraceRequest, load_block_trace, merge_traces

SAMPLES = Path(__file__).parent / "data" / "mooncake"
CONVERSATION = SAMPLES / "conversation_trace_head300.jsonl"
SYNTHETIC = SAMPLES / "synthetic_trace_head300.jsonl"


def simulate_waterfall(trace: BlockTrace, tier_blocks: list[int]) -> list[int]:
    """The cache itself, block by block: exclusive tiers (fastest first), a request looks its blocks up and its hit
    stops at the first missing one; then every whole block is used (taken out of its tier, put on top of the first;
    a trailing partial block is never kept), and each full tier pushes its least recent block one tier down. Returns
    hit tokens per tier."""
    tiers: list[OrderedDict[int, None]] = [OrderedDict() for _ in tier_blocks]
    hits = [0] * len(tier_blocks)
    b = trace.block_tokens
    for req in trace.requests:
        whole = req.hash_ids[: req.input_tokens // b]
        for k, h in enumerate(whole):
            where = next((i for i, t in enumerate(tiers) if h in t), None)
            if where is None:
                break
            hits[where] += b if (k + 1) * b < req.input_tokens else 0
        for h in whole:
            for t in tiers:
                t.pop(h, None)
            tiers[0][h] = None
            for i, t in enumerate(tiers):
                while len(t) > tier_blocks[i]:
                    victim, _ = t.popitem(last=False)
                    if i + 1 < len(tiers):
                        tiers[i + 1][victim] = None
    return hits


def _trace(requests: list[tuple[int, list[int]]], block: int = 4) -> BlockTrace:
    reqs = tuple(TraceRequest(float(i), n, 1, tuple(ids)) for i, (n, ids) in enumerate(requests))
    return BlockTrace("t", reqs, block, LoadReport(source="test"))


@pytest.mark.parametrize("path", [CONVERSATION, SYNTHETIC], ids=["conversation", "synthetic"])
@pytest.mark.parametrize("tiers", [[64], [500], [3000], [200, 800], [50, 100, 2000], [10_000]])
def test_one_pass_matches_the_cache_simulated_block_by_block(path, tiers):
    trace = load_block_trace(path)
    profile = reuse_profile(trace)
    expected = simulate_waterfall(trace, tiers)
    got = profile.tier_hit_rates([t * trace.block_tokens for t in tiers])
    assert [round(g * profile.prompt_tokens) for g in got] == expected
    assert profile.hit_rate(sum(tiers) * trace.block_tokens) == pytest.approx(sum(expected) / profile.prompt_tokens)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(0, 12), max_size=10, unique=True)), max_size=40),
    st.lists(st.integers(1, 12), min_size=1, max_size=3),
)
def test_one_pass_matches_simulation_on_random_traces(rows, tiers):
    block = 4
    trace = _trace([(max(n, len(ids) * block), ids) for n, ids in rows] or [(4, [0])], block)
    profile = reuse_profile(trace)
    got = profile.tier_hit_rates([t * block for t in tiers])
    assert [round(g * profile.prompt_tokens) for g in got] == simulate_waterfall(trace, tiers)


def test_a_hit_stops_at_the_first_missing_block():
    # 1,2,3 stored; 4..7 push block 1 out of a 6-block cache while 2 and 3 stay. The third request hits 2 and 3 (its
    # own prefix); the fourth, 1,2,3 again, hits nothing although 2 and 3 are cached: its first block is gone.
    trace = _trace([(12, [1, 2, 3]), (16, [4, 5, 6, 7]), (12, [2, 3, 9]), (12, [1, 2, 3])])
    profile = reuse_profile(trace)
    assert simulate_waterfall(trace, [6]) == [8]
    assert profile.hit_tokens(6 * 4) == 8
    # with room for all, the fourth hits two whole blocks, not the third: it holds the prompt's last token
    assert profile.hit_tokens(100 * 4) == 8 + (4 + 4)
    assert profile.max_hit_rate == pytest.approx(16 / (12 + 16 + 12 + 12))


def test_capacity_curve_rises_to_the_maximum():
    profile = reuse_profile(load_block_trace(CONVERSATION))
    caps = sweep_capacities(1e4, 1e9, 4)
    assert len(caps) == 21 and caps[0] == pytest.approx(1e4) and caps[-1] == pytest.approx(1e9)
    rates = [profile.hit_rate(c) for c in caps]
    assert rates == sorted(rates)  # LRU is a stack algorithm: more cache never hits less
    assert rates[0] < rates[-1] == pytest.approx(profile.max_hit_rate)


def test_merged_traces_keep_their_ids_apart_and_interleave_by_time():
    a = _trace([(8, [0, 1]), (8, [0, 1])])
    b = BlockTrace("b", tuple(TraceRequest(0.5 + i, 8, 1, (0, 1)) for i in range(2)), 4, LoadReport(source="b"))
    merged = merge_traces([a, b])
    assert [r.arrival_s for r in merged.requests] == [0.0, 0.5, 1.0, 1.5]
    assert merged.requests[0].hash_ids != merged.requests[1].hash_ids  # id 0 of a is not id 0 of b
    profile = reuse_profile(merged)
    assert profile.unique_blocks == 4
    assert profile.hit_tokens(1e9) == 4 + 4  # each trace's second request hits its own first block, not its last


def test_rescaled_blocks_keep_every_request_s_block_count():
    native = load_block_trace(CONVERSATION)
    small = load_block_trace(CONVERSATION, block_tokens=16)
    assert small.block_tokens == 16
    for a, b in zip(native.requests, small.requests, strict=True):
        assert -(-a.input_tokens // 512) == -(-b.input_tokens // 16) == len(b.hash_ids)
    # the same cache in blocks gives the same hit rate, within the rounding of partial blocks
    assert reuse_profile(small).hit_rate(300 * 16) == pytest.approx(reuse_profile(native).hit_rate(300 * 512), abs=0.01)


def test_the_samples_are_the_published_rows():
    first = json.loads(CONVERSATION.read_text().splitlines()[0])
    assert first == {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": list(range(14))}


# ---- the loader: one line naming file:line for every kind of bad row --------------------------------------------

GOOD = '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}'


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5}', "missing hash_ids"),
        ('{"input_length": 1000, "output_length": 5, "hash_ids": [1]}', "missing timestamp"),
        ('{"timestamp": "soon", "input_length": 1000, "output_length": 5, "hash_ids": [1]}', "timestamp 'soon' is not"),
        ('{"timestamp": 0, "input_length": -3, "output_length": 5, "hash_ids": []}', "input_length '-3' must be"),
        ('{"timestamp": 0, "input_length": 10.5, "output_length": 5, "hash_ids": [1]}', "not a whole number"),
        ('{"timestamp": 0, "input_length": true, "output_length": 5, "hash_ids": [1]}', "input_length 'True' is not"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": null, "hash_ids": [1]}', "output_length 'None'"),
        ('{"timestamp": 0, "input_length": 1e400, "output_length": 5, "hash_ids": [1]}', "finite"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": "1,2"}', "must be a list"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2.5]}', "holds 2.5"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, false]}', "holds False"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2, 3]}', "3 hash_ids for input"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": [1]}', "1 hash_ids for input_length 0"),
        ("[0, 1000, 5, [1]]", "expected a JSON object, found list"),
        ('{"timestamp": 0, "input_length": 1000,', "not a JSON object"),
        ("timestamp,input_length\n", "not a JSON object"),
    ],
)
def test_a_bad_row_is_one_line_naming_its_line(tmp_path, row, says):
    from replay.sources.base import WorkloadError

    path = tmp_path / "t.jsonl"
    path.write_text(GOOD + "\n\n" + row + "\n" + GOOD + "\n")
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path)
    message = str(exc.value)
    assert message.startswith(f"{path}:3: ") and says in message and "\n" not in message, message


def test_time_that_goes_back_is_a_bad_row(tmp_path):
    from replay.sources.base import WorkloadError

    path = tmp_path / "t.jsonl"
    path.write_text(GOOD.replace('"timestamp": 0', '"timestamp": 500') + "\n" + GOOD + "\n")
    with pytest.raises(WorkloadError, match=r"t.jsonl:2: timestamp 0 ms is earlier than the previous row's 500 ms"):
        load_block_trace(path)


@pytest.mark.parametrize(
    ("content", "says"),
    [(b"", "no request"), (b"\n\n", "no request"), (b"\x89PNG\r\n\x1a\n\x00\xff", "not UTF-8"), (None, "cannot open")],
)
def test_files_that_are_no_trace(tmp_path, content, says):
    from replay.sources.base import WorkloadError

    path = tmp_path / "t.jsonl"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(WorkloadError, match=says):
        load_block_trace(path)
    with pytest.raises(WorkloadError, match="cannot open"):
        load_block_trace(tmp_path)  # a directory


# ---- the command ----------------------------------------------------------------------------------------------------


def kvtier(*args: str, check: int | None = 0):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "replay.cli", *args], capture_output=True, text=True, timeout=300)
    if check is not None:
        assert p.returncode == check, p.stderr
    return p


@pytest.mark.slow
def test_plan_trace_writes_table_json_and_figure(tmp_path):
    p = kvtier(
        "plan", "--trace", str(CONVERSATION), "--trace", str(SYNTHETIC), "--tier", "local=2e5",
        "--tier", "far=1MiB", "--kv-bytes-per-token", "4B", "--capacity-sweep", "1e3..1e7",
        "--output", str(tmp_path / "p.json"), "--plots", str(tmp_path / "plots"),
    )  # fmt: skip
    assert "conversation_head300" in p.stdout and "of max" in p.stdout and "hit rate against cache capacity" in p.stdout
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["status"] == "done" and doc["provenance"]["kvtier_version"]
    names = [t["name"] for t in doc["traces"]]
    assert names == ["conversation_head300", "synthetic_head300", "all"]
    conv = doc["traces"][0]
    assert [t["capacity_tokens"] for t in conv["tiers"]] == [2e5, 2**20 / 4]
    # the table's numbers are the model's: the same profile computed here
    profile = reuse_profile(load_block_trace(CONVERSATION))
    assert [t["hit_rate"] for t in conv["tiers"]] == pytest.approx(profile.tier_hit_rates([2e5, 2**18]))
    assert conv["max_hit_rate"] == pytest.approx(profile.max_hit_rate)
    assert [c["capacity_tokens"] for c in conv["curve"]] == pytest.approx(sweep_capacities(1e3, 1e7, 4))
    png = (tmp_path / "plots" / "plan-trace.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tier", "dram=64GiB"], "a size in bytes needs --model or --kv-bytes-per-token"),
        (["--tier", "dram=lots"], "expected tokens (3e6) or bytes with a unit"),
        (["--tier", "dram=0.5"], "holds 0.5 tokens, not a cache"),
        (["--tier", "a=1e5", "--tier", "a=1e6"], "a tier name is given twice"),
        (["--tier", "1e5"], "expected NAME=SIZE"),
        (["--capacity-sweep", "1e9..1e4"], "expected LO..HI tokens"),
        (["--capacity-sweep", "big"], "expected LO..HI tokens"),
        (["--format", "bailian-typo"], "invalid choice"),
        (["--trace-block-tokens", "0"], "--trace-block-tokens"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--output", "/proc/nope/p.json"], "--output"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(tmp_path, args, says):
    p = kvtier("plan", "--trace", str(CONVERSATION), *args, check=2)
    assert p.stderr.startswith("kvtier plan") and says in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr and not p.stdout


@pytest.mark.slow
def test_a_bad_trace_row_is_one_line_and_nothing_is_written(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(CONVERSATION.read_text().splitlines()[0] + "\n" + '{"timestamp": 1}\n')
    p = kvtier("plan", "--trace", str(bad), "--output", str(tmp_path / "p.json"), check=2)
    assert p.stderr == f"kvtier plan --trace: {bad}:2: missing input_length, output_length, hash_ids " \
        "(a Mooncake row has timestamp, input_length, output_length, hash_ids)\n"  # fmt: skip
    assert not (tmp_path / "p.json").exists()


# ---- the other formats -----------------------------------------------------------------------------------------

DATA = Path(__file__).parent / "data"
AZURE = DATA / "azure" / "AzureLLMInferenceTrace_conv_head300.csv"
BAILIAN = DATA / "bailian" / "bailian_format_example.jsonl"
WEKA = DATA / "weka"


def test_azure_rows_are_timed_requests_without_prefix_reuse():
    trace = load_block_trace(AZURE, "azure")
    assert (
        len(trace.requests) == 300 and trace.block_tokens == 16 and trace.name == "AzureLLMInferenceTrace_conv_head300"
    )
    first, second = trace.requests[:2]
    assert (first.input_tokens, first.output_tokens, first.hash_ids) == (374, 44, ())
    assert first.arrival_s == 0 and second.arrival_s == pytest.approx(4.314578)  # 18:15:50.9951690 - 18:15:46.6805900
    profile = reuse_profile(trace)
    assert profile.max_hit_rate == 0 and profile.unique_blocks == 0


def test_bailian_sessions_share_their_history_s_blocks():
    trace = load_block_trace(BAILIAN, "bailian")
    assert trace.block_tokens == 16 and [r.arrival_s for r in trace.requests] == [0.5, 1.25, 3.0, 4.5, 6.0, 6.0]
    profile = reuse_profile(trace)
    # request 2 hits the 4 system-prompt blocks; request 3 those and its first turn's 2 whole blocks (6 blocks,
    # its history's partial block is new); request 4 (turn 2 of the second session) 4 + 1; request 5 4 + 4; request 6 4
    assert profile.hit_tokens(1e9) == 16 * (4 + 6 + 5 + 8 + 4)


def test_weka_calls_and_sub_agents_in_time_order_with_ids_kept_per_file():
    trace = load_block_trace(WEKA, "weka")
    assert trace.block_tokens == 64 and trace.name == "weka"
    assert [r.arrival_s for r in trace.requests] == [0.0, 1.0, 4.0, 5.0, 6.5, 8.0, 12.0]  # two files, a sub-agent
    assert [r.input_tokens for r in trace.requests] == [192, 128, 320, 150, 192, 250, 420]
    profile = reuse_profile(trace)
    # session_a: its second call hits 3 blocks, the sub-agent's calls 2 and 3 (the parent's first two blocks, then
    # its own), the last call 5; session_b's second call 2 of its own. session_b's ids 1, 2 are other text (local
    # scope): its first call hits nothing, though session_a used ids 1, 2 a second before.
    assert profile.hit_tokens(1e9) == 64 * (3 + 2 + 2 + 3 + 5)
    assert len(load_block_trace(WEKA / "session_a.json", "weka").requests) == 5  # one file alone


def test_weka_global_scope_shares_ids_across_files(tmp_path):
    for f in WEKA.glob("*.json"):
        doc = json.loads(f.read_text())
        doc["hash_id_scope"] = "global"
        (tmp_path / f.name).write_text(json.dumps(doc))
    # now session_b's first call hits session_a's block 1 (its block 2 holds its last token): one more block
    assert reuse_profile(load_block_trace(tmp_path, "weka")).hit_tokens(1e9) == 64 * (3 + 2 + 2 + 3 + 5 + 1)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"block_size": 16}, "block_size 16; a Weka trace's blocks are 64 tokens"),
        ({"hash_id_scope": "per-user"}, "hash_id_scope 'per-user' is not local or global"),
        ({"requests": {"t": 0}}, "expected an object with a requests list"),
        ({"requests": [{"t": 0, "type": "subagent"}]}, "requests[0]: a subagent without a requests list"),
        ({"requests": [{"t": 0, "type": "subagent", "requests": [{"type": "n", "t": 1, "in": 5}]}]},
         "requests[0].requests[0]: missing out"),
        ({"requests": [{"t": 0, "type": "x", "in": 5, "out": 1}]}, "requests[0]: type 'x' is not n, s or subagent"),
        ({"requests": [{"t": -1, "type": "n", "in": 5, "out": 1}]}, "requests[0]: t '-1' must be"),
        ({"requests": [{"t": 0, "type": "n", "in": 64, "out": 1, "hash_ids": [1, 2]}]},
         "requests[0]: 2 hash_ids for in 64: at 64 tokens a block it has 1 blocks"),
    ],
)  # fmt: skip
def test_bad_weka_files_are_one_line_naming_the_call(tmp_path, doc, says):
    from replay.sources.base import WorkloadError

    path = tmp_path / "t.json"
    base = {"id": "t", "models": [], "block_size": 64, "hash_id_scope": "local", "requests": []}
    path.write_text(json.dumps({**base, **doc}))
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, "weka")
    assert says in str(exc.value) and str(exc.value).startswith(str(path)) and "\n" not in str(exc.value)


def test_a_directory_without_weka_files(tmp_path):
    from replay.sources.base import WorkloadError

    with pytest.raises(WorkloadError, match=r"no \*\.json Weka trace"):
        load_block_trace(tmp_path, "weka")


@pytest.mark.parametrize(
    ("fmt", "content", "says"),
    [
        ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", ":1: not an Azure LLM inference trace"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", ":2: TIMESTAMP 'yesterday' is not"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3\n", ":2: expected 3 fields"),
        ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-3,4\n", ":2: ContextTokens '-3'"),
        (
            "azure",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,4\n2023-11-16 18:15:45,3,4\n",
            ":3: timestamp -1 s is earlier",
        ),
        ("bailian", '{"chat_id": 1, "timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": []}\n',
         ":1: missing parent_chat_id"),
        ("bailian", '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 20, "output_length": 1, '
         '"hash_ids": [1, 2, 3]}\n', ":1: 3 hash_ids for input_length 20: at 16 tokens a block it has 2 blocks"),
    ],
)  # fmt: skip
def test_bad_rows_of_the_other_formats(tmp_path, fmt, content, says):
    from replay.sources.base import WorkloadError

    path = tmp_path / "t"
    path.write_text(content)
    with pytest.raises(WorkloadError) as exc:
        load_block_trace(path, fmt)
    assert says in str(exc.value) and str(exc.value).startswith(str(path)), str(exc.value)


@pytest.mark.slow
@pytest.mark.parametrize(("fmt", "path"), [("azure", AZURE), ("bailian", BAILIAN), ("weka", WEKA)])
def test_plan_trace_reads_every_format(tmp_path, fmt, path):
    p = kvtier("plan", "--trace", str(path), "--format", fmt, "--tier", "l1=1e4", "--output", str(tmp_path / "p.json"))
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["format"] == fmt and doc["traces"][0]["requests"] == len(load_block_trace(path, fmt).requests)
    assert (doc["traces"][0]["max_hit_rate"] > 0) == (fmt != "azure"), p.stdout


# ---- capacities of any size: never above the maximum, never falling ----------------------------------------------


def _capacities_blocks(distinct: int) -> list[int]:
    return [0, 1, 2, 7, distinct - 1, distinct, distinct + 1, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, 10**30]


def _check_invariants(profile) -> None:
    top = profile.max_hit_rate
    blocks = sorted(b for b in _capacities_blocks(profile.unique_blocks) if b >= 0)
    for kind in (int, float):  # a flag's figure arrives as a float; the model's own sums as ints
        rates = [profile.hit_rate(kind(b * profile.block_tokens)) for b in blocks]
        assert all(r <= top for r in rates), (kind, list(zip(blocks, rates, strict=True)), top)
        assert rates == sorted(rates), (kind, rates)  # monotone non-decreasing in capacity
        assert rates[0] == 0.0 and rates[-1] == top
    for b in blocks:
        # one tier, or the same capacity split in two: their sum is the one cache's rate
        cap = b * profile.block_tokens
        assert sum(profile.tier_hit_rates([cap])) == pytest.approx(profile.hit_rate(cap))
        assert sum(profile.tier_hit_rates([cap, cap])) <= top + 1e-12
        assert sum(profile.tier_hit_rates([2**63 * profile.block_tokens, cap])) == pytest.approx(top)


@pytest.mark.parametrize("path", [CONVERSATION, SYNTHETIC], ids=["conversation", "synthetic"])
def test_hit_rate_is_at_most_the_maximum_and_grows_with_capacity(path):
    _check_invariants(reuse_profile(load_block_trace(path)))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(0, 12), max_size=10, unique=True)), max_size=30))
def test_capacity_invariants_on_random_traces(rows):
    block = 4
    trace = _trace([(max(n, len(ids) * block), ids) for n, ids in rows] or [(4, [0])], block)
    _check_invariants(reuse_profile(trace))


@pytest.mark.slow  # the whole command in-process: about 1.5 s
def test_a_tier_of_2_63_blocks_is_not_above_the_maximum_in_the_command(tmp_path, capsys):
    from replay import cli

    out = tmp_path / "p.json"
    huge = str(2**63 * 512)
    argv = ["plan", "--trace", str(CONVERSATION), "--tier", f"a={huge}", "--tier", "b=1e30", "--quiet"]
    assert cli.main([*argv, "--capacity-sweep", "1e18..1e30", "--output", str(out)]) == 0, capsys.readouterr().err
    t = json.loads(out.read_text())["traces"][0]
    assert 0 < t["tiers_hit_rate"] == pytest.approx(t["max_hit_rate"]) and t["share_of_max"] == pytest.approx(1.0)
    assert t["tiers"][1]["hit_rate"] == 0.0  # the first tier holds the whole trace: nothing is left for the second
    assert all(p["hit_rate"] == pytest.approx(t["max_hit_rate"]) for p in t["curve"])


# ---- a trace without a prompt token ------------------------------------------------------------------------------


def test_a_trace_of_zero_token_prompts_has_no_hit_rate(tmp_path, capsys):
    from replay import cli

    profile = reuse_profile(_trace([(0, []), (0, [])]))
    assert profile.prompt_tokens == 0
    assert profile.hit_rate(1e6) is None and profile.max_hit_rate is None
    assert profile.tier_hit_rates([10, 2**70]) == [None, None]
    path = tmp_path / "zero.jsonl"
    path.write_text(
        "".join(f'{{"timestamp": {i}, "input_length": 0, "output_length": 5, "hash_ids": []}}\n' for i in range(3))
    )
    out = tmp_path / "p.json"
    assert cli.main(["plan", "--trace", str(path), "--tier", "a=1e5", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvtier plan --trace: {path}: every prompt in this trace is 0 tokens, so it has no hit rate"]
    assert not out.exists()
