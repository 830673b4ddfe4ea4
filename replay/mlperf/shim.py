"""`kvtier mlperf shim DIR`: a directory the MLPerf Storage KV cache harness runs as it runs the reference's.

mlpstorage (`mlpstorage <closed|open|whatif> kvcache run --kvcache-bin-path DIR/kv-cache.py`) starts
`mpirun ... <its python> DIR/mlperf_wrapper.py --rank-output-base ... --rank-cache-base ... --seed-base ...
--config DIR/config.yaml <the Option's flags>` (mlpstorage_py/benchmarks/kvcache.py at 2f65ef1, `_execute_run`).
The shim holds:
- mlperf_wrapper.py: kvtier's own wrapper with the reference wrapper's command line (wrapper_script.py);
- kv-cache.py: runs `kvtier bench` with the arguments given, under the Python that wrote the shim and that
  kvtier's code (kvcache_script.py);
- config.yaml: the --config the harness passes; `{}`, i.e. kvtier bench's defaults, unless replaced.

The two scripts are the modules beside this one, copied with their marked lines rewritten (the Python, kvtier's
directory, the wrapper's delays), so what runs is what the tests import. A file of those names that is not a shim's
is never written over (DIR could be the reference's own kv_cache_benchmark/).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvconnector.errors import ConfigError
from kvconnector.files import atomic_path

from . import kvcache_script, wrapper_script

MARK = "# written by `kvtier mlperf shim`"
ROOT = Path(__file__).resolve().parents[2]  # the directory holding kvtier's packages (replay/, kvconnector/, ...)

CONFIG_TEXT = f"""{MARK}
# The --config that mlpstorage passes to every rank (the file beside kv-cache.py; in OPEN its own --config names
# another). Empty: kvtier bench's defaults, whose request model is the MLPerf reference's. Any key of
# `kvtier bench --config` may be set here; the reference's own config.yaml is read as it is.
{{}}
"""


def _kvtier_version() -> str:
    try:
        return version("kvtier")
    except PackageNotFoundError:
        return "unknown"


def _rewrite(source: str, lines: dict[str, str]) -> str:
    """`source` with each key line (whole, exactly once) replaced by its value, and MARK after the shebang."""
    out = source.splitlines(keepends=True)
    for old, new in lines.items():
        at = [i for i, line in enumerate(out) if line.rstrip("\n") == old]
        if len(at) != 1:  # the script and this table disagree: a bug, never the user's
            raise RuntimeError(f"shim: {old!r} found {len(at)} times in the script")
        out[at[0]] = new + "\n"
    return "".join([out[0], f"{MARK} (kvtier {_kvtier_version()})\n", *out[1:]])


def scripts(python: str, root: Path, start_delay_s: float, end_delay_s: float) -> dict[str, str]:
    """{file name: text} of a shim."""
    kvcache = Path(kvcache_script.__file__).read_text(encoding="utf-8")
    wrapper = Path(wrapper_script.__file__).read_text(encoding="utf-8")
    return {
        "kv-cache.py": _rewrite(
            kvcache,
            {
                "KVTIER_PYTHON = sys.executable": f"KVTIER_PYTHON = {python!r}",
                "KVTIER_ROOT = str(Path(__file__).resolve().parents[2])": f"KVTIER_ROOT = {str(root)!r}",
            },
        ),
        "mlperf_wrapper.py": _rewrite(
            wrapper,
            {
                "START_DELAY_S = 90": f"START_DELAY_S = {start_delay_s:g}",
                "END_DELAY_S = 90": f"END_DELAY_S = {end_delay_s:g}",
            },
        ),
        "config.yaml": CONFIG_TEXT,
    }


def write_shim(directory: str, start_delay_s: float = 90, end_delay_s: float = 90) -> list[Path]:
    """Write the shim into `directory` (made if missing); return the files written. Refuses (ConfigError) a
    directory that cannot be made or written, and a file of a shim's names that no shim wrote."""
    if start_delay_s < 0 or end_delay_s < 0:
        raise ConfigError(f"--start-delay {start_delay_s:g} / --end-delay {end_delay_s:g}: seconds, at least 0")
    target = Path(directory)
    files = scripts(sys.executable, ROOT, start_delay_s, end_delay_s)
    for name in files:
        path = target / name
        if path.is_symlink() or (path.exists() and not _is_shim(path)):
            raise ConfigError(f"{path}: exists and is no kvtier shim's; give an empty or new directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{directory}: cannot make the directory ({exc.strerror})") from exc
    if not target.is_dir():
        raise ConfigError(f"{directory}: not a directory")
    written = []
    for name, text in files.items():
        written.append(_write(target / name, text, 0o644 if name.endswith(".yaml") else 0o755))
    return written


def _is_shim(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return MARK in head


def _write(path: Path, text: str, mode: int) -> Path:
    """Whole or not at all (a temp file beside it, then a rename): a harness never runs half a script."""
    try:
        with atomic_path(path, suffix=".shim.tmp", mode=mode) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    return path
