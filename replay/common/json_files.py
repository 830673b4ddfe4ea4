"""JSON and YAML in files: what kvtier reads from files a person or another program wrote (results files, datasets,
--config), and how its sinks write JSON (`dumps_json`: never a bare NaN; `write_json`: whole or not at all).

Two things Python's parsers let through that kvtier never reads:
- non-finite numbers: `NaN`, `Infinity` (not JSON, but Python's json accepts them) and numbers too large for a
  float (`1e400` becomes inf), YAML's `.nan` / `.inf`. A figure computed from one is meaningless, and written back it
  makes a file other JSON readers refuse. Refused with `InputError`.
- deep nesting: the parsers recurse, so `[[[[...` a hundred thousand deep raised RecursionError. Refused with
  `InputError` (no kvtier file nests deeper than `MAX_NESTING`, a results file about eight levels).

`InputError` is a ValueError, so a caller that already turns a JSONDecodeError into one line does the same with it;
its message names no file (the caller adds the path).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from typing import Any, BinaryIO

from kvconnector.errors import UserError
from kvconnector.files import atomic_path

MAX_NESTING = 100


class InputError(UserError, ValueError):
    """What a file holds that kvtier will not read; the message says what, the caller says which file."""


def _no_constant(name: str) -> Any:
    raise InputError(f"{name} is not a finite number (kvtier reads only finite numbers)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InputError(f"{text} does not fit a float (kvtier reads only finite numbers)")
    return value


# raw_decode() for readers that walk a file item by item (ShareGPT); loads_json() for whole documents.
DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def _too_deep() -> InputError:
    return InputError(f"nested more than {MAX_NESTING} levels deep (no kvtier input nests so deep)")


def check_nesting(doc: Any, limit: int = MAX_NESTING) -> None:
    """Raise InputError if lists/objects in `doc` nest deeper than `limit` (an iterative walk: any depth is safe)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise _too_deep()
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def raw_decode(text: str, pos: int) -> tuple[Any, int]:
    """One JSON value of `text` starting at `pos` (as JSONDecoder.raw_decode), finite and nested at most
    MAX_NESTING deep."""
    try:
        value, end = DECODER.raw_decode(text, pos)
    except RecursionError:
        raise _too_deep() from None
    check_nesting(value)
    return value, end


def loads_json(data: str | bytes) -> Any:
    """A whole JSON document: finite numbers only, nested at most MAX_NESTING deep; InputError or JSONDecodeError
    (both ValueErrors) otherwise."""
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    data = data.removeprefix("\ufeff")
    value, end = raw_decode(data, len(data) - len(data.lstrip()))
    if data[end:].strip():
        raise json.JSONDecodeError("Extra data", data, end)
    return value


def too_deep() -> InputError:
    """The error for a parser's RecursionError (YAML's composer recurses too)."""
    return _too_deep()


def check_input(doc: Any) -> None:
    """What a YAML (or otherwise parsed) document must also pass: nesting bounded, finite floats (YAML's .nan,
    .inf); InputError otherwise."""
    check_nesting(doc)
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise InputError(f"{node} is not a finite number (kvtier reads only finite numbers)")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def finite(doc: Any) -> Any:
    """`doc` with every non-finite float replaced by None: what a sink writes, so no file kvtier writes holds a bare
    NaN (json.dump with allow_nan=False then proves it)."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def dumps_json(doc: Any, **kwargs: Any) -> str:
    """json.dumps of `finite(doc)` with allow_nan=False: the one way kvtier's sinks turn a document into JSON."""
    return json.dumps(finite(doc), allow_nan=False, **kwargs)


def write_json(
    path: str | os.PathLike, doc: Any, *, indent: int | None = 2, default: Any = None, exclusive: bool = False
) -> None:
    """Write `doc` to `path` whole or not at all: `dumps_json` (a non-finite float is written as null, never a bare
    NaN) into a temp file beside `path`, fsynced, then renamed over `path` (`kvconnector.files.atomic_path`). A crash
    at any point leaves the old file or the new one, never half of one; a document that cannot be written (an object
    json does not know, without `default`) raises before any file is touched. `exclusive`: never replace an existing
    file (FileExistsError)."""
    text = dumps_json(doc, indent=indent, default=default) + "\n"
    with atomic_path(path, suffix=".json.tmp", exclusive=exclusive) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # the bytes on disk before the rename makes them the file's


def open_regular(path) -> BinaryIO:
    """Open a file the user named, for reading. A FIFO, device or directory is refused with an OSError whose strerror
    says so: reading one would block forever or read something that is not a file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: opening a FIFO must not wait
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", os.fspath(path))
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    return os.fdopen(fd, "rb")
