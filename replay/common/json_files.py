"""JSON, YAML and CSV in files: what kvtier reads from files a person or another program wrote (results files,
datasets, traces, --config), and how its sinks write JSON (`dumps_json`: never a bare NaN; `write_json`: whole or not
at all).

One place turns a malformed file into a one-line refusal: `refuse_malformed` (a context manager every reader of a
user's file wears) catches what Python's parsers raise for bad input rather than for a bug of ours (`MALFORMED`:
ValueError with its UnicodeDecodeError, JSONDecodeError and "Exceeds the limit (4300 digits)", RecursionError,
OverflowError, csv.Error, yaml.YAMLError) and raises the reader's own UserError subclass with the place and one line
of what is wrong. A TypeError is not among them: it is our bug (a missing check of a value's type), so it stays one.

Three things Python's parsers let through, or raise past their callers, that kvtier never reads:
- integers of more than `sys.get_int_max_str_digits()` digits (4300): Python refuses to convert them with a bare
  ValueError. Refused with `InputError`.
- non-finite numbers: `NaN`, `Infinity` (not JSON, but Python's json accepts them) and numbers too large for a
  float (`1e400` becomes inf), YAML's `.nan` / `.inf`. A figure computed from one is meaningless, and written back it
  makes a file other JSON readers refuse. Refused with `InputError`.
- deep nesting: the parsers recurse, so `[[[[...` a hundred thousand deep raised RecursionError. Refused with
  `InputError` (no kvtier file nests deeper than `MAX_NESTING`, a results file about eight levels).

`InputError` is a ValueError, so a caller that already turns a JSONDecodeError into one line does the same with it;
its message names no file (the caller adds the path).
"""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import yaml

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


def _bounded_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # past sys.get_int_max_str_digits(): no count, size or id of any input is so long
        raise InputError(_too_long_int(len(text.lstrip("-")))) from None


def _too_long_int(digits: int | None = None) -> str:
    many = f"of {digits} digits" if digits else "too long"
    return f"an integer {many} (kvtier reads integers of at most {sys.get_int_max_str_digits()} digits)"


# raw_decode() for readers that walk a file item by item (ShareGPT); loads_json() for whole documents.
DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)


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


# What the parsers (json, yaml, csv, int(), float(), datetime) raise for a malformed input. UnicodeDecodeError and
# JSONDecodeError are ValueErrors.
MALFORMED: tuple[type[BaseException], ...] = (ValueError, RecursionError, OverflowError, csv.Error, yaml.YAMLError)


def describe_malformed(exc: BaseException) -> str:
    """One line saying what a MALFORMED exception found (no file name: the caller has it)."""
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    if isinstance(exc, RecursionError):
        return str(_too_deep())
    if isinstance(exc, csv.Error):
        return f"malformed CSV ({exc})"
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return f"not valid YAML ({problem}{f' at line {mark.line + 1}' if mark else ''})"
    text = str(exc)
    if isinstance(exc, ValueError) and "int_max_str_digits" in text:  # int() of a long decimal (YAML, CSV, ...)
        return _too_long_int()
    first = text.splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


def shown(value: Any, limit: int = 60) -> str:
    """repr(value) for a one-line message, its head only past `limit` characters: a refusal quotes what it refuses,
    and a 200 KB field or a 4300-digit number quoted whole would bury the line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 25]}... ({len(text):,} characters)"


@contextmanager
def refuse_malformed(where: str | Callable[[], str], error: Callable[[str], UserError]) -> Iterator[None]:
    """Read a user's file inside this: what the parsers raise for a malformed input (`MALFORMED`, and this module's
    InputError, which names no file) becomes `error("WHERE: what is wrong")`, one line, its cause dropped. `where`
    names the file (or file:line); a callable is asked when the error comes, for readers whose line moves on (csv).
    Any other UserError raised inside passes as it is (it names its place already)."""
    try:
        yield
    except InputError as exc:
        raise error(f"{where() if callable(where) else where}: {exc}") from None
    except UserError:
        raise
    except MALFORMED as exc:
        raise error(f"{where() if callable(where) else where}: {describe_malformed(exc)}") from None


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
