"""Every results file kvtier writes is read by every reader of kvtier's outputs: report, check, compare, merge.

- The README's first chain, for real on this host (a host without CUDA runs it without a GPU): `kvtier bench` with no
  flags other than --duration, --output and --cache-dir, then report, check, compare and merge of what it wrote.
- Each kind of results file (a run, --num-clients 2, --source mooncake, --trials, a merge, `kvtier replay`), written
  with --gpu-mem-gb and --io-workers left to the run, read back by each reader: bench results by all four, a --trials
  document by all but merge (which says to merge its trials' files), a replay summary by report only (compare, check
  and merge take kvtier bench results and say so in one line).
- A results file records every key left to the run as the value that ran (never null), and a file an older kvtier
  wrote with null gpu_mem_gb is read as its own tiers section tells.
- An output asked for and not written (--html-output, --xlsx-output, ...) exits 1 with one line; --submission-check
  after a run with defaults checks the run (exit 0 or 1, never a refusal of kvtier's own file).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bench_helpers import write_config

from replay.openai.fake_server import FakeServer, FakeServerConfig
from replay.outputs.results_file import load_results_file
from replay.sources.block_traces import FORMATS

KVTIER = [sys.executable, "-m", "replay.cli"]
MOONCAKE = Path(__file__).parent.parent / "data" / "mooncake" / "conversation_trace_head300.jsonl"
# Keys whose None would leave their meaning to the reader's host or version: a results file holds what ran.
RESOLVED = ("seed", "gpu_mem_gb", "io_workers")


REPO = Path(__file__).resolve().parents[3]


def kvtier(*argv, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    # this checkout's kvtier, from any working directory
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run([*KVTIER, *map(str, argv)], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def config_left_to_the_run(tmp: Path, **overrides) -> str:
    """bench_helpers' small config without the keys whose default is chosen when the run starts."""
    path = Path(write_config(tmp, **overrides))
    cfg = yaml.safe_load(path.read_text())
    for key in ("gpu_mem_gb", "io_workers"):
        cfg.pop(key, None)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def no_auto_nulls(doc: dict, where: str, extra: tuple[str, ...] = ()) -> None:
    seeds = {c["config"]["seed"] for c in doc.get("clients") or []}
    for key in (*RESOLVED, *extra):
        if key == "seed" and len(seeds) > 1 and doc["config"]["seed"] is None:
            continue  # `kvtier merge` of runs with their own seeds: none is the job's (each is in `clients`)
        assert doc["config"].get(key) is not None, f"{where}: config.{key} is null"
    for i, client in enumerate(doc.get("clients") or []):
        no_auto_nulls(client, f"{where} client {i}", extra)


def read_by_all(path: Path, tmp: Path, readers=("report", "check", "compare", "merge")) -> None:
    """Each reader takes the file: report writes its page, check runs its items (exit 0 or 1: the items' verdict),
    compare prints its table, merge writes a merged file that is itself read back."""
    name = path.stem
    if "report" in readers:
        page = tmp / f"{name}.html"
        r = kvtier("report", path, "-o", page)
        assert r.returncode == 0 and page.stat().st_size > 0, r.stderr
    if "check" in readers:
        r = kvtier("check", path)
        assert r.returncode in (0, 1) and "items pass" in r.stdout + r.stderr, r.stderr
    if "compare" in readers:
        twin = tmp / f"{name}.twin.json"  # compare refuses one file given twice: a second file of the same run
        shutil.copyfile(path, twin)
        r = kvtier("compare", path, twin, "--json", tmp / f"{name}.compare.json")
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp / f"{name}.compare.json").read_text())
    if "merge" in readers:
        merged = tmp / f"{name}.merged.json"
        r = kvtier("merge", path, "-o", merged)
        assert r.returncode == 0, r.stderr
        assert load_results_file(str(merged))["config"]["gpu_mem_gb"] is not None


def refused_in_one_line(r: subprocess.CompletedProcess, sub: str, said: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"kvtier {sub}: "), r.stderr
    assert said in lines[0] and "Traceback" not in r.stderr


# ---- the README's first chain, as a user without a GPU runs it -------------------------------------------------------


@pytest.mark.slow
def test_the_default_chain_runs_here(tmp_path):
    out = tmp_path / "b.json"
    r = kvtier("bench", "--duration", "0.5", "--output", out, "--cache-dir", tmp_path / "c", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    raw = json.loads(out.read_text())
    # every key left to the run is recorded as it ran: the GPU tier's size, the I/O threads, the seed, the context
    no_auto_nulls(raw, "default run", extra=("max_context_tokens",))
    assert raw["config"]["gpu_mem_gb"] == (16.0 if "gpu" in raw["tiers"] else 0.0)
    assert raw["config"]["io_workers"] == 100  # the reference's request model: one per user (100 by default)
    assert all(p["weight"] == 2.0 ** p["priority"] for p in raw["config"]["qos_profiles"].values())
    read_by_all(out, tmp_path)


# ---- each kind of results file, each reader ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """One file of each kind kvtier writes, every default left to the run. Written once for the module."""
    tmp = tmp_path_factory.mktemp("chain")
    files = {}

    def bench(name: str, *flags, **overrides) -> Path:
        d = tmp / name
        d.mkdir()
        (d / "cache").mkdir()
        out = d / f"{name}.json"
        cfg = config_left_to_the_run(d, duration=0.5, output=str(out), **overrides)
        r = kvtier("bench", "--config", cfg, *flags)
        assert r.returncode == 0, r.stderr
        files[name] = out
        return out

    bench("run")
    bench("other", seed=12)
    bench("clients", num_clients=2)
    bench("mooncake", "--source", "mooncake", "--dataset-path", MOONCAKE, "--trace-block-tokens", "16", max_requests=40)
    bench("mooncake_native", "--source", "mooncake", "--dataset-path", MOONCAKE, max_requests=20)
    bench("trials", "--trials", "2")
    merged = tmp / "merged.json"
    r = kvtier("merge", files["run"], files["other"], "-o", merged)
    assert r.returncode == 0, r.stderr
    files["merged"] = merged
    with FakeServer(FakeServerConfig(default_max_tokens=4)) as srv:
        replayed = tmp / "replay.json"
        r = kvtier(
            "replay",
            *("--base-url", srv.base_url, "--model", "fake", "--source", "synthetic", "--num-requests", "5"),
            *("--input-len", "8", "--output-len", "4", "--output", replayed, "--quiet"),
        )
        assert r.returncode == 0, r.stderr
    files["replay"] = replayed
    return files


BENCH_KINDS = ["run", "clients", "mooncake", "mooncake_native", "merged"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", BENCH_KINDS)
def test_each_bench_result_records_what_ran_and_every_reader_reads_it(outputs, kind, tmp_path):
    path = outputs[kind]
    raw = json.loads(path.read_text())
    no_auto_nulls(raw, kind, extra=("trace_block_tokens",) if kind.startswith("mooncake") else ())
    if kind == "mooncake":
        assert raw["config"]["trace_block_tokens"] == 16
    if kind == "mooncake_native":  # the format's own block, recorded as a number
        assert raw["config"]["trace_block_tokens"] == FORMATS["mooncake"]
    if kind == "merged":
        assert raw["config"]["seed"] is None and {c["config"]["seed"] for c in raw["clients"]} == {11, 12}
    if kind in ("clients", "merged"):  # a job's I/O threads: each process has its own pool
        assert raw["config"]["io_workers"] == sum(c["config"]["io_workers"] for c in raw["clients"])
    read_by_all(path, tmp_path)


@pytest.mark.slow
def test_a_trials_document_is_read_by_report_check_and_compare_and_merge_says_what_to_merge(outputs, tmp_path):
    path = outputs["trials"]
    doc = json.loads(path.read_text())
    no_auto_nulls(doc, "trials")
    for t in doc["per_trial"]:
        no_auto_nulls(json.loads(Path(t["file"]).read_text()), f"trial {t['trial']}")
    read_by_all(path, tmp_path, readers=("report", "check", "compare"))
    refused_in_one_line(kvtier("merge", path, "-o", tmp_path / "m.json"), "merge", "merge its per-trial files")
    trial_files = [t["file"] for t in doc["per_trial"]]
    r = kvtier("merge", *trial_files, "-o", tmp_path / "trials-merged.json")
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_a_replay_summary_is_read_by_report_and_refused_in_one_line_by_the_bench_readers(outputs, tmp_path):
    path = outputs["replay"]
    read_by_all(path, tmp_path, readers=("report",))
    for sub, argv in (("compare", [path, path]), ("check", [path]), ("merge", [path, "-o", tmp_path / "m.json"])):
        refused_in_one_line(kvtier(sub, *argv), sub, "a `kvtier replay` summary, not a kvtier bench result")
    assert not (tmp_path / "m.json").exists()


# ---- files written by an older kvtier ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["run", "clients", "merged"])
def test_an_older_files_null_gpu_mem_gb_is_read_as_its_tiers_tell(outputs, kind, tmp_path):
    doc = json.loads(outputs[kind].read_text())
    older = copy.deepcopy(doc)
    for d in [older, *(older.get("clients") or [])]:
        d["config"]["gpu_mem_gb"] = None  # what kvtier wrote for --gpu-mem-gb left out, before it recorded the value
        d["config"]["io_workers"] = None
    path = tmp_path / "older.json"
    path.write_text(json.dumps(older))
    read = load_results_file(str(path))
    assert read["config"]["gpu_mem_gb"] == doc["config"]["gpu_mem_gb"] == 0.0  # no GPU tier in its tiers section
    with_gpu = copy.deepcopy(older)  # as a host with CUDA wrote it: a GPU tier of 16 GiB
    with_gpu["tiers"] = {"gpu": {"name": "gpu", "kind": "gpu", "capacity_bytes": 16 << 30}, **with_gpu["tiers"]}
    with_gpu["config"].update(size_unit="GiB", num_gpus=1)
    (tmp_path / "gpu.json").write_text(json.dumps(with_gpu))
    assert load_results_file(str(tmp_path / "gpu.json"))["config"]["gpu_mem_gb"] == 16.0
    read_by_all(path, tmp_path)


# ---- outputs asked for at the end of a run -------------------------------------------------------------------------


@pytest.mark.slow
def test_html_output_and_submission_check_after_a_run_with_defaults(tmp_path):
    (tmp_path / "cache").mkdir()
    out, page = tmp_path / "b.json", tmp_path / "b.html"
    cfg = config_left_to_the_run(tmp_path, duration=0.5, output=str(out))
    r = kvtier("bench", "--config", cfg, "--html-output", page, "--submission-check")
    # the checklist's verdict on a half-second run (its duration fails), not a refusal of kvtier's own file
    assert r.returncode == 1 and "items pass" in r.stdout + r.stderr and "--duration >= 300 s" in r.stdout, r.stderr
    assert "not a valid" not in r.stderr and page.stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "flag, key",
    [("--html-output", "html_output"), ("--xlsx-output", "xlsx_output"), ("--csv-output", "csv_output")],
)
def test_an_output_that_cannot_be_written_at_the_end_exits_1_in_one_line(tmp_path, capsys, flag, key, sample_doc):
    from replay.synthetic.config import BenchConfig
    from replay.synthetic.finish import finish

    (tmp_path / "a-file").write_text("")
    gone = tmp_path / "a-file" / f"out.{key}"  # its directory became a file during the run
    other = tmp_path / "other.csv" if key != "csv_output" else tmp_path / "other.xlsx"
    other_key = "csv_output" if key != "csv_output" else "xlsx_output"
    cfg = BenchConfig.model_validate({key: str(gone), other_key: str(other), "progress": False})
    out = tmp_path / "r.json"
    code = finish(copy.deepcopy(sample_doc), cfg, str(out))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and out.exists() and other.exists()  # the results and the other output still written
    assert err[-1].startswith(f"kvtier bench: {flag} {gone}: not written") and str(out) in err[-1]
    assert (tmp_path / "a-file").read_text() == ""


@pytest.mark.slow
def test_a_page_the_report_cannot_draw_exits_1_and_names_why(tmp_path, capsys, sample_doc):
    from replay.synthetic.config import BenchConfig
    from replay.synthetic.finish import finish

    doc = copy.deepcopy(sample_doc)
    doc["timeline"] = [{"requests": 1}]  # a sample without its time: the report refuses it (a bug of its writer)
    cfg = BenchConfig.model_validate({"html_output": str(tmp_path / "p.html"), "progress": False})
    code = finish(doc, cfg, str(tmp_path / "r.json"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and "--html-output" in err[-1] and "the report cannot read the results" in err[-1]
    assert not (tmp_path / "p.html").exists() and (tmp_path / "r.json").exists()
