"""The text of plotly figures shown as typed.

plotly reads a subset of HTML in every string it draws as text (trace names in the legend and the hover label, titles,
axis titles, category and tick labels, annotations): `<a href=...>` becomes a link, `<b>` bold, `<br>` a new line,
`&amp;` an ampersand; `%{x}` is a variable inside a hover or text template and `$...$` is TeX where MathJax is loaded.
Most of these strings are the user's (run labels, tier, trace, source and configuration names), so the page passes
every figure through `literal_figure` just before it is drawn: in each string plotly draws as text, `&`, `<`, `>`, `$`
and `%` become character references, which plotly turns back into the characters themselves. Templates
(`hovertemplate`, `texttemplate`) are left alone, as they are the figure's own markup; they name a trace with
`%{fullData.name}`, never by pasting the name in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["literal_figure", "plot_literal"]

# Keys whose strings plotly draws as text: names, titles and annotations (`text`), hover texts, tick labels, and the
# data itself, which is drawn as category labels and substituted into templates (%{x}, %{customdata}).
_TEXT_KEYS = frozenset({"name", "text", "title", "hovertext", "ticktext", "x", "y", "z", "labels", "customdata"})
_REFERENCES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "$": "&#36;", "%": "&#37;"})


def plot_literal(text: str) -> str:
    """`text` as plotly will draw it literally."""
    return text.translate(_REFERENCES)


def _literal(value: Any, key: str | None) -> Any:
    if isinstance(value, dict):
        # a template's styles hold no text of the figure
        return {k: v if k == "template" else _literal(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_literal(v, key) for v in value]
    if isinstance(value, str) and key in _TEXT_KEYS:
        return plot_literal(value)
    return value


def literal_figure(fig: go.Figure) -> dict[str, Any]:
    """`fig` as a plotly figure dict whose every drawn string is shown as typed."""
    return _literal(fig.to_plotly_json(), None)
