"""User text is shown as typed: labels, file names, trace, tier and source names with characters that rich (`[bold]`,
`[/]`, `:rocket:`) or plotly (`<a href>`, `<b>`, `<br>`, `&amp;`, `%{x}`, `$x$`) would read as markup.

The terminal: the one console (replay/outputs/terminal.py), no other made anywhere in the project, and the real
commands' tables (kvtier compare, check, bench). The page's plots: the strings `literal_figure` hands plotly; the
page itself is read in a real browser by test_html_browser.py."""

from __future__ import annotations

import ast
import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import write_config

from replay.outputs.html.plot_text import literal_figure, plot_literal
from replay.outputs.tables import rows_table
from replay.outputs.terminal import console

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("kvconnector", "replay", "tracing", "deploy", "benchmarks", "tools")

# one of each way a string is read as markup, and text that must pass through untouched
MARKUP = [
    "[/]",
    "[bold]x[/bold]",
    "run[nvme]",
    "conv[v2]",
    "[red]",
    "[link=https://example.com]x[/link]",
    r"\[escaped]",
    ":rocket: :warning:",
    '<a href="https://example.com">x</a>',
    "<b>x</b>",
    "a<br>b",
    "&amp; &lt;",
    "%{x} %{y:.1f}",
    "$x^2$",
    "100% $5",
    "🚀 emoji",
    "שלום RTL",
    "long " + "x" * 150,
]


def _py_files():
    for pkg in PACKAGES:
        yield from (ROOT / pkg).rglob("*.py")


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_every_rich_output_goes_through_the_literal_console():
    """The kind, not the case: a Console made anywhere but replay/outputs/terminal.py would read markup again, and
    so would a progress column or Text made from markup."""
    found = []
    for path in _py_files():
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        if "rich" not in source:  # no rich object is made without importing rich
            continue
        tree = ast.parse(source)
        rich_names = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("rich")
            for a in n.names
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _call_name(node)
            keywords = {k.arg: k.value for k in node.keywords}
            if name == "Console" and rel != "replay/outputs/terminal.py":
                found.append(f"{rel}:{node.lineno} makes its own Console")
            if name == "from_markup":
                found.append(f"{rel}:{node.lineno} reads markup (Text.from_markup)")
            if name == "TextColumn" and not (
                isinstance(keywords.get("markup"), ast.Constant) and keywords["markup"].value is False
            ):
                found.append(f"{rel}:{node.lineno} TextColumn without markup=False")
            if name == "Progress" and "Progress" in rich_names and not node.args:
                found.append(f"{rel}:{node.lineno} rich Progress with its default columns (markup)")
            if name in ("Progress", "Live") and name in rich_names and "console" not in keywords:
                found.append(f"{rel}:{node.lineno} rich {name} on a console of its own")
    assert found == []


@pytest.mark.parametrize("text", MARKUP)
def test_the_console_shows_a_table_and_a_line_as_typed(text, capsys):
    out = console(min_width=600)
    out.print(rows_table(text, [{"k": text}], [("k", text)]))
    out.print(f"results: {text}")
    shown = capsys.readouterr().out
    assert shown.count(text) == 4, shown  # title, heading, cell, line


def test_the_console_keeps_its_own_width_unless_asked_for_more(monkeypatch):
    monkeypatch.setenv("COLUMNS", "123")
    assert console().width == 123
    assert console(min_width=100).width == 123 and console(min_width=200).width == 200


@pytest.mark.parametrize("text", MARKUP)
def test_plot_text_reads_back_as_typed_and_holds_no_markup(text):
    lit = plot_literal(text)
    assert html.unescape(lit) == text  # what plotly's character references turn back into
    assert not set(lit) & set("<>$%")  # no tag, no TeX, no template variable left to read
    assert "&" not in lit.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "").replace("&#36;", "").replace(
        "&#37;", ""
    )


@pytest.mark.slow  # plotly's figure classes load their validators on first use: about a second
def test_literal_figure_escapes_what_is_drawn_and_leaves_the_templates():
    import plotly.graph_objects as go

    text = '<a href="https://example.com">x</a> %{x} $y$'
    fig = go.Figure(
        go.Bar(x=[text, "b"], y=[1, 2], name=text, hovertemplate="%{y}<extra>%{fullData.name}</extra>", text=[text, ""])
    )
    fig.update_layout(title=text, xaxis_title=text, legend_title_text=text, template="plotly_white")
    fig.add_annotation(text=text, x=text, y=1)
    out = literal_figure(fig)
    trace, layout = out["data"][0], out["layout"]
    drawn = [trace["name"], trace["x"][0], trace["text"][0], layout["title"]["text"]]
    drawn += [layout["xaxis"]["title"]["text"], layout["legend"]["title"]["text"]]
    drawn += [layout["annotations"][0]["text"], layout["annotations"][0]["x"]]
    assert drawn == [plot_literal(text)] * len(drawn)
    assert trace["hovertemplate"] == "%{y}<extra>%{fullData.name}</extra>"  # the figure's own markup
    assert trace["y"] == [1, 2] and layout["template"] == fig.to_plotly_json()["layout"]["template"]


def test_no_view_pastes_user_text_into_a_template():
    """A hover template is the figure's own markup, left as it is: a name pasted into one would be read as markup
    and variables; views name a trace with %{fullData.name} instead."""
    found = []
    for path in (ROOT / "replay" / "outputs" / "html" / "sections").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg in ("hovertemplate", "texttemplate"):
                if not isinstance(node.value, ast.Constant):
                    found.append(f"{path.name}:{node.value.lineno} builds a {node.arg}")
    assert found == []


# ---- the real commands ----------------------------------------------------------------------------------------------


def kvtier(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="3000")  # every column whole on one line, so each label reads back in one piece
    return subprocess.run(
        [sys.executable, "-m", "replay.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.slow
def test_compare_and_check_show_file_names_and_labels_as_typed(tmp_path, sample_doc):
    names = ["run[nvme]", "run[sata]", "conv[v2]", "[bold]x [red] :rocket:", "<b>y<b> %{x} $z$ &amp;"]  # no '/'
    files = []
    for name in names:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(sample_doc))
        files.append(str(f))
    r = kvtier("compare", *files)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if "metric" in line)
    for name in names:
        assert f" {name} " in header, header  # a column each, named by its file as typed

    labels = [t for t in MARKUP if "," not in t][: len(files)]
    r = kvtier("compare", *files, "--labels", ",".join(labels))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert all(lab in r.stdout for lab in labels), r.stdout
    assert f"ratio: each run / {labels[0]})" in r.stdout  # the title names the base

    r = kvtier("check", *files[:3])  # a checklist: the medians table is titled by the runs' configuration
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert all(f in r.stdout for f in files[:3])


@pytest.mark.slow
def test_bench_summary_shows_the_results_path_as_typed(tmp_path):
    out = tmp_path / "[bold]b[/bold] [/] run[nvme] :rocket: <b>x.json"
    cfg = write_config(tmp_path, duration=0.3, output=str(out))
    r = kvtier("bench", "--config", cfg)
    assert r.returncode == 0, r.stderr
    assert f"results: {out}" in r.stdout and out.exists()


@pytest.mark.slow  # matplotlib and a PNG
def test_png_figures_show_dollars_as_typed(tmp_path):
    """matplotlib reads text between two `$` as TeX and fails the save on TeX it cannot parse (`$\\frac$`)."""
    from matplotlib import cbook

    from replay.outputs.plots import save_figures

    names = [r"model $\frac$", "$x^2$ tier", "cost $5", r"a\$b", "<b>x</b> [bold] %{x}"]
    kept = {}

    def draw(plt, data):
        fig, ax = plt.subplots()
        for n in names:
            ax.plot([0, 1], [0, 1], label=n)
        ax.set_title(names[0])
        ax.legend()
        kept["fig"] = fig
        return fig

    written = save_figures(tmp_path, names[1], [("x.png", draw)], None)
    assert written == [str(tmp_path / "x.png")] and (tmp_path / "x.png").stat().st_size > 0
    texts = [t.get_text() for t in kept["fig"].findobj(lambda a: hasattr(a, "get_text")) if t.get_text()]
    assert not any(cbook.is_math_text(t) for t in texts), texts
    # what matplotlib draws for a text that is not TeX: the escaped dollars as dollars
    shown = {t.replace(r"\$", "$") for t in texts}
    assert set(names) <= shown, shown
