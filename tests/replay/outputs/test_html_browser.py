"""`kvtier report` and --html-output, each kind of result opened in a real browser: Debian's chromium, headless, driven
by selenium through chromium-driver.

Every result is made by the real command with tiny settings (bench, bench --trials cut short by SIGINT, merge, replay
against the fake OpenAI server, plan, plan --trace, sweep over a real throttlefs mount); the storage traces are real
captures of tracing/storage_latency_stack.sh committed under tests/tracing/fixtures. For each page: it loads with no
JavaScript error and no failed request (the browser's log), it fetched nothing over the network (the resource
timing entries), every plot has its traces with points (plotly's own `gd.data`, read in the page), every number in
the summary table is the JSON's (cells name their JSON path), ratios are value / first run's value, and the banners
say what went wrong. KVTIER_REPORT_SCREENSHOTS=DIR saves one full-page PNG per kind (docs/report-screenshots/).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench_helpers import run as bench_run
from bench_helpers import write_config
from helpers import wait_for

from deploy.throttle.cli import check_fuse
from replay.openai.fake_server import FakeServer, FakeServerConfig
from replay.outputs.html.sections import value_at
from replay.synthetic.view import STATUS_ENV

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("chromium") and shutil.which("chromedriver")),
        reason="needs Debian's chromium and chromium-driver (deploy/install-system-deps.sh)",
    ),
]

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "tests" / "tracing" / "fixtures"
MOONCAKE = ROOT / "tests" / "replay" / "data" / "mooncake"
SHOTS = os.environ.get("KVTIER_REPORT_SCREENSHOTS")
# one QoS class with an SLA no run meets: the page must say the run failed that check
QOS = {
    "interactive": {"priority": 3, "target_p95_ms": 0.001, "target_p99_ms": 0.002},
    "responsive": {"priority": 2, "target_p95_ms": 60_000, "target_p99_ms": 60_000},
    "batch": {"priority": 1, "target_p95_ms": 60_000, "target_p99_ms": 60_000},
}


def kvtier(*args: str, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [sys.executable, "-m", "replay.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, **kw
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = shutil.which("chromium")
    # --no-sandbox: chromium's sandbox refuses to run as root (the test machines run as root)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("html")


@pytest.fixture(scope="module")
def benches(work) -> list[Path]:
    """Two short bench runs with an SLA they miss, 4 and 2 users (the first written with --html-output too)."""
    paths = []
    for i, extra in enumerate(({"html_output": str(work / "bench.html")}, {"num_users": 2})):
        d = work / f"b{i}"
        d.mkdir()
        doc = bench_run(d, duration=1.0, qos_profiles=QOS, **extra)
        assert doc["_rc"] == 0 and doc["status"] == "completed"
        paths.append(d / "out.json")
    return paths


def load(browser, page: Path, shot: str) -> dict:
    """Open `page`; wait until plotly drew every plot; return what the page holds, read in the browser."""
    browser.get(page.as_uri())
    wait_for(
        lambda: browser.execute_script(
            "return document.readyState === 'complete' && Array.from(document.querySelectorAll('.plotly-graph-div'))"
            ".every(g => g._fullLayout !== undefined)"
        ),
        timeout_s=60,
        what="every plot drawn",
    )
    got = browser.execute_script(
        """
        const plots = Array.from(document.querySelectorAll('.plotly-graph-div')).map(g => ({
            title: (g.layout.title && (g.layout.title.text || g.layout.title)) || '',
            traces: g.data.map(t => ({name: t.name || '', type: t.type || 'scatter',
                                      n: (t.z ? t.z.flat().filter(v => v !== null).length : (t.y || []).length)}))}));
        const cells = Array.from(document.querySelectorAll('table.summary tbody tr')).map(tr =>
            Array.from(tr.children).map(td => ({text: td.textContent, value: td.dataset.value ?? null,
                path: td.dataset.path ?? null, ratio: td.classList.contains('ratio')})));
        const banners = Array.from(document.querySelectorAll('.banner')).map(b => [b.dataset.level, b.textContent]);
        const resources = performance.getEntriesByType('resource').map(r => r.name);
        return {plots, cells, banners, resources, kind: document.body.dataset.kind};
        """
    )
    got["log"] = browser.get_log("browser")
    if SHOTS:
        height = browser.execute_script("return document.body.scrollHeight")
        browser.set_window_size(1400, min(height + 40, 2400))
        browser.get(page.as_uri())  # drawn again at the final size
        wait_for(lambda: browser.execute_script("return document.readyState === 'complete'"), what="page loaded")
        os.makedirs(SHOTS, exist_ok=True)
        browser.save_screenshot(os.path.join(SHOTS, f"{shot}.png"))
        browser.set_window_size(1400, 1000)
    return got


def _shown(text: str) -> float:
    return float(text.replace(",", "").rstrip("%x")) / (100 if text.endswith("%") else 1)


def check_page(got: dict, docs: list, kind: str, min_plots: int) -> None:
    """What every page must show, whatever its kind."""
    assert got["kind"] == kind
    # no JavaScript error, no failed request: chromium logs both as SEVERE
    assert [e for e in got["log"] if e["level"] == "SEVERE"] == []
    # self-contained: nothing fetched from anywhere but the file itself
    assert [r for r in got["resources"] if not r.startswith(("file:", "data:", "blob:"))] == []
    assert len(got["plots"]) >= min_plots
    for p in got["plots"]:
        assert p["traces"], f"plot {p['title']!r} has no traces"
        assert all(t["n"] > 0 for t in p["traces"]), p
    checked = 0
    for row in got["cells"]:
        values = [c for c in row[1:] if not c["ratio"]]
        assert len(values) == len(docs)
        for c, doc in zip(values, docs):
            if c["path"] is None or c["value"] is None:
                continue
            expected = value_at(doc, tuple(c["path"].split("/")))
            assert float(c["value"]) == expected, (row[0]["text"], c)
            # the text shown reads back to the same number (4 significant digits, or 2 decimals of a percent)
            assert _shown(c["text"]) == pytest.approx(expected, rel=1e-3, abs=5e-5), (row[0]["text"], c)
            checked += 1
        base = values[0]["value"]
        for c, r in zip(values[1:], [c for c in row[1:] if c["ratio"]]):
            if r["value"] is not None:
                assert float(r["value"]) == pytest.approx(float(c["value"]) / float(base)), (row[0]["text"], r)
    assert checked >= 3, "the summary table shows numbers read from the JSON"


def trace_names(got: dict) -> set[str]:
    return {t["name"] for p in got["plots"] for t in p["traces"]}


def test_bench_page_from_html_output_and_its_failed_check(browser, benches, work):
    doc = json.loads(benches[0].read_text())
    got = load(browser, work / "bench.html", "bench")
    check_page(got, [doc], "bench", min_plots=4)
    names = trace_names(got)
    assert any(n.startswith("disk read (n=") for n in names)  # the CDF per tier and operation
    assert any(n.startswith("end to end (n=") for n in names)
    assert any(level == "error" and "missed" in text and "interactive" in text for level, text in got["banners"])


def test_two_bench_runs_overlaid_with_ratios(browser, benches, work):
    kvtier("report", *map(str, benches), "--labels", "four,two", "-o", str(work / "overlay.html"))
    docs = [json.loads(p.read_text()) for p in benches]
    got = load(browser, work / "overlay.html", "bench-overlay")
    check_page(got, docs, "bench", min_plots=4)
    rps = next(r for r in got["cells"] if r[0]["text"] == "requests/s")
    assert float(rps[3]["value"]) == pytest.approx(
        docs[1]["summary"]["requests_per_second"] / docs[0]["summary"]["requests_per_second"]
    )
    names = trace_names(got)
    assert {"four: read", "two: read"} <= names  # every run's series, named by its label


def test_merged_page(browser, benches, work):
    kvtier("merge", *map(str, benches), "-o", str(work / "merged.json"))
    kvtier("report", str(work / "merged.json"), "-o", str(work / "merged.html"))
    doc = json.loads((work / "merged.json").read_text())
    got = load(browser, work / "merged.html", "merged")
    check_page(got, [doc], "merged", min_plots=3)
    sources = next(p for p in got["plots"] if p["title"] == "Per source of the merge")
    assert [t["n"] for t in sources["traces"]] == [len(doc["clients"])] * 2 == [2, 2]  # each source's figures


def test_trials_cut_short_by_a_signal_say_so(browser, work):
    d = work / "trials"
    d.mkdir()
    cfg = write_config(d, duration=1.5, num_users=3, cpu_mem_gb=0)
    status = d / "live.status"
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay.cli", "bench", "--config", cfg, "--trials", "2"]
        + ["--html-output", str(d / "trials.html")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **{STATUS_ENV: str(status)}),
    )
    seen, deadline = "", time.monotonic() + 60
    while "trial 2 of 2" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    status.unlink(missing_ok=True)  # trial 1's last snapshot
    wait_for(status.exists, timeout_s=60, what="a live snapshot from trial 2's window")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    doc = json.loads((d / "out.json").read_text())
    assert doc["status"] == "interrupted" and doc["trials_completed"] == 1
    got = load(browser, d / "trials.html", "trials")
    check_page(got, [doc], "trials", min_plots=2)
    assert any(level == "error" and "cut short" in text and "1 of 2" in text for level, text in got["banners"])


def test_replay_page_from_html_output(browser, work):
    out, page = work / "replay.json", work / "replay.html"
    with FakeServer(FakeServerConfig(block_size=4)) as srv:
        kvtier(
            "replay", "--base-url", srv.base_url, "--model", "fake", "--output", str(out), "--quiet",
            "--source", "synthetic", "--rounds", "4", "--concurrency", "3", "--output-len", "5", "--input-len", "12",
            "--block-size", "4", "--metrics-url", srv.base_url + "/metrics", "--html-output", str(page),
        )  # fmt: skip
    doc = json.loads(out.read_text())
    got = load(browser, page, "replay")
    check_page(got, [doc], "replay", min_plots=3)
    hit = next(p for p in got["plots"] if p["title"].startswith("Prefix hit rate per round"))
    assert {t["n"] for t in hit["traces"]} == {len(doc["rounds"])} == {4}
    # where the prompt tokens came from: the fake server has its own prefix cache and nothing behind it
    parts = doc["server_metrics"]["prompt_tokens_by_tier"]
    assert sum(parts.values()) == sum(doc["server_metrics"]["prompt_tokens_by_source"].values()) > 0
    assert parts["vllm_prefix_cache"] > 0
    src = next(p for p in got["plots"] if p["title"].startswith("Where the prompt tokens came from"))
    assert {t["name"] for t in src["traces"]} == {"vllm_prefix_cache", "recomputed"}
    assert {t["n"] for t in src["traces"]} == {1 + 4}  # the whole run, then each round
    assert got["banners"] == []


def test_replay_against_a_dead_server_is_marked_partial(browser, work):
    from replay.common.ports import free_port

    out = work / "dead.json"
    r = subprocess.run(
        [sys.executable, "-m", "replay.cli", "replay", "--base-url", f"http://127.0.0.1:{free_port()}",
         "--model", "m", "--output", str(out), "--quiet", "--source", "synthetic", "--num-requests", "20",
         "--request-rate", "100", "--input-len", "4", "--output-len", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    kvtier("report", str(out), "-o", str(work / "dead.html"))
    got = load(browser, work / "dead.html", "replay-dead")
    assert any(level == "error" and "cut short" in text for level, text in got["banners"])
    assert [e for e in got["log"] if e["level"] == "SEVERE"] == []


def test_plan_page_from_html_output(browser, work):
    out, page = work / "plan.json", work / "plan.html"
    kvtier(
        "plan", "--concurrency", "8", "--rounds", "6", "--first-input-len", "1000", "--input-len", "50",
        "--output-len", "200", "--block-size", "16", "--kv-bytes-per-token", "1KB", "--config", "small=--tier dram=2MB",
        "--config", "big=--tier dram=4MB --tier disk=8MB", "--output", str(out), "--html-output", str(page), "--quiet",
    )  # fmt: skip
    doc = json.loads(out.read_text())
    got = load(browser, page, "plan")
    check_page(got, [doc], "plan", min_plots=2)
    assert {"small", "big", "ideal"} <= trace_names(got)
    collapse = next(r for r in got["cells"] if r[0]["text"] == "small: collapse round")
    assert int(collapse[1]["value"]) == doc["configurations"][0]["collapse_round"]


def test_plan_trace_capacity_curves(browser, work):
    out = work / "plantrace.json"
    kvtier(
        "plan", "--trace", str(MOONCAKE / "conversation_trace_head300.jsonl"), "--trace",
        str(MOONCAKE / "synthetic_trace_head300.jsonl"), "--tier", "local=3e4", "--capacity-sweep", "1e3..1e6",
        "--output", str(out), "--quiet",
    )  # fmt: skip
    kvtier("report", str(out), "-o", str(work / "plantrace.html"))
    doc = json.loads(out.read_text())
    got = load(browser, work / "plantrace.html", "plan-trace")
    check_page(got, [doc], "plan-trace", min_plots=1)
    curves = {t["name"]: t["n"] for t in got["plots"][0]["traces"]}
    for t in doc["traces"]:
        assert curves[t["name"]] == len(t["curve"]) == len(doc["capacities_tokens"])


@pytest.mark.skipif(check_fuse() is not None, reason=f"FUSE: {check_fuse()}")
def test_sweep_heat_maps_from_html_output(browser, work):
    out, page = work / "sweep.json", work / "sweep.html"
    kvtier(
        "sweep", "--bw", "none,100MB/s", "--lat-ms", "0,2", "--driver", "bench", "--output", str(out),
        "--html-output", str(page), "--", "--num-users", "2", "--duration", "1.5", "--cpu-mem-gb", "0",
        "--gpu-mem-gb", "0", "--storage-capacity-gb", "0.5", "--max-context-tokens", "256", "--seed", "1",
    )  # fmt: skip
    doc = json.loads(out.read_text())
    got = load(browser, page, "sweep")
    check_page(got, [doc], "sweep", min_plots=1)
    heat = [t for p in got["plots"] for t in p["traces"] if t["type"] == "heatmap"]
    assert heat and all(0 < t["n"] <= len(doc["points"]) for t in heat)  # one cell per point that has the figure


def test_storage_traces_overlaid_with_their_warning(browser, work):
    from tracing.histparse import parse_trace, read_trace
    from tracing.report import layer_rows

    paths = [TRACES / "fio_randrw70_512k_qd8.txt", TRACES / "fio_randrw70_512k_qd4_unseen_completions.txt"]
    kvtier("report", *map(str, paths), "-o", str(work / "trace.html"))
    got = load(browser, work / "trace.html", "trace")
    traces = [parse_trace(read_trace(p)) for p in paths]
    assert [e for e in got["log"] if e["level"] == "SEVERE"] == []
    assert len(got["plots"]) >= 2 and all(t["n"] > 0 for p in got["plots"] for t in p["traces"])
    # the trace's numbers are computed (histogram quantiles), not JSON fields: read them as tracing.report does
    rows = {r[0]["text"]: r for r in got["cells"]}
    for layer, what, h in layer_rows(traces[0]):
        assert int(rows[f"{layer} {what}: count"][1]["value"]) == h.total
        assert float(rows[f"{layer} {what}: p99 (us)"][1]["value"]) == h.quantile(0.99)
    warn = [text for level, text in got["banners"] if level == "warn"]
    assert any("fio_randrw70_512k_qd4_unseen_completions" in t and "no completion" in t for t in warn)


# Labels, names and file names as a user might give them, each with characters plotly or HTML would read as markup
# (a link, bold, a line break, an entity, a template variable, TeX) or rich would (tags, an emoji code).
MARKUP = (
    '<a href="https://example.com">x</a>',
    "<b>bold</b>",
    "a<br>b",
    "&amp; &lt;",
    "%{x} %{y:.1f}",
    "$x^2$",
    "[/] [bold]r[/bold] :rocket:",
    "🚀 שלום",
    "long " + "x" * 120,
)


def _renamed_tiers(doc: dict, names: dict[str, str]) -> dict:
    """`doc` with its tiers renamed, as a hand-edited results file (or a store with its own tier names) would be."""
    doc = json.loads(json.dumps(doc))
    doc["tiers"] = {names.get(k, k): v for k, v in doc["tiers"].items()}
    for point in doc.get("timeline") or []:
        point["tiers"] = {names.get(k, k): v for k, v in (point.get("tiers") or {}).items()}
    return doc


def _drawn(browser) -> list[dict]:
    """Per plot: every SVG text drawn, the links and bold spans in it, and each trace's hover label (drawn by
    hovering its first point; plotly draws at most one hover per 50 ms, hence the waits)."""
    return browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const pause = () => new Promise(r => setTimeout(r, 120));
        (async () => {
            const out = [];
            for (const g of document.querySelectorAll('.plotly-graph-div')) {
                const hover = [];
                for (let i = 0; i < g.data.length; i++) {
                    const t = g.data[i];
                    Plotly.Fx.hover(g, [{curveNumber: i, pointNumber: 0}], (t.xaxis || 'x') + (t.yaxis || 'y'));
                    await pause();
                    hover.push({label: Array.from(g.querySelectorAll('.hoverlayer text')).map(e => e.textContent),
                                links: g.querySelectorAll('.hoverlayer a').length});
                    Plotly.Fx.unhover(g);
                    await pause();
                }
                out.push({
                    texts: Array.from(g.querySelectorAll('svg text')).map(e => e.textContent),
                    links: Array.from(g.querySelectorAll('svg a')).map(a => a.outerHTML),
                    bold: Array.from(g.querySelectorAll('svg [style*="bold"]')).map(e => e.textContent),
                    hover,
                });
            }
            return out;
        })().then(done);
        """
    )


def _shown_as_typed(drawn: list[dict], strings: list[str]) -> None:
    everything = [t for p in drawn for t in p["texts"]]
    for p in drawn:
        assert p["links"] == [], p["links"]  # no user text became a link
        assert p["bold"] == [], p["bold"]  # nor bold
        assert all(h["links"] == 0 for h in p["hover"]), p["hover"]
    for s in strings:
        assert any(s in t for t in everything), (s, everything)


def test_user_text_with_markup_is_shown_as_typed(browser, benches, work):
    """Run labels, tier names, the title and merged sources' file names with HTML, plotly and rich markup in them:
    shown character for character in the page, its plots (legend, titles, category ticks, hover labels) and the
    terminal lines of the commands, and no link or bold made from them."""
    d = work / "markup"
    d.mkdir()
    tiers = {"cpu": "<b>cpu</b> $x$", "disk": '<a href="https://example.com">disk</a> %{x}'}
    files = []
    for i, p in enumerate(benches):
        f = d / (f"run[nvme] <i>{i}.json" if i == 0 else "run[sata] &amp; %{x} $y$.json")
        f.write_text(json.dumps(_renamed_tiers(json.loads(p.read_text()), tiers)))
        files.append(f)
    labels = [MARKUP[0] + " " + MARKUP[5], MARKUP[1] + " " + MARKUP[4] + " " + MARKUP[6]]
    title = " ".join(MARKUP)
    kvtier("report", *map(str, files), "--labels", ",".join(labels), "--title", title, "-o", str(d / "r.html"))
    browser.get((d / "r.html").as_uri())
    load(browser, d / "r.html", "markup")  # waits for the plots; no JavaScript error
    assert browser.execute_script("return document.querySelector('h1').textContent") == title
    assert browser.execute_script("return document.title") == title
    # no link anywhere made from the user's text (plotly's own logo links are the only ones)
    assert (
        browser.execute_script(
            "return Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href') || "
            "a.getAttribute('xlink:href') || '').filter(h => !h.startsWith('https://plotly.com'))"
        )
        == []
    )
    drawn = _drawn(browser)
    _shown_as_typed(drawn, [f"{lab}: {tier} read" for lab in labels for tier in tiers.values()])
    # the hover labels: every trace's name as typed (plotly cuts a long one short at 15 characters, with "..."),
    # its %{x} not read as the template's variable
    hovers = [lab for p in drawn for h in p["hover"] for lab in h["label"]]
    for lab in labels:
        for tier in tiers.values():
            assert any(f"{lab}: {tier} read"[:12] in h for h in hovers), (lab, tier, hovers)

    # a merge of the two: its sources (file names) are the categories of a bar chart
    kvtier("merge", *map(str, files), "-o", str(d / "merged.json"))
    merged = kvtier("report", str(d / "merged.json"), "-o", str(d / "merged.html"))
    assert "[/]" not in merged.stdout
    load(browser, d / "merged.html", "markup-merged")
    _shown_as_typed(_drawn(browser), [Path(f).stem for f in files])

    # a plan over traces whose file names hold markup: the traces are named by them, in the terminal's tables and
    # in the capacity curves
    names = ["conv[v2] <b>x %{y} $a$", "[bold]b &amp; <br> 🚀"]
    for n in names:
        shutil.copy(MOONCAKE / "conversation_trace_head300.jsonl", d / f"{n}.jsonl")
    plan = kvtier(
        "plan", "--trace", str(d / f"{names[0]}.jsonl"), "--trace", str(d / f"{names[1]}.jsonl"), "--tier",
        "local=3e4", "--capacity-sweep", "1e3..1e5", "--output", str(d / "plan.json"), "--html-output",
        str(d / "plan.html"),
    )  # fmt: skip
    assert all(n in plan.stdout for n in names), plan.stdout  # the terminal's tables too
    load(browser, d / "plan.html", "markup-plan")
    _shown_as_typed(_drawn(browser), names)
