"""`kvtier replay` against the fake OpenAI server (replay/openai/fake_server.py) with known, injected delays.

The fake stands in for an inference server only where a real one cannot give known timings; the end-to-end test
(tests/e2e/test_replay_vllm.py) runs the same code against a real vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from helpers import wait_for

from deploy.stack import metric, metrics
from replay.cli import main as kvtier
from replay.common.ports import free_port
from replay.openai.client import RequestRecord, RequestSpec, send_streaming
from replay.openai.fake_server import FakeServer, FakeServerConfig


def main(argv: list[str]) -> int:
    """`kvtier replay ARGV`: through the dispatcher, which answers a refusal (exit 2, one line) and a bug."""
    return kvtier(["replay", *argv])


ROOT = Path(__file__).resolve().parents[3]


def _replay(srv_url: str, tmp_path: Path, *extra: str, name: str = "out") -> tuple[int, dict]:
    out = tmp_path / f"{name}.json"
    rc = main(["--base-url", srv_url, "--model", "fake", "--output", str(out), "--quiet", *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


def _near(measured_ms: float, injected_ms: float) -> bool:
    """A delay the server injected, as the client measured it: never less (timers sleep at least that long), and
    not much more even when a loaded machine delays the server's or the client's wake-ups."""
    return injected_ms - 1 <= measured_ms <= 1.5 * injected_ms + 10


@pytest.mark.slow
@pytest.mark.serial  # timed: a loaded client reads tokens in bursts
def test_measured_latencies_match_injected_delays(tmp_path):
    cfg = FakeServerConfig(ttft_ms=60, itl_ms=15, default_max_tokens=8)
    with FakeServer(cfg, process=True) as srv:  # its own process: its timers do not share our interpreter
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--num-requests",
            "40",
            "--request-rate",
            "40",
            "--arrival",
            "constant",
            "--input-len",
            "16",
            "--output-len",
            "8",
        )
    assert rc == 0 and s["completed"] == 40 and s["failed"] == 0
    assert _near(s["ttft_ms"]["p50"], 60), s["ttft_ms"]
    assert _near(s["itl_ms"]["p50"], 15), s["itl_ms"]
    assert _near(s["tpot_ms"]["p50"], 15), s["tpot_ms"]
    assert _near(s["e2el_ms"]["p50"], 60 + 7 * 15), s["e2el_ms"]
    assert s["itl_ms"]["count"] == 40 * 7
    assert s["total_output_tokens"] == 40 * 8  # from usage


@pytest.mark.slow
@pytest.mark.serial  # timed: a loaded client reads tokens in bursts
def test_achieved_rate_at_200_per_second(tmp_path):
    with FakeServer(FakeServerConfig(default_max_tokens=4), process=True) as srv:
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--num-requests",
            "400",
            "--request-rate",
            "200",
            "--arrival",
            "constant",
            "--input-len",
            "8",
            "--output-len",
            "4",
        )
    assert rc == 0 and s["completed"] == 400
    # The schedule is kept (a loaded machine may lose a little; benchmarks/replayer_overhead.py measures precision).
    assert abs(s["achieved_rate"] - 200) / 200 < 0.15
    assert s["send_lag_ms"]["count"] == 400 and "p99" in s["send_lag_ms"]
    # Reported, and sane; its size depends on what else runs on the machine (benchmarks/replayer_overhead.py
    # measures it).
    assert 0 <= s["send_lag_ms"]["p50"] <= s["send_lag_ms"]["p99"] < 200


@pytest.mark.slow
def test_poisson_schedule_is_seeded_and_close_to_its_rate(tmp_path):
    # The server in its own process: in-thread it shares the client's GIL, and CI saw sends fall behind (146 of 207/s).
    with FakeServer(FakeServerConfig(default_max_tokens=2), process=True) as srv:
        args = (
            "--source",
            "synthetic",
            "--num-requests",
            "80",
            "--request-rate",
            "200",
            "--seed",
            "7",
            "--input-len",
            "4",
            "--output-len",
            "2",
        )
        _, a = _replay(srv.base_url, tmp_path, *args, "--detail", str(tmp_path / "a.jsonl"), name="a")
        _, b = _replay(srv.base_url, tmp_path, *args, "--detail", str(tmp_path / "b.jsonl"), name="b")

    def sched(p):
        return [json.loads(line)["scheduled_ns"] for line in p.read_text().splitlines()]

    assert sched(tmp_path / "a.jsonl") == sched(tmp_path / "b.jsonl")
    assert a["schedule_rate"] == b["schedule_rate"]
    # 80 sends are a short window; the 2% bound is test_achieved_rate_at_200_per_second's, over 400.
    assert abs(a["achieved_rate"] - a["schedule_rate"]) / a["schedule_rate"] < 0.10


async def _one(url: str, payload: dict) -> RequestRecord:
    async with aiohttp.ClientSession() as session:
        spec = RequestSpec(0, "s", 0, url, payload)
        return await send_streaming(session, spec, RequestRecord(0, "s", 0))


def test_role_only_first_chunk_is_not_a_token():
    # the first token is due 600 ms after the role chunk: a margin a loaded machine keeps (at 40 ms, a client read
    # late under the parallel tier once saw the role chunk 39+ ms after sending)
    with FakeServer(FakeServerConfig(ttft_ms=600, itl_ms=1, role_chunk=True)) as srv:
        rec = asyncio.run(
            _one(
                srv.base_url + "/v1/chat/completions",
                {
                    "model": "f",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                },
            )
        )
    assert rec.success
    assert rec.first_byte_ns < rec.first_token_ns  # the role chunk came first,
    assert (rec.first_byte_ns - rec.sent_ns) / 1e6 < 500  # well before the first token was due
    assert rec.ttft_ms() >= 599
    assert rec.output_tokens == 3 and len(rec.chunk_ns) == 3


def test_chunk_with_several_tokens_spreads_its_gap():
    cfg = FakeServerConfig(ttft_ms=5, itl_ms=6, tokens_per_chunk=4)
    with FakeServer(cfg) as srv:
        rec = asyncio.run(
            _one(
                srv.base_url + "/v1/completions",
                {
                    "model": "f",
                    "prompt": "a b c",
                    "max_tokens": 12,
                    "stream": True,
                    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                },
            )
        )
    assert rec.success and rec.chunk_tokens == [4, 4, 4]
    gaps = list(rec.itl_ns())
    assert len(gaps) == 8  # two later chunks x four tokens each
    # Each chunk's gap is spread evenly over its 4 tokens (not one long ITL and three zeros), whatever the gap was:
    # a loaded client may read two chunks in one go, so the gaps' sizes are the server's and the machine's business.
    for c in (1, 2):
        chunk_gap = rec.chunk_ns[c] - rec.chunk_ns[c - 1]
        assert gaps[4 * (c - 1) : 4 * c] == [chunk_gap // 4] * 4, (chunk_gap, gaps)
    assert rec.tpot_ms() == pytest.approx((rec.last_chunk_ns - rec.first_token_ns) / 1e6 / 11)


def test_sse_split_events_comments_and_crlf():
    """Events split across TCP writes, ping comments, CRLF framing: all parsed; [DONE] ends the stream."""

    async def run():
        async def handler(request):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            ev = b'data: {"choices":[{"index":0,"text":"hel"}]}\r\n\r\n: ping\n\ndata: {"choices":[{"index":0,"te'
            for piece in (ev[:10], ev[10:37], ev[37:]):
                await resp.write(piece)
                await asyncio.sleep(0.005)
            await resp.write(b'xt":"lo"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\ndata: [DONE]\n\n')
            await resp.write(b'data: {"choices":[{"text":"after done"}]}\n\n')
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:
                spec = RequestSpec(0, "s", 0, f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x"})
                return await send_streaming(session, spec, RequestRecord(0, "s", 0))
        finally:
            await runner.cleanup()

    rec = asyncio.run(run())
    assert rec.success, rec.error
    assert rec.output_text == "hello" and rec.output_tokens == 2 and rec.prompt_tokens == 3
    assert len(rec.chunk_ns) == 2


def test_faults_are_recorded_not_fatal(tmp_path):
    cfg = FakeServerConfig(default_max_tokens=6, fault_every={"malformed_sse": 4, "disconnect": 5, "http_500": 7})
    with FakeServer(cfg) as srv:
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--num-requests",
            "30",
            "--input-len",
            "4",
            "--output-len",
            "6",
            "--max-concurrency",
            "4",
            "--detail",
            str(tmp_path / "d.jsonl"),
        )
    assert rc == 0 and s["aborted"] is None
    errs = s["errors_by_kind"]
    assert errs["malformed_sse"] >= 5 and errs["disconnected"] >= 4 and errs["http_500"] >= 3
    assert s["completed"] + s["failed"] == 30 and s["completed"] >= 14
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert {r["error_kind"] for r in rows if not r["success"]} == {"malformed_sse", "disconnected", "http_500"}


def test_dead_server_ends_run_early_with_partial_results(tmp_path):
    port = free_port()  # nothing listens there
    rc, s = _replay(
        f"http://127.0.0.1:{port}",
        tmp_path,
        "--source",
        "synthetic",
        "--num-requests",
        "50",
        "--request-rate",
        "100",
        "--input-len",
        "4",
        "--output-len",
        "2",
    )
    assert rc == 3
    assert s["aborted"].startswith("server unreachable") and s["failed"] >= 5
    assert s["errors_by_kind"]["connection"] >= 5
    assert s["prompt_text_from"].startswith("estimate")  # no /tokenize either: the fallback is reported


def test_multi_turn_sends_server_answers_in_history(tmp_path):
    data = [
        {
            "id": "c1",
            "conversations": [
                {"from": "human", "value": "first question"},
                {"from": "gpt", "value": "DATASET ANSWER ONE"},
                {"from": "human", "value": "second question"},
                {"from": "gpt", "value": "DATASET ANSWER TWO"},
            ],
        }
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(data))
    with FakeServer(FakeServerConfig(word="srv")) as srv:
        rc, s = _replay(
            srv.base_url, tmp_path, "--source", "sharegpt", "--dataset-path", str(path), "--max-tokens", "3"
        )
        bodies = srv.recent_bodies
    assert rc == 0 and s["completed"] == 2
    second = bodies[-1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == " srv0 srv1 srv2"  # the server's answer, not the dataset's
    assert bodies[-1]["max_tokens"] == 3 and bodies[-1]["stream"] is True
    assert bodies[-1]["stream_options"]["include_usage"] is True


@pytest.mark.slow
def test_long_session_rounds_table(tmp_path):
    with FakeServer(FakeServerConfig(block_size=4)) as srv:
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--rounds",
            "4",
            "--concurrency",
            "3",
            "--output-len",
            "5",
            "--input-len",
            "12",
            "--block-size",
            "4",
            "--metrics-url",
            srv.base_url + "/metrics",
            "--csv",
            str(tmp_path / "r.csv"),
            "--plots",
            str(tmp_path / "plots"),
        )
    assert rc == 0 and s["completed"] == 12
    rounds = s["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    assert rounds[0]["hit_rate"] == 0.0 and rounds[0]["ideal_hit_rate"] == 0.0
    hits = [r["hit_rate"] for r in rounds]
    assert hits[1] > 0.3 and hits == sorted(hits)  # history reuse grows round by round
    for r in rounds[1:]:
        assert 0 < r["ideal_hit_rate"] <= 1 and r["recomputed_tokens_per_request"] > 0 and r["wall_s"] > 0
    assert (tmp_path / "r.rounds.csv").exists()
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"latency_cdf.png", "timeline.png", "rounds.png"}


def test_burstgpt_trace_speedup_and_server_tokenizer(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "0,a,1,ChatGPT,20,3,23,Conversation log\n"
        "1,b,1,ChatGPT,30,2,32,Conversation log\n"
        "2,a,1,ChatGPT,40,0,40,Conversation log\n"
        "3,c,1,ChatGPT,25,4,29,Conversation log\n"
    )
    with FakeServer() as srv:
        t = time.monotonic()
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "burstgpt",
            "--trace-path",
            str(trace),
            "--trace-speedup",
            "10",
            "--endpoint",
            "completions",
            "--detail",
            str(tmp_path / "d.jsonl"),
        )
        took = time.monotonic() - t
    assert rc == 0 and s["completed"] == 3 and s["load_report"]["skipped"] == {"failed_request": 1}
    assert s["prompt_text_from"] == "server:/tokenize"
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert [r["max_tokens"] for r in rows] == [3, 2, 4]
    # the fake tokenizer splits on spaces and the completion prompt adds "User:"/"Assistant:" around it
    assert [r["target_prompt_tokens"] for r in rows] == [20, 30, 25]
    assert all(t <= r["prompt_tokens"] <= t + 3 for t, r in zip((20, 30, 25), rows))
    offsets_ms = [r["scheduled_ns"] / 1e6 for r in rows]
    assert offsets_ms[2] - offsets_ms[0] == pytest.approx(300, abs=1)  # 3 s of trace at 10x
    assert took < 5


@pytest.mark.slow
def test_closed_loop_users_and_goodput(tmp_path):
    with FakeServer(FakeServerConfig(ttft_ms=10, itl_ms=1)) as srv:
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--users",
            "2",
            "--num-requests",
            "8",
            "--turns",
            "2",
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--think-time-ms",
            "5",
            "--slo",
            "ttft_ms=5,tpot_ms=100",
            "--percentiles",
            "50,99.9",
        )
    assert rc == 0 and s["completed"] == 8 and s["pacing"] == "closed"
    assert {"p50", "p999"} <= set(s["ttft_ms"]) and "p90" not in s["ttft_ms"]
    assert s["goodput"]["good_requests"] == 0  # every TTFT is >= 10 ms, above the 5 ms SLO


@pytest.mark.slow
def test_warmup_excluded(tmp_path):
    with FakeServer() as srv:
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--num-requests",
            "5",
            "--warmup",
            "3",
            "--input-len",
            "4",
            "--output-len",
            "2",
        )
        seen = srv.requests_seen
    assert rc == 0 and s["completed"] == 5 and s["warmup_requests"] == 3 and seen == 8


@pytest.mark.parametrize(
    "args, message",
    [
        (["--base-url", "http://x", "--model", "m"], "missing --output"),
        (["--base-url", "x", "--model", "m", "--output", "o.json"], "--base-url must start with"),
        (["--base-url", "http://x", "--model", "m", "--output", "o.json", "--slo", "ttft=5"], "--slo"),
        (["--base-url", "http://x", "--model", "m", "--output", "o.json", "--source", "sharegpt"], "--dataset-path"),
        (["--base-url", "http://x", "--model", "m", "--output", "o.json", "--rounds", "3"], "--concurrency"),
        (
            [
                "--base-url",
                "http://x",
                "--model",
                "m",
                "--output",
                "o.json",
                "--source",
                "sharegpt",
                "--dataset-path",
                "/nonexistent.json",
            ],
            "not found",
        ),
    ],
)
def test_user_errors_are_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_flag_value_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--base-url", "http://x", "--model", "m", "--output", "o.json", "--request-rate", "fast"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--request-rate" in err


def test_help_has_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "--rounds" in out and "--trace-speedup" in out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_partial_results(tmp_path, sig):
    """SIGINT and SIGTERM stop a replay alike: partial results, exit 128 + signal."""
    # Requests take 4 s each, so at Ctrl-C many are in flight: they get the 2 s grace, then are cancelled.
    with FakeServer(FakeServerConfig(ttft_ms=5, itl_ms=200, default_max_tokens=20), process=True) as srv:
        out = tmp_path / "p.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "replay.openai.cli",
                "--base-url",
                srv.base_url,
                "--model",
                "f",
                "--source",
                "synthetic",
                "--num-requests",
                "10000",
                "--request-rate",
                "50",
                "--input-len",
                "4",
                "--output-len",
                "20",
                "--output",
                str(out),
                "--quiet",
            ],
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        wait_for(lambda: srv_requests(srv.base_url) >= 10, timeout_s=30, what="10 requests at the server")
        t_int = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t_int
    assert proc.returncode == 128 + sig, err
    assert took < 8, took  # grace (2 s) plus writing results, not the 4 s requests' remaining time
    s = json.loads(out.read_text())
    assert s["aborted"].startswith(f"interrupted ({sig.name})") and s["errors_by_kind"]["cancelled"] >= 10
    assert oct(out.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # results are 0644 under the usual umask
    assert s["completed"] == 0 and s["not_sent"] == 0
    assert b"Traceback" not in err


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("flag", ["--output", "--detail", "--csv"])
def test_unwritable_output_is_refused_before_any_request(flag, tmp_path, capsys):
    """An output that cannot be written is a usage error before the run, not a lost run afterwards."""
    with FakeServer(FakeServerConfig()) as srv:
        args = [
            "--base-url",
            srv.base_url,
            "--model",
            "f",
            "--source",
            "synthetic",
            "--num-requests",
            "3",
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--quiet",
            "--output",
            str(tmp_path / "o.json"),
        ]
        rc = main(args + [flag, str(tmp_path)])  # a directory where a file is wanted
        assert rc == 2 and srv_requests(srv.base_url) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"kvtier replay: {flag} ") and "is a directory" in err and "\n" not in err
    assert not (tmp_path / "o.json").exists()


def test_results_go_to_the_fallback_when_the_output_dir_vanishes(tmp_path, monkeypatch, capsys):
    """The run finished but --output's directory was removed meanwhile: the results land under results/ instead."""
    import shutil

    monkeypatch.chdir(tmp_path)
    gone = tmp_path / "gone"
    gone.mkdir()
    with FakeServer(FakeServerConfig()) as srv:
        import replay.openai.cli as cli_mod

        real = cli_mod.write_run_outputs

        def remove_then_write(cfg, state, meta):
            shutil.rmtree(gone)
            (tmp_path / "gone").write_text("now a file")  # the directory is now a file: nothing can go under it
            return real(cfg, state, meta)

        monkeypatch.setattr(cli_mod, "write_run_outputs", remove_then_write)
        rc = main(
            [
                "--base-url",
                srv.base_url,
                "--model",
                "f",
                "--source",
                "synthetic",
                "--num-requests",
                "2",
                "--input-len",
                "4",
                "--output-len",
                "4",
                "--quiet",
                "--output",
                str(gone / "r.json"),
            ]
        )
    err = capsys.readouterr().err
    assert rc == 0, err
    saved = tmp_path / "results" / "r.json"
    assert "results written to results/r.json instead" in err
    assert json.loads(saved.read_text())["completed"] == 2


def srv_requests(base_url: str) -> int:
    """Requests the fake server received (its vllm:request_success_total, every series summed)."""
    return int(metric(metrics(base_url + "/metrics"), "vllm:request_success_total"))


@pytest.mark.slow
def test_duration_closes_the_window_for_closed_loop_users(tmp_path):
    import time

    with FakeServer(FakeServerConfig(ttft_ms=5, itl_ms=5, default_max_tokens=4)) as srv:
        t0 = time.monotonic()
        rc, s = _replay(
            srv.base_url,
            tmp_path,
            "--source",
            "synthetic",
            "--users",
            "2",
            "--num-requests",
            "100000",
            "--input-len",
            "4",
            "--output-len",
            "4",
            "--duration",
            "1.5",
        )
        took = time.monotonic() - t0
    # Ended by the window (not by the 100k-request budget), and that is a normal end, not an abort.
    assert rc == 0 and s["window_closed"] and not s["aborted"]
    assert 10 < s["completed"] < 100000 and took < 1.5 + 2 + 8
