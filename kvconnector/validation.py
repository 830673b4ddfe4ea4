"""One line for a pydantic ValidationError: how every kvtier configuration mistake reads to a user.

`where: path: message`. `where` names the source of the bad value (a flag, an environment variable, a file),
`path` the part of the value that `where` does not already name (a section key, a list item as `[i]`), `message`
is pydantic's, without its "Value error, " prefix. Only the first error is shown: one line, and fixing it then
running again shows the next. Lives in kvconnector so the core and both CLIs (which import it) share it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

__all__ = ["describe_validation_error", "error_path"]


def error_path(loc: Sequence[int | str]) -> str:
    """('rag', 'top_k') -> 'rag.top_k'; ('percentiles', 1) -> 'percentiles[1]'; pydantic's '[key]' marker dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "[key]":  # a dict key that failed: the key itself is already in the path
            out += f".{part}" if out else str(part)
    return out


def describe_validation_error(
    exc: ValidationError,
    where: str | None = None,
    *,
    skip: int = 0,
    show_input: bool = False,
    key_prefix: str = "",
    unknown_key: str | None = None,
) -> str:
    """The first error of `exc` as one line. `skip`: how many leading parts of the error's location `where`
    already names (a flag names its key); `show_input`: add the offending value (`path = value`) for sources the
    user did not type (a file someone else wrote); `key_prefix`: the namespace the user wrote the keys in
    (`kvtier.` in LMCache's extra_config); `unknown_key`: the message for a key the schema lacks, where pydantic's
    "Extra inputs are not permitted" would read oddly."""
    err = exc.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    if unknown_key is not None and err["type"] == "extra_forbidden":
        msg = unknown_key
    path = error_path(err["loc"][skip:])
    if path:
        path = key_prefix + path
    if show_input and path:
        shown = repr(err.get("input"))  # its head only: a 200 KB value quoted whole would bury the line
        path += f" = {shown if len(shown) <= 60 else shown[:35] + f'... ({len(shown):,} characters)'}"
    return ": ".join(p for p in (where, path, msg) if p)
