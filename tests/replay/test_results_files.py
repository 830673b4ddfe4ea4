"""Files kvtier reads are validated, never a traceback; no file it writes holds a bare NaN; a closed stdout is fine.

- Results files (merge, compare, check): hand-altered fields (a string for a number, a list for a section, null where
  the writer never writes one, a negative count, NaN, Infinity, 1e400) and deep nesting are one line naming the file
  and the field, exit 2, nothing written.
- Nesting is bounded and non-finite numbers refused in every file read: datasets (ShareGPT, JSONL traces), --config
  YAML/JSON, --validation-trace, a model's config.json.
- The JSON sinks write null for a non-finite float (json.dumps(allow_nan=False) proves none is left).
- `kvtier ... | head -1`, and bench / merge into a closed pipe: exit 0, results files written, no traceback.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from bench_helpers import run, write_config

from replay.common.json_files import MAX_NESTING, InputError, dumps_json, loads_json
from replay.outputs.jsonl import write_jsonl
from replay.outputs.paths import write_results

PY = sys.executable
KVTIER = [PY, "-m", "replay.cli"]


# ---- the JSON reader ----------------------------------------------------------------------------------------------

REFUSED_JSON = {
    "a list nested 100000 deep": "[" * 100_000,
    "an object nested 100000 deep": '{"a":' * 100_000,
    "mixed nesting 5000 deep": '[{"a":' * 2500,
    "one level past the bound": "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1),
    "NaN": '{"x": NaN}',
    "Infinity": "[Infinity]",
    "-Infinity": '{"a": [1, -Infinity]}',
    "a float too large": '{"elapsed_time": 1e400}',
}


@pytest.mark.parametrize("name", REFUSED_JSON)
def test_the_json_reader_refuses_deep_nesting_and_non_finite_numbers(name):
    with pytest.raises(InputError):
        loads_json(REFUSED_JSON[name])


def test_the_json_reader_takes_nesting_up_to_the_bound_and_a_bom():
    assert loads_json("[" * MAX_NESTING + "]" * MAX_NESTING) is not None
    assert loads_json(b'\xef\xbb\xbf{"a": [1.5, -2e300]}') == {"a": [1.5, -2e300]}


def test_sinks_write_null_for_a_non_finite_float(tmp_path):
    doc = {"summary": {"elapsed_time": float("nan"), "rate": [float("inf"), -float("inf"), 1.0]}}
    _, moved = write_results(str(tmp_path / "r.json"), doc)
    assert moved is None
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert loads_json(text) == {"summary": {"elapsed_time": None, "rate": [None, None, 1.0]}}
    write_jsonl([{"ttft_ms": float("nan")}, {"ttft_ms": 2.0}], tmp_path / "d.jsonl")
    assert [loads_json(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()] == [
        {"ttft_ms": None},
        {"ttft_ms": 2.0},
    ]
    assert dumps_json({"a": float("nan")}) == '{"a": null}'


# ---- results files read back ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Two real short runs, as documents and files."""
    paths = []
    for seed in (21, 22):
        tmp = tmp_path_factory.mktemp(f"run-{seed}")
        assert run(tmp, seed=seed, duration=0.5).pop("_rc") == 0
        paths.append(tmp / "out.json")
    return paths


def _set(path: str, value):
    def alter(doc):
        keys = path.split(".")
        node = doc
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return alter


# (alteration, the field the error names); each applied to a real result.
ALTERED = {
    "elapsed_time a string": (_set("summary.elapsed_time", "abc"), "summary.elapsed_time"),
    "elapsed_time a numeric string": (_set("summary.elapsed_time", "1.5"), "summary.elapsed_time"),
    "elapsed_time negative": (_set("summary.elapsed_time", -5), "summary.elapsed_time"),
    "elapsed_time a boolean": (_set("summary.elapsed_time", True), "summary.elapsed_time"),
    "elapsed_time missing": (lambda d: d["summary"].pop("elapsed_time"), "summary.elapsed_time"),
    "summary a string": (_set("summary", "x"), "summary"),
    "block_device a list": (_set("block_device", [1, 2]), "block_device"),
    "block_device reads negative": (_set("block_device.reads", -1), "block_device.reads"),
    "tiers a string": (_set("tiers", "x"), "tiers"),
    "a tier a string": (_set("tiers.disk", "x"), "tiers.disk"),
    "a tier's bytes a string": (_set("tiers.disk.read.bytes", "many"), "tiers.disk.read.bytes"),
    "config.duration null": (_set("config.duration", None), "config.duration"),
    "config.num_users a string": (_set("config.num_users", "4"), "config.num_users"),
    "config a list": (_set("config", [1]), "config"),
    "timeline a string": (_set("timeline", "x"), "timeline"),
    "a timeline point's time a string": (lambda d: d["timeline"][0].update(t_s="a"), "timeline[0].t_s"),
    "a histogram a number": (_set("request_histograms.end_to_end", 5), "request_histograms.end_to_end"),
    "clients a dict": (_set("clients", {"a": 1}), "clients"),
    "a client without a summary": (_set("clients", [{"status": "completed"}]), "clients[0].summary"),
    "status a number": (_set("status", 3), "status"),
    "kind of another command": (_set("kind", "kvtier sweep"), "kvtier sweep"),
}
# Altered as text: what json.loads would take and the readers must not.
ALTERED_TEXT = {
    "elapsed_time NaN": lambda t: t.replace('"elapsed_time": ', '"elapsed_time": NaN, "x": ', 1),
    "a tier's bytes Infinity": lambda t: t.replace('"bytes": ', '"bytes": Infinity, "y": ', 1),
    "1e400": lambda t: t.replace('"elapsed_time": ', '"elapsed_time": 1e400, "x": ', 1),
    "nested 100000 deep": lambda t: '{"a":' * 100_000 + "1" + "}" * 100_000,
    "a list 100000 deep": lambda t: "[" * 100_000,
    "a top-level list": lambda t: f"[{t}]",
    "truncated": lambda t: t[: len(t) // 2],
    "not UTF-8": lambda t: "\udcff",
}


def _commands():
    from replay.synthetic.check import main as check_main
    from replay.synthetic.compare import main as compare_main
    from replay.synthetic.merge import main as merge_main

    return {
        "merge": lambda good, bad, out: merge_main([good, bad, "-o", out]),
        "compare": lambda good, bad, out: compare_main([good, bad, "--json", out]),
        "check": lambda good, bad, out: check_main([good, bad]),
    }


@pytest.mark.parametrize("command", ["merge", "compare", "check"])
@pytest.mark.slow
def test_hand_altered_results_are_one_line_naming_the_file_and_field(results, tmp_path, capsys, command):
    good = str(results[0])
    base = json.loads(results[1].read_text())
    cases = []
    for name, (alter, field) in ALTERED.items():
        doc = copy.deepcopy(base)
        alter(doc)
        cases.append((name, json.dumps(doc), field))
    text = results[1].read_text()
    for name, alter in ALTERED_TEXT.items():
        cases.append((name, alter(text), ""))
    out = tmp_path / "out.json"
    main = _commands()[command]
    for name, content, field in cases:
        bad = tmp_path / f"{name.replace(' ', '_')}.json"
        bad.write_bytes(content.encode("utf-8", "surrogateescape"))
        rc = main(good, str(bad), str(out))
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"kvtier {command}: {bad}:"), (name, err)
        assert field in lines[0], (name, err)
        assert not out.exists(), name


@pytest.mark.slow
def test_the_results_of_every_writer_load(results, tmp_path):
    """A run, a merge of runs, a merge of merges and a --trials document all pass the model."""
    from replay.outputs.results_file import load_results_file
    from replay.synthetic.merge import main as merge_main

    a, b = map(str, results)
    assert merge_main([a, b, "-o", str(tmp_path / "m.json")]) == 0
    cfg = write_config(tmp_path, duration=0.3, output=str(tmp_path / "t.json"))
    from replay.synthetic.cli import main as bench_main

    assert bench_main(["--config", cfg, "--trials", "2"]) == 0
    for p in (*results, tmp_path / "m.json", tmp_path / "t.json", tmp_path / "t-trial1.json"):
        doc = load_results_file(str(p))
        assert doc == json.loads(p.read_text())  # returned as written


# ---- every other file kvtier reads ---------------------------------------------------------------------------------

DEEP = "[" * 100_000
DEEP_OBJECT = '{"a":' * 100_000


@pytest.mark.parametrize(
    "flags, content, says",
    [
        (["--dataset-path", "{f}"], DEEP, "nested more than"),
        (["--dataset-path", "{f}"], '[{"id": "a", "conversations": [], "n": NaN}]', "NaN is not a finite number"),
        (["--dataset-path", "{f}"], '[{"id": "a", "conversations": ' + DEEP_OBJECT, "nested more than"),
        (["--validation-trace", "{f}"], DEEP, "nested more than"),
        (["--validation-trace", "{f}"], "[Infinity]", "not a finite number"),
        (["--model", "{f}"], DEEP_OBJECT, "nested more than"),
        (["--model", "{f}"], '{"hidden_size": NaN}', "not a finite number"),
        (["--config", "{f}"], "a: " + DEEP, "nested more than"),
        (["--config", "{f}"], DEEP_OBJECT, "nested more than"),
        (["--config", "{f}"], "- " * 5000 + "x", "nested more than"),
        (["--config", "{f}"], "duration: .nan", "nan is not a finite number"),
        (["--config", "{f}"], "duration: .inf", "inf is not a finite number"),
    ],
)
@pytest.mark.slow
def test_bench_inputs_deep_or_non_finite_are_one_line(tmp_path, flags, content, says):
    f = tmp_path / ("config.json" if flags[1:] == ["{f}"] and flags[0] == "--model" else "input.json")
    f.write_text(content)
    base = [] if flags[0] == "--config" else ["--config", write_config(tmp_path)]
    argv = [*KVTIER, "bench", *base, *(a.replace("{f}", str(f)) for a in flags), "--output", str(tmp_path / "o.json")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    "source, content",
    [
        ("sharegpt", DEEP),
        ("sharegpt", '[{"conversations": [{"from": "human", "value": "hi", "w": Infinity}]}]'),
        ("mooncake", '{"timestamp": 0, "hash_ids": ' + DEEP),
        ("mooncake", '{"timestamp": NaN, "input_length": 1, "output_length": 1, "hash_ids": [1]}'),
    ],
)
@pytest.mark.slow
def test_replay_datasets_deep_or_non_finite_are_one_line(tmp_path, source, content):
    f = tmp_path / "data.jsonl"
    f.write_text(content + "\n")
    argv = [*KVTIER, "replay", "--base-url", "http://127.0.0.1:9", "--model", "m", "--source", source]
    argv += ["--dataset-path", str(f), "--output", str(tmp_path / "o.json")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]  # after a note that the server's tokenizer is not there
    assert r.returncode == 2 and "Traceback" not in r.stderr and last.startswith(f"kvtier replay: {f}"), r.stderr
    assert "nested more than" in last or "not a finite number" in last, r.stderr


# ---- a closed stdout ----------------------------------------------------------------------------------------------


def _into_closed_pipe(argv, cwd=None):
    """Run `argv` with a stdout whose reader has gone (the read end closed before the command writes)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, timeout=300, cwd=cwd)
    finally:
        os.close(w)
    return p


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"], ["merge", "--help"], ["plan", "--help"]])
@pytest.mark.slow
def test_help_into_a_closed_pipe_is_no_error(argv):
    p = _into_closed_pipe([*KVTIER, *argv])
    assert p.returncode == 0 and "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


@pytest.mark.slow  # three real runs and a merge, about 15 s
def test_bench_and_merge_into_a_closed_pipe_write_their_results_and_exit_0(results, tmp_path):
    cfg = write_config(tmp_path, duration=0.3)
    out = tmp_path / "b.json"
    p = _into_closed_pipe([*KVTIER, "bench", "--config", cfg, "--output", str(out), "--csv-output", str(out) + ".csv"])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert json.loads(out.read_text())["status"] == "completed" and (tmp_path / "b.json.csv").exists()
    # trials go on after the first table found the pipe closed
    p = _into_closed_pipe([*KVTIER, "bench", "--config", cfg, "--output", str(tmp_path / "t.json"), "--trials", "2"])
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "t.json").read_text())["trials_completed"] == 2
    p = _into_closed_pipe([*KVTIER, "merge", *map(str, results), "-o", str(tmp_path / "m.json")])
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert json.loads((tmp_path / "m.json").read_text())["summary"]["num_clients"] == 2


@pytest.mark.parametrize("value", ["[" * 50_000, "{a: " * 20_000, "[[1]]", ".nan", ".inf"])
@pytest.mark.slow
def test_a_kvtier_variable_deep_or_non_finite_is_one_line(tmp_path, value):
    argv = [*KVTIER, "bench", "--config", write_config(tmp_path), "--output", str(tmp_path / "o.json")]
    env = {**os.environ, "KVTIER_DURATION": value}
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("kvtier bench: environment KVTIER_DURATION=")
    assert not (tmp_path / "o.json").exists()
