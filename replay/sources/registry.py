"""Every workload source by the name `--source` gives it, for both drivers: what it reads, whether it carries text,
times or block hashes, and how it is loaded. The drivers take their choices, their checks of the command line and
their loading from here, so a source is added once.

- `kvtier replay --source NAME` takes every source here;
- `kvtier bench --source NAME` takes the block-hash traces (`block_trace_names`); its ShareGPT and BurstGPT runs are
  asked for by --dataset-path and --use-burst-trace, and loaded through the same entries.

`check_source` raises a ValueError of one line (what the user gave, what is missing), which the drivers' configuration
models turn into their one-line refusal. Loading imports the source's module then, not before.

`check_reads` is the one place that says which source reads which of a driver's workload options (`REPLAY_READS`,
`BENCH_TRACE_READS`): an option given a value other than its default that the chosen source does not read is refused,
never silently ignored. A value equal to the default changes nothing, so a configuration written back and read
again (results files, MPI ranks, `--num-clients` children) passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .block_traces import FORMATS, UNTIMED_FORMATS
from .target_hit_rate import DEFAULT_BLOCK_TOKENS

__all__ = [
    "BENCH_TRACE_READS",
    "MIN_TRACE_SPEEDUP",
    "REPLAY_READS",
    "SOURCES",
    "Source",
    "block_trace_names",
    "check_paced",
    "check_reads",
    "check_source",
    "source_names",
]

# The slowest a timed trace may be replayed: a thousand times slower than it was recorded. Far below it the arrival
# times leave any clock (--trace-speedup 1e-300 puts the second row 10^300 s out).
MIN_TRACE_SPEEDUP = 1e-3


@dataclass(frozen=True)
class Source:
    """One workload source. `path_flag`: the flag of `kvtier replay` that names its input (None: it reads nothing);
    `path_what`: what that flag is given. `block_tokens`: a block-hash trace's block in tokens (None: not one)."""

    name: str
    path_flag: str | None
    path_what: str
    has_text: bool  # prompts from the dataset's own text (else made up to the token counts)
    timed: bool  # arrival times from the input (--trace-speedup scales them)
    block_tokens: int | None
    _load: Callable[..., Any] | None

    @property
    def block_trace(self) -> bool:
        return self.block_tokens is not None

    def load(self, path: str, **options: Any) -> Any:
        """Read `path`: a block-hash trace gives a `BlockTrace`, any other source `(conversations, LoadReport)`.
        `options` are its loader's (`max_requests`, `max_context_tokens`, ...); a WorkloadError for a bad input."""
        if self._load is None:
            raise TypeError(f"--source {self.name} reads no input")
        return self._load(path, **options)


def _load_sharegpt(path: str, *, max_requests: int | None = None, **options: Any) -> Any:
    from .sharegpt import load_sharegpt

    return load_sharegpt(path, max_conversations=max_requests, **options)


def _load_burstgpt(path: str, **options: Any) -> Any:
    from .burstgpt import load_burstgpt

    return load_burstgpt(path, **options)


def _block_trace_loader(fmt: str) -> Callable[..., Any]:
    def load(path: str, **options: Any) -> Any:
        from .block_traces import load_block_trace

        return load_block_trace(path, fmt, **options)

    return load


SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("sharegpt", "--dataset-path", "FILE", True, False, None, _load_sharegpt),
        Source("burstgpt", "--trace-path", "FILE|DIR|GLOB", False, True, None, _load_burstgpt),
        Source("synthetic", None, "", False, False, None, None),
        *(
            Source(
                fmt,
                "--dataset-path",
                f"FILE (a {fmt} trace)",
                False,
                fmt not in UNTIMED_FORMATS,
                block,
                _block_trace_loader(fmt),
            )
            for fmt, block in FORMATS.items()
        ),
        # a block-hash trace made to a hit rate (--target-hit-rate): replay/sources/target_hit_rate.py
        Source("hit-rate", None, "", False, False, DEFAULT_BLOCK_TOKENS, None),
    )
}


def source_names() -> tuple[str, ...]:
    return tuple(SOURCES)


def block_trace_names() -> tuple[str, ...]:
    return tuple(name for name, s in SOURCES.items() if s.block_trace)


def check_source(
    name: str,
    inputs: dict[str, str | None],
    *,
    choices: tuple[str, ...] | None = None,
    block_tokens: int | None = None,
) -> Source:
    """The source `name` with the inputs given (flag -> value, None when not given), checked: a known name (of
    `choices` when given), its input given, no input it would not read, `block_tokens` only for a block-hash trace.
    A ValueError of one line otherwise."""
    choices = source_names() if choices is None else choices
    if name not in choices or name not in SOURCES:
        kind = "a block-hash trace format" if choices == block_trace_names() else "a known source"
        raise ValueError(f"--source {name}: not {kind} (known: {', '.join(choices)})")
    source = SOURCES[name]
    if source.path_flag is not None and not inputs.get(source.path_flag):
        raise ValueError(f"--source {name} needs {source.path_flag} {source.path_what}")
    if source.path_flag is None:
        given = next((flag for flag, value in inputs.items() if value), None)
        if given is not None:
            readers = " or ".join(n for n, s in SOURCES.items() if s.path_flag and not s.block_trace)
            raise ValueError(f"{given} is not read by --source {name} (give --source {readers})")
    if block_tokens is not None and not source.block_trace:
        traces = ", ".join(block_trace_names())
        raise ValueError(f"--trace-block-tokens rescales a block-hash trace ({traces}), not {name}")
    return source


def check_paced(source: Source, paced: bool) -> None:
    """A block-hash trace without times (ServeGen offline) is paced by the run: refuse (a ValueError of one line) a
    run that gives no pace (`paced`: the driver was given a closed loop, a concurrency or a rate)."""
    if source.block_trace and not source.timed and not paced:
        raise ValueError(
            f"--source {source.name} has no arrival times: give --users N (a closed loop of N requests in flight), "
            "--max-concurrency N or --request-rate R"
        )


def _synthetic(s: Source, _cfg: Any) -> bool:
    return s.name == "synthetic"


def _made_up(s: Source, _cfg: Any) -> bool:
    """A workload the run makes to the lengths asked for (synthetic, hit-rate), not one a dataset gives."""
    return s.path_flag is None


def _hit_rate(s: Source, _cfg: Any) -> bool:
    return s.name == "hit-rate"


# kvtier replay: option -> (which sources read it, what the refusal adds). Options every source reads are not here.
REPLAY_READS: dict[str, tuple[Callable[[Source, Any], bool], str]] = {
    "trace_speedup": (lambda s, _c: s.timed, "its requests have no times; --request-rate paces them"),
    "trace_timing": (lambda s, _c: s.block_trace, "it is not a block-hash trace"),
    "max_idle_s": (
        lambda s, c: s.block_trace and c.trace_timing == "think",
        "it caps the pauses of --trace-timing think",
    ),
    "input_len": (_made_up, "the dataset gives the lengths"),
    "range_ratio": (_synthetic, "the dataset gives the lengths"),
    "prefix_len": (_synthetic, "the dataset gives the prompts"),
    "prefix_groups": (_synthetic, "the dataset gives the prompts"),
    "turns": (_synthetic, "the dataset gives the sessions"),
    "target_hit_rate": (_hit_rate, "it synthesizes its own workload: leave --source out"),
    "cache_tokens": (_hit_rate, "it sizes the workload of --target-hit-rate"),
    "output_len": (
        lambda s, c: s.path_flag is None or bool(c.rounds),
        "the dataset gives the answers' lengths; --max-tokens N fixes them",
    ),
}

# kvtier bench --source (a block-hash trace): the workload options of its other sources, which a trace does not read.
BENCH_TRACE_READS: dict[str, tuple[Callable[[Source, Any], bool], str]] = {
    "max_conversations": (lambda s, _c: not s.block_trace, "--max-requests N takes the trace's first N requests"),
    "replay_cycles": (lambda s, _c: not s.block_trace, "a trace is replayed once, its hash ids as they are"),
    "burst_trace_path": (lambda s, _c: not s.block_trace, "the trace is --dataset-path"),
    "trace_speedup": (lambda s, _c: s.timed, "its requests have no times: they run in the file's order"),
    "max_idle_s": (lambda _s, c: c.trace_timing == "think", "it caps the pauses of --trace-timing think"),
    "target_hit_rate": (_hit_rate, "it synthesizes its own workload: leave --source out"),
    "cache_tokens": (_hit_rate, "it sizes the workload of --target-hit-rate"),
    "input_len": (_hit_rate, "the trace gives the lengths"),
    "output_len": (_hit_rate, "the trace gives the lengths"),
}


def check_reads(cfg: Any, source: Source, reads: dict[str, tuple[Callable[[Source, Any], bool], str]]) -> None:
    """Refuse (a ValueError of one line) an option of `reads` that `cfg` sets to other than its default while
    `source` does not read it."""
    fields = type(cfg).model_fields
    for key, (reads_it, why) in reads.items():
        if getattr(cfg, key) != fields[key].default and not reads_it(source, cfg):
            flag = "--" + key.replace("_", "-")
            raise ValueError(f"{flag} is not read by --source {source.name} ({why})")
