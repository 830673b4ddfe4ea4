"""Values that must be refused before anything runs, for every command whose settings go through replay.common.settings:
an empty flag, variable or YAML value (never "use the default"), a YAML key given twice (at any depth), a variable of
the command's prefix that names no setting, a bad YAML value a flag or variable overrides, and the bounds on work
(plan --concurrency/--rounds, bench --trials, replay prompt sizes and --range-ratio). Each is one line on stderr
and exit 2, through the real CLIs."""

from __future__ import annotations

import pytest

from replay.cli import main as kvtier


# Through the dispatcher, which answers a refusal (replay/cli.py): as `kvtier replay ...` etc.
def replay_main(argv):
    return kvtier(["replay", *argv])


def plan_main(argv):
    return kvtier(["plan", *argv])


def bench_main(argv):
    return kvtier(["bench", *argv])


PLAN = ["--input-len", "5", "--output-len", "5", "--block-size", "16", "--kv-bytes-per-token", "1000"]
PLAN += ["--tier", "dram=1GB", "--quiet", "--concurrency", "2", "--rounds", "3"]
REPLAY = ["--base-url", "http://127.0.0.1:9", "--model", "m"]


def _code(fn, argv) -> int:
    try:
        return fn(argv)
    except SystemExit as exc:  # argparse's own refusals
        return exc.code


def refused(capsys, fn, argv, *said: str) -> str:
    code = _code(fn, argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for s in said:
        assert s in lines[0], lines[0]
    return lines[0]


# ---- empty values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn, argv, said",
    [
        (replay_main, [*REPLAY, "--output", ""], "--output: empty"),
        (replay_main, ["--base-url", "http://127.0.0.1:9", "--model", "", "--output", "o.json"], "--model: empty"),
        (replay_main, ["--base-url", "http://127.0.0.1:9", "--model", "  ", "--output", "o.json"], "--model: empty"),
        (replay_main, [*REPLAY, "--output", "o.json", "--detail", ""], "--detail: empty"),
        (replay_main, [*REPLAY, "--output", "o.json", "--api-key-env", ""], "--api-key-env: empty"),
        (plan_main, [*PLAN, "--output", ""], "--output: empty"),
        (plan_main, [*PLAN, "--model", ""], "--model: empty"),
        (bench_main, ["--cache-dir", "", "--duration", "1"], "--cache-dir: empty"),
        (bench_main, ["--output", "", "--duration", "1"], "--output: empty"),
        (bench_main, ["--model", "", "--duration", "1"], "--model: empty"),
    ],
)
def test_an_empty_value_is_refused_not_taken_as_the_default(capsys, tmp_path, monkeypatch, fn, argv, said):
    monkeypatch.chdir(tmp_path)
    refused(capsys, fn, argv, said)
    assert list(tmp_path.iterdir()) == []  # nothing written, no default path used


def test_an_empty_variable_or_yaml_value_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVTIER_REPLAY_OUTPUT", "")
    refused(capsys, replay_main, REPLAY, "KVTIER_REPLAY_OUTPUT", "empty")
    monkeypatch.delenv("KVTIER_REPLAY_OUTPUT")
    (tmp_path / "c.yaml").write_text("output: ''\n")
    refused(capsys, plan_main, [*PLAN, "--config", "c.yaml"], "c.yaml: output: empty")


# ---- a key given twice in a YAML file -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn, base, text, said",
    [
        (plan_main, PLAN, "rounds: 3\nrounds: 4\n", "key 'rounds' given twice (lines 1 and 2)"),
        (plan_main, PLAN, "seed: 1\norder: fixed\nseed: 1\n", "key 'seed' given twice (lines 1 and 3)"),
        (replay_main, [*REPLAY, "--output", "o.json"], "seed: 1\nseed: 2\n", "key 'seed' given twice"),
        (bench_main, ["--duration", "1"], "conversation:\n  max_turns: 3\n  max_turns: 4\n", "'max_turns' given twice"),
        (bench_main, ["--duration", "1"], "num_users: 2\nnum_users: 2\n", "'num_users' given twice"),
    ],
)
def test_a_yaml_key_given_twice_is_refused(capsys, tmp_path, monkeypatch, fn, base, text, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(text)
    refused(capsys, fn, [*base, "--config", "c.yaml"], "--config c.yaml", said)


# ---- a variable of the prefix that names no setting -----------------------------------------------------------------
@pytest.mark.parametrize(
    "var, fn, argv",
    [
        ("KVTIER_PLAN_ROUNDZ", plan_main, PLAN),
        ("KVTIER_PLAN_", plan_main, PLAN),
        ("KVTIER_REPLAY_SEEDS", replay_main, [*REPLAY, "--output", "o.json"]),
        ("KVTIER_REPLAY_BASEURL", replay_main, [*REPLAY, "--output", "o.json"]),
    ],
)
def test_an_unknown_variable_of_the_prefix_is_refused(capsys, tmp_path, monkeypatch, var, fn, argv):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, "3")
    refused(capsys, fn, argv, f"environment {var}: no such setting")


def test_plan_and_plan_trace_share_their_prefix(capsys, tmp_path, monkeypatch):
    # A variable of `kvtier plan --trace` (its --trace) is no mistake for `kvtier plan`, nor the other way round.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVTIER_PLAN_ORDER", "fixed")
    assert plan_main([*PLAN]) == 0
    monkeypatch.setenv("KVTIER_PLAN_TRACE", "nowhere.jsonl")
    assert plan_main([*PLAN]) == 0


# ---- a bad value a later layer overrides is still reported ----------------------------------------------------------
@pytest.mark.parametrize(
    "fn, base, yaml_text, said",
    [
        (plan_main, PLAN, "rounds: -3\n", "c.yaml: rounds: Input should be greater than or equal to 1"),
        (plan_main, PLAN, "concurrency: lots\n", "c.yaml: concurrency"),
        (replay_main, [*REPLAY, "--output", "o.json", "--seed", "1"], "seed: -1\n", "c.yaml: seed"),
        (bench_main, ["--duration", "1", "--num-users", "2"], "num_users: 0\n", "c.yaml: num_users"),
        (
            bench_main,
            ["--duration", "1", "--rag-top-k", "3"],
            "rag:\n  top_k: 0\n",
            "c.yaml: rag.top_k",
        ),
    ],
)
def test_a_bad_yaml_value_is_reported_though_a_flag_overrides_it(
    capsys, tmp_path, monkeypatch, fn, base, yaml_text, said
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml_text)
    refused(capsys, fn, [*base, "--config", "c.yaml"], said)


def test_a_bad_yaml_value_is_reported_though_a_variable_overrides_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("seed: -1\n")
    monkeypatch.setenv("KVTIER_REPLAY_SEED", "4")
    refused(capsys, replay_main, [*REPLAY, "--output", "o.json", "--config", "c.yaml"], "c.yaml: seed")


# ---- bounds on the work asked for -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fn, argv, said",
    [
        (plan_main, [*PLAN, "--concurrency", "100000000"], "at most 1,000,000 sessions"),
        (plan_main, [*PLAN, "--concurrency", str(10**30)], "at most 1,000,000 sessions"),
        (plan_main, [*PLAN, "--rounds", "100000000"], "at most 100,000 rounds"),
        (plan_main, [*PLAN, "--concurrency", "1000000", "--rounds", "1000"], "at most 100,000,000 simulated"),
        (bench_main, ["--trials", "1000000"], "--trials 1000000: give 1 to 1000"),
        (bench_main, ["--trials", "1001"], "give 1 to 1000"),
        (bench_main, ["--config", "turns.yaml"], "conversation.max_turns: Input should be less than or equal to"),
        (replay_main, [*REPLAY, "--output", "o.json", "--input-len", "1000000000"], "over --max-prompt-tokens"),
        (replay_main, [*REPLAY, "--output", "o.json", "--input-len", "70000", "--turns", "2"], "140,128 tokens"),
        (replay_main, [*REPLAY, "--output", "o.json", "--prefix-len", "200000"], "over --max-prompt-tokens"),
        (replay_main, [*REPLAY, "--output", "o.json", "--input-len", "100", "--max-prompt-tokens", "99"], "99"),
        (replay_main, [*REPLAY, "--output", "o.json", "--range-ratio", "2"], "--range-ratio"),
        (replay_main, [*REPLAY, "--output", "o.json", "--range-ratio", "1"], "--range-ratio"),
        (replay_main, [*REPLAY, "--output", "o.json", "--dataset-path", "x.json"], "not read by --source synthetic"),
        (replay_main, [*REPLAY, "--output", "o.json", "--trace-path", "x.csv"], "not read by --source synthetic"),
    ],
)
def test_work_beyond_the_bounds_is_refused_up_front(capsys, tmp_path, monkeypatch, fn, argv, said):
    monkeypatch.chdir(tmp_path)
    if "turns.yaml" in argv:
        (tmp_path / "turns.yaml").write_text("conversation: {max_turns: 10000000000000, end_probability: 0}\n")
    refused(capsys, fn, argv, said)
    assert [p.name for p in tmp_path.iterdir()] in ([], ["turns.yaml"])


# ---- capacities: tiny (0 bytes once whole, and 0 means "auto"), huge, inf, nan; per-class values -------------------
@pytest.mark.parametrize(
    "argv, said",
    [
        (["--storage-capacity-gb", "1e-12"], "--storage-capacity-gb 1e-12 is less than one byte (0 means auto"),
        (["--storage-capacity-gb", "9e-10", "--size-unit", "GB"], "less than one byte"),
        (["--storage-capacity-gb", "5e-10", "--size-unit", "GiB"], "less than one byte"),
        (["--cpu-mem-gb", "1e-10"], "--cpu-mem-gb 1e-10 is less than one byte (0 means none)"),
        (["--gpu-mem-gb", "1e-300"], "less than one byte"),
        (["--precondition-size-gb", "1e-12"], "less than one byte"),
        (["--storage-capacity-gb", "1e300"], "less than or equal to"),
        (["--storage-capacity-gb", "Infinity"], "finite"),
        (["--storage-capacity-gb=-inf"], "finite"),
        (["--storage-capacity-gb", "nan"], "finite"),
        (["--cpu-mem-gb", "1e309"], "finite"),
    ],
)
def test_a_capacity_that_holds_nothing_or_cannot_be_is_refused(capsys, tmp_path, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    refused(capsys, bench_main, [*argv, "--duration", "0.5"], said)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "yaml_text, said",
    [
        ("generation:\n  ms_per_token: {fast: -50}\n", "generation.ms_per_token.fast: Input should be greater"),
        ("generation:\n  prefill_ms_per_token: {realistic: -0.1}\n", "prefill_ms_per_token.realistic"),
        ("qos_distribution: {interactive: -1, batch: 2}\n", "qos_distribution.interactive"),
        ("generation:\n  ms_per_token: {fast: .nan}\n", "not a finite number"),
    ],
)
def test_a_negative_or_non_finite_per_class_value_is_refused(capsys, tmp_path, monkeypatch, yaml_text, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml_text)
    refused(capsys, bench_main, ["--config", "c.yaml", "--duration", "0.5"], said)


@pytest.mark.parametrize("key", ["disk_capacity_gb", "shared_capacity_gb", "redis_capacity_gb"])
@pytest.mark.parametrize("value", [1e-10, 1e-300, 9.9e-10, 1e300, float("inf"), float("nan"), -1.0])
def test_the_library_refuses_the_same_capacities(tmp_path, key, value):
    from pydantic import ValidationError

    from kvconnector.backend_config import BackendConfig

    tiers = {"disk_dir": str(tmp_path / "d"), "shared_dir": str(tmp_path / "s"), "redis_url": "redis://127.0.0.1:1"}
    with pytest.raises(ValidationError, match=key):
        BackendConfig(**tiers, **{key: value})
    BackendConfig(**tiers, **{key: 1e-9})  # one byte: a tier that holds nothing, as asked


# ---- a BurstGPT header naming a column twice ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header, twice",
    [
        ("Timestamp,Model,Request tokens,Response tokens,Request tokens,Log Type", "Request tokens"),
        ("Timestamp,Timestamp,Model,Request tokens,Response tokens,Log Type", "Timestamp"),
        ("Timestamp,Model,Request tokens,Response tokens, Response tokens ,Log Type", "Response tokens"),
        ("Timestamp,Model,Model,Request tokens,Response tokens,Log Type", "Model"),
    ],
)
def test_a_burstgpt_column_named_twice_is_refused(tmp_path, header, twice):
    from replay.sources.base import WorkloadError
    from replay.sources.burstgpt import load_burstgpt

    path = tmp_path / "t.csv"
    path.write_text(header + "\n" + "0,a,5,5,7,x\n")
    with pytest.raises(WorkloadError, match=rf"t\.csv:1: column '{twice}' appears 2 times"):
        load_burstgpt(path)
