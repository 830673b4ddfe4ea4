"""The one rich Console that every table, line and bar of kvtier is drawn on.

rich reads a plain string given to a table (title, caption, heading, cell) or to `print` as console markup:
`[bold]` styles, `[/]` closes (and raises when nothing is open), `[nvme]` vanishes as an unknown style, `:rocket:`
becomes an emoji. The strings kvtier shows are mostly the user's (labels, file names, trace, tier and source names),
so this console reads none of them as markup: every string is shown as it was typed. Styling that kvtier means is a
`rich.text.Text` with a style, never markup in a string. rich is imported only when a console is asked for.
"""

from __future__ import annotations

from typing import Any

__all__ = ["console"]


def console(*, stderr: bool = False, min_width: int | None = None) -> Any:
    """A rich Console on stdout (or stderr) with markup and emoji codes off. `min_width`: at least this many columns,
    even when piped (rich would squeeze a wide table to 80)."""
    from rich.console import Console

    c = Console(stderr=stderr, markup=False, emoji=False)
    if min_width is not None and c.width < min_width:
        c.width = min_width
    return c
