"""Every flag of `kvtier replay` changes what the run does: one probe per flag, each reading the flag's effect on the
requests the fake server received (replay/openai/fake_server.py records their bodies and headers) or on the summary,
and a check that no flag of `kvtier replay --help` is left without one (as tests/replay/test_config_keys.py does for
`kvtier bench`). The CLI is driven through `main([...])` only, so the probes do not depend on how it loads its options.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from helpers import QuietHTTPServer

from replay.cli import main as kvtier
from replay.openai.fake_server import FakeServer, FakeServerConfig


def main(argv: list[str]) -> int:
    """`kvtier replay ARGV`: through the dispatcher, which answers a refusal (exit 2, one line) and a bug."""
    return kvtier(["replay", *argv])


SMALL = ("--source", "synthetic", "--input-len", "8", "--output-len", "4")


class Ctx:
    """What a probe gets: a temporary directory, captured output, and monkeypatch for the environment."""

    def __init__(self, tmp: Path, capsys, monkeypatch) -> None:
        self.tmp, self.capsys, self.monkeypatch = tmp, capsys, monkeypatch


def replay(srv: FakeServer, c: Ctx, *args: str, name: str = "out", quiet: bool = True) -> tuple[int, dict]:
    out = c.tmp / f"{name}.json"
    argv = ["--base-url", srv.base_url, "--model", "fake", "--output", str(out), *args]
    rc = main(argv + (["--quiet"] if quiet else []))
    return rc, (json.loads(out.read_text()) if out.exists() else {})


def detail(c: Ctx, srv: FakeServer, *args: str) -> list[dict]:
    """The per-request records of a run (its --detail file), in request order."""
    path = c.tmp / "d.jsonl"
    rc, _ = replay(srv, c, *args, "--detail", str(path))
    assert rc == 0
    return [json.loads(line) for line in path.read_text().splitlines()]


def prompt(body: dict) -> str:
    return body["messages"][-1]["content"] if "messages" in body else body["prompt"]


def sharegpt(c: Ctx, name: str, turns: list[tuple[str, str]]) -> str:
    conv = [m for q, a in turns for m in ({"from": "human", "value": q}, {"from": "gpt", "value": a})]
    path = c.tmp / name
    path.write_text(json.dumps([{"id": name, "conversations": conv}]))
    return str(path)


def max_overlap(rows: list[dict]) -> int:
    """The most requests in flight at once, from the records' send and last-chunk times."""
    events = sorted([(r["sent_ns"], 1) for r in rows] + [(r["last_chunk_ns"], -1) for r in rows])
    depth = most = 0
    for _, step in events:
        depth += step
        most = max(most, depth)
    return most


PROBES: dict = {}


def probe(flag: str):
    def register(fn):
        PROBES[flag] = fn
        return fn

    return register


# ---- server ----------------------------------------------------------------------------------------------------------
@probe("--base-url")
def p_base_url(c: Ctx):
    with FakeServer() as srv:
        out = c.tmp / "o.json"
        # the OpenAI SDK's form, with /v1, reaches the same server
        rc = main(["--base-url", srv.base_url + "/v1", "--model", "m", "--output", str(out), "--quiet", *SMALL])
        rc2 = main(["--base-url", srv.base_url, "--model", "m", "--output", str(out), "--quiet", *SMALL])
        assert rc == rc2 == 0 and srv.requests_seen == 200  # 100 requests each (the default --num-requests)
    assert json.loads(out.read_text())["base_url"] == srv.base_url


@probe("--model")
def p_model(c: Ctx):
    with FakeServer() as srv:
        rc, s = replay(srv, c, *SMALL, "--num-requests", "3", "--model", "my-model")
        assert {b["model"] for b in srv.recent_bodies} == {"my-model"}
    assert rc == 0 and s["model"] == "my-model"


@probe("--endpoint")
def p_endpoint(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "2", "--endpoint", "completions")
        replay(srv, c, *SMALL, "--num-requests", "2")
        bodies = srv.recent_bodies
    assert all("prompt" in b and "messages" not in b for b in bodies[:2])
    assert all("messages" in b and "prompt" not in b for b in bodies[2:])  # chat is the default


@probe("--api-key-env")
def p_api_key_env(c: Ctx):
    c.monkeypatch.setenv("OPENAI_API_KEY", "default-key")
    c.monkeypatch.setenv("MY_REPLAY_KEY", "sekret")
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "2", "--api-key-env", "MY_REPLAY_KEY")
        replay(srv, c, *SMALL, "--num-requests", "2")
        auth = [h.get("Authorization") for h in srv.recent_headers]
    assert auth == ["Bearer sekret"] * 2 + ["Bearer default-key"] * 2


@probe("--request-timeout")
def p_request_timeout(c: Ctx):
    # Every response hangs 20 s before its first byte: a 0.5 s timeout fails each request long before that.
    with FakeServer(FakeServerConfig(fault_every={"hang": 1}, hang_s=20)) as srv:
        t0 = time.monotonic()
        rc, s = replay(srv, c, *SMALL, "--num-requests", "2", "--request-timeout", "0.5")
        took = time.monotonic() - t0
    assert rc == 1 and s["completed"] == 0 and s["errors_by_kind"] == {"timeout": 2}
    assert took < 15


@probe("--request-max-time")
def p_request_max_time(c: Ctx):
    # Tokens every 0.4 s never leave the stream idle for the 60 s --request-timeout; the whole request may take 1 s.
    with FakeServer(FakeServerConfig(itl_ms=400, default_max_tokens=10)) as srv:
        t0 = time.monotonic()
        rc, s = replay(
            srv,
            c,
            *SMALL,
            "--num-requests",
            "2",
            "--max-tokens",
            "10",
            "--request-max-time",
            "1",
            "--request-timeout",
            "60",
            "--detail",
            str(c.tmp / "d.jsonl"),
        )
        took = time.monotonic() - t0
    rows = [json.loads(line) for line in (c.tmp / "d.jsonl").read_text().splitlines()]
    assert rc == 1 and s["errors_by_kind"] == {"timeout": 2} and took < 15
    assert all("--request-max-time" in r["error"] for r in rows), rows


@probe("--no-continuous-usage")
def p_no_continuous_usage(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "2", "--no-continuous-usage")
        replay(srv, c, *SMALL, "--num-requests", "2")
        opts = [b["stream_options"] for b in srv.recent_bodies]
    assert not any(o.get("continuous_usage_stats") for o in opts[:2])
    assert all(o["continuous_usage_stats"] for o in opts[2:]) and all(o["include_usage"] for o in opts)


# ---- workload --------------------------------------------------------------------------------------------------------
@probe("--source")
def p_source(c: Ctx):
    path = sharegpt(c, "sg.json", [("zebra question", "an answer")])
    with FakeServer() as srv:
        rc, s = replay(srv, c, "--source", "sharegpt", "--dataset-path", path)
        bodies = srv.recent_bodies
    assert rc == 0 and s["source"] == "sharegpt" and [prompt(b) for b in bodies] == ["zebra question"]


@probe("--dataset-path")
def p_dataset_path(c: Ctx):
    a = sharegpt(c, "a.json", [("alpha one", "x"), ("alpha two", "y")])
    b = sharegpt(c, "b.json", [("beta one", "x")])
    with FakeServer() as srv:
        replay(srv, c, "--source", "sharegpt", "--dataset-path", a, "--max-tokens", "2")
        replay(srv, c, "--source", "sharegpt", "--dataset-path", b, "--max-tokens", "2")
        sent = [prompt(b) for b in srv.recent_bodies]
    assert sent == ["alpha one", "alpha two", "beta one"]


def burst_trace(c: Ctx) -> str:
    path = c.tmp / "t.csv"
    path.write_text(
        "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "0,a,1,ChatGPT,20,3,23,Conversation log\n"
        "1,b,1,ChatGPT,30,5,35,Conversation log\n"
        "2,c,1,ChatGPT,25,7,32,Conversation log\n"
    )
    return str(path)


@probe("--trace-path")
def p_trace_path(c: Ctx):
    with FakeServer() as srv:
        rc, _ = replay(srv, c, "--source", "burstgpt", "--trace-path", burst_trace(c), "--trace-speedup", "20")
        bodies = srv.recent_bodies
    assert rc == 0 and [b["max_tokens"] for b in bodies] == [3, 5, 7]  # the trace's response lengths


@probe("--max-prompt-tokens")
def p_max_prompt_tokens(c: Ctx):
    args = ("--source", "burstgpt", "--trace-path", burst_trace(c), "--trace-speedup", "20")
    with FakeServer() as srv:
        rc, s = replay(srv, c, *args, "--max-prompt-tokens", "24")
        bodies = srv.recent_bodies
    # rows of 20+3, 30+5 and 25+7 tokens: the two over 24 are cut (prompt first, then the answer) and counted
    assert rc == 0 and [(len(prompt(b).split()), b["max_tokens"]) for b in bodies] == [(20, 3), (24, 1), (24, 1)]
    assert s["load_report"]["truncated"] == {"over_max_context_tokens": 2}
    rc, _ = replay(FakeServer(), c, *SMALL, "--input-len", "30", "--max-prompt-tokens", "24")  # refused: never started
    assert rc == 2 and "over --max-prompt-tokens 24" in c.capsys.readouterr().err


@probe("--trace-block-tokens")
def p_trace_block_tokens(c: Ctx):
    trace = c.tmp / "mc.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [7, 8]}\n'
        '{"timestamp": 5, "input_length": 700, "output_length": 4, "hash_ids": [7, 9]}\n'
    )

    def words(block: str) -> list[int]:
        with FakeServer() as srv:
            rc, _ = replay(srv, c, "--source", "mooncake", "--dataset-path", str(trace), "--trace-block-tokens", block)
            bodies = srv.recent_bodies
        assert rc == 0
        return [len(prompt(b).split()) for b in bodies]

    # the trace's 512-token blocks as 16 or 8 tokens: lengths scaled with them, block counts kept
    assert words("16") == [32, 22] and words("8") == [16, 11]


@probe("--trace-speedup")
def p_trace_speedup(c: Ctx):
    def offsets_ms(speedup):
        with FakeServer() as srv:
            rows = detail(c, srv, "--source", "burstgpt", "--trace-path", burst_trace(c), "--trace-speedup", speedup)
        return [round(r["scheduled_ns"] / 1e6) for r in rows]

    assert offsets_ms("10") == [0, 100, 200] and offsets_ms("20") == [0, 50, 100]


def weka_calls(c: Ctx, requests: list[tuple[float, float | None]]) -> str:
    """A Weka conversation of calls (t, think_time) of 100, 101, ... tokens, each recorded with no api_time."""
    calls = [{"type": "n", "t": t, "in": 100 + k, "out": 2, "hash_ids": [k]} for k, (t, _) in enumerate(requests)]
    for call, (_, think) in zip(calls, requests):
        if think is not None:
            call["think_time"] = think
    path = c.tmp / "w.json"
    path.write_text(json.dumps({"id": "w", "block_size": 64, "hash_id_scope": "local", "requests": calls}))
    return str(path)


@probe("--trace-timing")
def p_trace_timing(c: Ctx):
    trace = weka_calls(c, [(0, None), (0.05, 0.05)])

    def second_ms(timing: str) -> int:
        with FakeServer(FakeServerConfig(ttft_ms=300)) as srv:  # slower than the trace recorded
            rows = detail(c, srv, "--source", "weka", "--dataset-path", trace, "--trace-timing", timing)
        return round((rows[1]["scheduled_ns"] - rows[0]["scheduled_ns"]) / 1e6)

    # timestamps: at its time whatever the server; think: its pause after the first call's (slow) answer ended
    assert second_ms("timestamps") == 50 and second_ms("think") >= 300 + 50


@probe("--max-idle-s")
def p_max_idle_s(c: Ctx):
    trace = weka_calls(c, [(0, None), (600, 600)])

    def gap_s(cap: str) -> float:
        with FakeServer() as srv:
            rows = detail(c, srv, "--source", "weka", "--dataset-path", trace, "--trace-timing", "think",
                          "--max-idle-s", cap)  # fmt: skip
        return (rows[1]["sent_ns"] - rows[0]["last_chunk_ns"]) / 1e9

    assert 0.1 <= gap_s("0.1") < 0.6 <= gap_s("0.6") < 10


@probe("--num-requests")
def p_num_requests(c: Ctx):
    with FakeServer() as srv:
        rc, s = replay(srv, c, *SMALL, "--num-requests", "7")
        assert srv.requests_seen == 7
    assert rc == 0 and s["completed"] == 7


@probe("--duration")
def p_duration(c: Ctx):
    # Closed-loop users with a budget of 100,000 requests of ~20 ms: the 1 s window ends the run, not the budget.
    with FakeServer(FakeServerConfig(ttft_ms=5, itl_ms=5)) as srv:
        t0 = time.monotonic()
        rc, s = replay(srv, c, *SMALL, "--users", "2", "--num-requests", "100000", "--duration", "1")
        took = time.monotonic() - t0
    assert rc == 0 and s["window_closed"] and not s["aborted"] and 0 < s["completed"] < 100000 and took < 1 + 2 + 8


@probe("--input-len")
def p_input_len(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, "--source", "synthetic", "--num-requests", "3", "--input-len", "32", "--output-len", "2")
        # the fake tokenizer counts whitespace-separated words: the prompt was sized to it
        assert [len(prompt(b).split()) for b in srv.recent_bodies] == [32] * 3


def hit_rate_run(c: Ctx, *args: str) -> dict:
    """--target-hit-rate 0.5 against a server with a 20,000-token prefix cache, 512-token prompts."""
    with FakeServer(FakeServerConfig(block_size=16, cache_tokens=20_000)) as srv:
        rc, s = replay(srv, c, "--endpoint", "completions", "--input-len", "512", "--users", "2", "--max-tokens", "1",
                       "--metrics-url", srv.base_url + "/metrics", *args)  # fmt: skip
    assert rc == 0
    return s["target_hit_rate"]


@probe("--target-hit-rate")
def p_target_hit_rate(c: Ctx):
    low, high = (hit_rate_run(c, "--target-hit-rate", t, "--cache-tokens", "20000") for t in ("0.2", "0.7"))
    assert low["measured_hit_rate"] == pytest.approx(0.2, abs=0.03)
    assert high["measured_hit_rate"] == pytest.approx(0.7, abs=0.03)


@probe("--cache-tokens")
def p_cache_tokens(c: Ctx):
    # told the server's cache: the target; told twice it, the sessions' cycle outgrows the cache and misses
    fits, over = (hit_rate_run(c, "--target-hit-rate", "0.5", "--cache-tokens", n) for n in ("20000", "40000"))
    assert over["sessions"] > fits["sessions"] and over["cache_tokens"] == 40_000
    assert fits["measured_hit_rate"] == pytest.approx(0.5, abs=0.03) and over["measured_hit_rate"] < 0.1


@probe("--output-len")
def p_output_len(c: Ctx):
    with FakeServer() as srv:
        rc, s = replay(srv, c, "--source", "synthetic", "--num-requests", "3", "--input-len", "4", "--output-len", "9")
        assert [b["max_tokens"] for b in srv.recent_bodies] == [9] * 3
    assert rc == 0 and s["total_output_tokens"] == 27


@probe("--range-ratio")
def p_range_ratio(c: Ctx):
    args = ("--source", "synthetic", "--num-requests", "20", "--input-len", "40", "--output-len", "10")
    with FakeServer() as srv:
        replay(srv, c, *args, "--range-ratio", "0.5")
        replay(srv, c, *args)
        bodies = srv.recent_bodies
    ranged, fixed = bodies[:20], bodies[20:]
    lens = [len(prompt(b).split()) for b in ranged]
    assert len(set(lens)) > 3 and min(lens) >= 20 and max(lens) <= 60
    assert len({b["max_tokens"] for b in ranged}) > 1 and all(5 <= b["max_tokens"] <= 15 for b in ranged)
    assert {len(prompt(b).split()) for b in fixed} == {40} and {b["max_tokens"] for b in fixed} == {10}


def first_words(bodies: list[dict], n: int) -> set[str]:
    return {" ".join(prompt(b).split()[:n]) for b in bodies}


@probe("--prefix-len")
def p_prefix_len(c: Ctx):
    args = ("--source", "synthetic", "--num-requests", "6", "--input-len", "8", "--output-len", "2")
    with FakeServer() as srv:
        replay(srv, c, *args, "--prefix-len", "16")
        replay(srv, c, *args)
        bodies = srv.recent_bodies
    assert len(first_words(bodies[:6], 16)) == 1 and {len(prompt(b).split()) for b in bodies[:6]} == {24}
    assert len(first_words(bodies[6:], 8)) == 6  # no shared prefix: every prompt starts differently


@probe("--prefix-groups")
def p_prefix_groups(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "8", "--prefix-len", "16", "--prefix-groups", "3")
        assert len(first_words(srv.recent_bodies, 16)) == 3


@probe("--turns")
def p_turns(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "6", "--turns", "3", "--max-concurrency", "1")
        sessions: dict[str, list[int]] = {}
        for b, h in zip(srv.recent_bodies, srv.recent_headers):
            sessions.setdefault(h["X-Session-ID"], []).append(len(b["messages"]))
    assert list(sessions.values()) == [[1, 3, 5]] * 2  # two sessions of three turns, each with its history


@probe("--max-tokens")
def p_max_tokens(c: Ctx):
    path = sharegpt(c, "sg.json", [("q one", "a b c d e f g h"), ("q two", "a b c d e f g h i j k l")])
    with FakeServer() as srv:
        replay(srv, c, "--source", "sharegpt", "--dataset-path", path, "--max-tokens", "5")
        replay(srv, c, "--source", "sharegpt", "--dataset-path", path)
        sent = [b["max_tokens"] for b in srv.recent_bodies]
    assert sent[:2] == [5, 5] and sent[2] < sent[3]  # by default, the dataset's answer lengths (8 and 12 words)


@probe("--max-tokens-cap")
def p_max_tokens_cap(c: Ctx):
    path = sharegpt(c, "sg.json", [("question", " ".join(["word"] * 200))])
    with FakeServer() as srv:
        replay(srv, c, "--source", "sharegpt", "--dataset-path", path, "--max-tokens-cap", "10")
        replay(srv, c, "--source", "sharegpt", "--dataset-path", path)
        sent = [b["max_tokens"] for b in srv.recent_bodies]
    assert sent[0] == 10 and sent[1] > 10


@probe("--ignore-eos")
def p_ignore_eos(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "2", "--ignore-eos")
        replay(srv, c, *SMALL, "--num-requests", "2")
        flags = [b.get("ignore_eos", False) for b in srv.recent_bodies]
    assert flags == [True, True, False, False]


# ---- arrivals --------------------------------------------------------------------------------------------------------
def gaps_ms(rows: list[dict]) -> list[float]:
    t = sorted(r["scheduled_ns"] / 1e6 for r in rows)
    return [b - a for a, b in itertools.pairwise(t)]


@probe("--request-rate")
def p_request_rate(c: Ctx):
    with FakeServer() as srv:
        rows = detail(c, srv, *SMALL, "--num-requests", "5", "--request-rate", "20", "--arrival", "constant")
    assert gaps_ms(rows) == pytest.approx([50] * 4, abs=0.01)  # the schedule: one every 1/20 s


@probe("--arrival")
def p_arrival(c: Ctx):
    args = (*SMALL, "--num-requests", "20", "--request-rate", "200")
    with FakeServer() as srv:
        const = gaps_ms(detail(c, srv, *args, "--arrival", "constant"))
        poisson = gaps_ms(detail(c, srv, *args, "--arrival", "poisson"))
    assert max(const) - min(const) < 0.01 and max(poisson) - min(poisson) > 2


@probe("--burstiness")
def p_burstiness(c: Ctx):
    # gamma gaps with shape k have a coefficient of variation 1/sqrt(k): 2.2 at 0.2, 0.45 at 5
    def cv(burstiness):
        with FakeServer() as srv:
            rows = detail(c, srv, *SMALL, "--num-requests", "200", "--request-rate", "1000", "--burstiness", burstiness)
        g = gaps_ms(rows)
        return statistics.pstdev(g) / statistics.mean(g)

    assert cv("0.2") > 1.3 and cv("5") < 0.7


@probe("--max-concurrency")
def p_max_concurrency(c: Ctx):
    with FakeServer(FakeServerConfig(ttft_ms=30)) as srv:
        one = detail(c, srv, *SMALL, "--num-requests", "4", "--max-concurrency", "1")
        free = detail(c, srv, *SMALL, "--num-requests", "4")
    assert max_overlap(one) == 1 and max_overlap(free) == 4  # all at once without it (rate inf)


@probe("--users")
def p_users(c: Ctx):
    with FakeServer(FakeServerConfig(ttft_ms=30)) as srv:
        path = c.tmp / "d.jsonl"
        rc, s = replay(srv, c, *SMALL, "--num-requests", "8", "--users", "2", "--detail", str(path))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rc == 0 and s["pacing"] == "closed" and s["completed"] == 8 and max_overlap(rows) == 2


@probe("--think-time-ms")
def p_think_time_ms(c: Ctx):
    def pause_ms(*extra):
        with FakeServer() as srv:
            rows = detail(c, srv, *SMALL, "--num-requests", "2", "--turns", "2", *extra)
        first, second = sorted(rows, key=lambda r: r["turn"])
        return (second["sent_ns"] - first["last_chunk_ns"]) / 1e6

    assert pause_ms("--think-time-ms", "300") >= 300 > 100 > pause_ms()


@probe("--rounds")
def p_rounds(c: Ctx):
    with FakeServer() as srv:
        rc, s = replay(srv, c, *SMALL, "--rounds", "3", "--concurrency", "2")
        lens = sorted(len(b["messages"]) for b in srv.recent_bodies)
    assert rc == 0 and s["pacing"] == "rounds" and [r["round"] for r in s["rounds"]] == [1, 2, 3]
    assert lens == [1, 1, 3, 3, 5, 5]  # each round sends the session's history so far


@probe("--concurrency")
def p_concurrency(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--rounds", "2", "--concurrency", "3")
        assert len({h["X-Session-ID"] for h in srv.recent_headers}) == 3 and srv.requests_seen == 6


@probe("--warmup")
def p_warmup(c: Ctx):
    with FakeServer() as srv:
        rc, s = replay(srv, c, *SMALL, "--num-requests", "4", "--warmup", "3")
        assert srv.requests_seen == 7
    assert rc == 0 and s["completed"] == 4 and s["warmup_requests"] == 3


@probe("--seed")
def p_seed(c: Ctx):
    def prompts(seed):
        with FakeServer() as srv:
            replay(srv, c, *SMALL, "--num-requests", "3", "--max-concurrency", "1", "--seed", seed)
            return [prompt(b) for b in srv.recent_bodies]

    assert prompts("1") == prompts("1") != prompts("2")


# ---- metrics and outputs ---------------------------------------------------------------------------------------------
@probe("--metrics-url")
def p_metrics_url(c: Ctx):
    with FakeServer() as srv:
        _, with_metrics = replay(srv, c, *SMALL, "--num-requests", "3", "--metrics-url", srv.base_url + "/metrics")
        assert srv.metrics_scrapes >= 2  # before and after the run
        _, without = replay(srv, c, *SMALL, "--num-requests", "3")
    assert with_metrics["server_metrics"]["prefix_cache_queries"] > 0 and not without.get("server_metrics")


@probe("--metrics-interval")
def p_metrics_interval(c: Ctx):
    def scrapes(interval):
        with FakeServer(FakeServerConfig(ttft_ms=5)) as srv:
            args = (*SMALL, "--users", "1", "--num-requests", "100000", "--duration", "1")
            replay(srv, c, *args, "--metrics-url", srv.base_url + "/metrics", "--metrics-interval", interval)
            return srv.metrics_scrapes

    assert scrapes("0.1") >= 6 and scrapes("30") <= 3  # every 0.1 s over 1 s; else only before and after


class CounterServer:
    """A /metrics endpoint whose counters grow by fixed steps at each scrape (what --kv-bytes-* read)."""

    def __init__(self, steps: dict[str, float]) -> None:
        self.steps, self.scrapes = steps, 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.scrapes += 1
                text = "".join(f"{name} {step * outer.scrapes}\n" for name, step in outer.steps.items())
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = QuietHTTPServer(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def __enter__(self) -> CounterServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@probe("--kv-bytes-per-token")
def p_kv_bytes_per_token(c: Ctx):
    with FakeServer() as srv, CounterServer({"lmcache:num_stored_tokens": 100}) as m:
        args = (*SMALL, "--num-requests", "2", "--metrics-url", m.url)
        _, s = replay(srv, c, *args, "--kv-bytes-per-token", "1000")
        _, without = replay(srv, c, *args)
    assert s["server_metrics"]["lmcache_stored_tokens"] == 100  # one step between the two scrapes
    assert (
        s["server_metrics"]["kv_written_bytes"] == 100 * 1000 and without["server_metrics"]["kv_written_bytes"] is None
    )


@probe("--kv-bytes-metric")
def p_kv_bytes_metric(c: Ctx):
    with FakeServer() as srv, CounterServer({"my_tier_bytes_total": 4096}) as m:
        args = (*SMALL, "--num-requests", "2", "--metrics-url", m.url)
        _, s = replay(srv, c, *args, "--kv-bytes-metric", "my_tier_bytes_total")
        _, without = replay(srv, c, *args)
    assert s["server_metrics"]["kv_written_bytes"] == 4096
    assert "my_tier_bytes_total" in s["server_metrics"]["kv_written_bytes_source"]
    assert without["server_metrics"]["kv_written_bytes"] is None  # not one of the names read by default


@probe("--block-size")
def p_block_size(c: Ctx):
    # Round 2 resends round 1's ~13-token history: with 4-token blocks most of it is a hit, with 1000 none is.
    def ideal(block):
        with FakeServer() as srv:
            _, s = replay(srv, c, *SMALL, "--rounds", "2", "--concurrency", "1", "--block-size", block)
        return s["rounds"][1]["ideal_hit_rate"]

    assert ideal("4") > 0.3 and ideal("1000") == 0


@probe("--slo")
def p_slo(c: Ctx):
    with FakeServer(FakeServerConfig(ttft_ms=20)) as srv:
        _, strict = replay(srv, c, *SMALL, "--num-requests", "4", "--slo", "ttft_ms=5")
        _, loose = replay(srv, c, *SMALL, "--num-requests", "4", "--slo", "ttft_ms=10000")
    assert strict["goodput"]["good_requests"] == 0 and loose["goodput"]["good_requests"] == 4


@probe("--percentiles")
def p_percentiles(c: Ctx):
    with FakeServer() as srv:
        _, s = replay(srv, c, *SMALL, "--num-requests", "3", "--percentiles", "50,99.9")
    assert {k for k in s["ttft_ms"] if k.startswith("p")} == {"p50", "p999"}


@probe("--output")
def p_output(c: Ctx):
    (c.tmp / "sub").mkdir()
    with FakeServer() as srv:
        args = ["--base-url", srv.base_url, "--model", "m", "--quiet", *SMALL, "--num-requests", "2"]
        rc = main([*args, "--output", str(c.tmp / "sub" / "mine.json")])
    assert rc == 0 and json.loads((c.tmp / "sub" / "mine.json").read_text())["completed"] == 2


@probe("--detail")
def p_detail(c: Ctx):
    with FakeServer() as srv:
        rows = detail(c, srv, *SMALL, "--num-requests", "3")
    assert sorted(r["request_id"] for r in rows) == [0, 1, 2] and all(r["success"] for r in rows)


@probe("--csv")
def p_csv(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "3", "--csv", str(c.tmp / "r.csv"))
    rows = list(csv.DictReader(open(c.tmp / "r.csv")))
    assert len(rows) == 3


@probe("--plots")
def p_plots(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "3", "--plots", str(c.tmp / "plots"))
    pngs = {p.name for p in (c.tmp / "plots").iterdir()}
    assert "latency_cdf.png" in pngs and all(n.endswith(".png") for n in pngs)


@probe("--html-output")
def p_html_output(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "3", "--html-output", str(c.tmp / "r.html"))
    page = (c.tmp / "r.html").read_text()
    assert 'data-kind="replay"' in page
    assert 'data-value="3" data-path="completed"' in page  # the page of this run: its 3 requests completed


@probe("--config")
def p_config(c: Ctx):
    cfg = c.tmp / "replay.yaml"
    cfg.write_text("model: from-yaml\nnum_requests: 4\ninput_len: 8\noutput_len: 3\nquiet: true\n")
    with FakeServer() as srv:
        out = str(c.tmp / "o.json")
        assert main(["--config", str(cfg), "--base-url", srv.base_url, "--output", out]) == 0
        assert main(["--config", str(cfg), "--base-url", srv.base_url, "--output", out, "--num-requests", "2"]) == 0
        bodies = srv.recent_bodies
    assert len(bodies) == 6 and {b["model"] for b in bodies} == {"from-yaml"}  # 4 from the file, then 2 (flag wins)
    assert {b["max_tokens"] for b in bodies} == {3}


@probe("--quiet")
def p_quiet(c: Ctx):
    with FakeServer() as srv:
        replay(srv, c, *SMALL, "--num-requests", "2", quiet=True)
        assert c.capsys.readouterr().out == ""
        replay(srv, c, *SMALL, "--num-requests", "2", quiet=False)
        assert "results:" in c.capsys.readouterr().out  # the summary tables and where the results went


@probe("--help")
def p_help(c: Ctx):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "usage: kvtier replay" in c.capsys.readouterr().out


def help_flags(capsys) -> set[str]:
    with pytest.raises(SystemExit):
        main(["--help"])
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", capsys.readouterr().out))


def test_every_flag_has_a_probe(capsys):
    flags = help_flags(capsys)
    assert len(flags) > 30 and flags - set(PROBES) == set()
    assert set(PROBES) - flags == set()  # and no probe of a flag that no longer exists


SLOW_FLAGS = {"--metrics-interval"}  # waits for several scrapes: out of the fast tier


@pytest.mark.parametrize(
    "flag", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FLAGS else f for f in sorted(PROBES)]
)
@pytest.mark.slow
def test_flag_changes_behaviour(flag, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    PROBES[flag](Ctx(tmp_path, capsys, monkeypatch))
