"""The Weka / SemiAnalysis agentic-coding traces (callanjfox/kv-cache-tester ``traces/``, Apache-2.0; Hugging Face
semianalysisai/cc-traces-weka-*): one conversation a file, its API calls and its sub-agents, on one timeline.

A file is ``id``, ``block_size`` (64), ``hash_id_scope`` (``local``: ids are a namespace of their file; ``global``:
one namespace for every file) and ``requests``: API calls (``type`` ``n`` or ``s``: ``t``, ``in``, ``out``,
``hash_ids``, and as recorded ``api_time`` and ``think_time`` in seconds) and sub-agents (``type`` ``subagent``:
``t`` its spawn, ``agent_id``, ``duration_ms``, and ``requests`` of their own, nested as deep as they go).

Times. A parent's ``t`` counts from the conversation's start; a sub-agent's calls count from its spawn in the
published files (trace_0291.json spawns at 1148.013 s and 1180.553 s, whose calls have t = 0, 5, 11, ...), from the
conversation's start in older ones. AIPerf 0.13 places them with one rule (ai-dynamo/aiperf,
src/aiperf/dataset/loader/weka_trace.py, ``_subagent_request_absolute_t``): an inner ``t`` below the spawn's ``t``
gets the spawn's ``t`` added. Here the rule is applied once per sub-agent, to its first entry, and its form holds
for the rest: in the relative form every entry gets the spawn's ``t`` added (a late call of a short-spawned
sub-agent, t = 11 after a spawn at 6, stays relative where AIPerf would read it as absolute); in the absolute form
an entry before the spawn is inconsistent and refused. Nested sub-agents the same way, their spawn read in the form
of the sub-agent around them. A call before the previous call of its session, and a sub-agent spawning an
``agent_id`` of its own ancestry (a loop of spawns), are refused too: one line naming the file and the call path.

Sessions. Each conversation and each sub-agent is a session; a call carries what it waits for when replayed closed
loop (``--trace-timing think``): the previous call of its session (a sub-agent's first call: the call of its parent
before the spawn), the pause after it ended (the call's ``think_time``, else ``t[n] - (t[n-1] + api_time[n-1])``;
for a sub-agent's first call the time from that parent call's end to it), and the sub-agents it joins. A sub-agent
joins the first later call of its parent whose ``t`` is at or after the sub-agent's recorded end (its spawn plus
``duration_ms``, else its last call's end): AIPerf's SPAWN_JOIN placement, the same function's module; a sub-agent
that no later call outlasts runs in the background. A sub-agent's calls run one after another (AIPerf packs
overlapping ones into parallel streams; none of the published sub-agents checked overlaps).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from replay.common.json_files import loads_json, refuse_malformed, shown
from replay.sources.base import WorkloadError, parse_number, read_text

from .trace_request import TraceRequest, request_of, value_text

__all__ = ["read_weka"]

# A recorded end this close to a call's t counts as before it (AIPerf's _JOIN_EPSILON_SECONDS).
_JOIN_EPSILON_S = 1e-6


@dataclass
class _Call:
    where: str
    t: float  # on the conversation's timeline
    req: TraceRequest
    session: int
    after: int  # position in the file's calls of the call it follows; -1: the conversation's start
    delay_s: float
    api_s: float | None
    joins: list[int] = field(default_factory=list)  # positions of the last calls of the sub-agents it waits for

    @property
    def end(self) -> float:
        return self.t + (self.api_s or 0.0)


def read_weka(path: str | os.PathLike, block: int, check: Callable[[], None]) -> Iterator[TraceRequest]:
    """Every call of every file, on absolute times, in time order (equal times keep the files' order), each with its
    session's links (TraceRequest.session, after, joins, delay_s, api_s) as indexes into what is yielded."""
    # Every file is read before the first call is yielded (calls are sorted by time), so `check` is asked per file.
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".json"))
        if not files:
            raise WorkloadError(f"{path}: no *.json Weka trace in this directory")
    else:
        files = [os.fspath(path)]
    dense: dict[tuple[int, int], int] = {}  # (namespace, id) -> an id unique across the files
    calls: list[_Call] = []
    sessions = 0
    for n, file in enumerate(files):
        check()
        doc = _document(file, block)
        scope = -1 if doc["hash_id_scope"] == "global" else n
        walk = _Walk(block, base=len(calls), first_session=sessions)
        walk.session(doc["requests"], f"{file}: requests", spawn_t=0.0, relative=False, anchor=-1, ancestry=())
        for c in walk.calls:
            ids = tuple(dense.setdefault((scope, h), len(dense)) for h in c.req.hash_ids)
            c.req = TraceRequest(c.t, c.req.input_tokens, c.req.output_tokens, ids)
        calls.extend(walk.calls)
        sessions = walk.next_session
    order = sorted(range(len(calls)), key=lambda i: (calls[i].t, i))
    index = {pos: k for k, pos in enumerate(order)}
    for pos in order:
        c = calls[pos]
        yield TraceRequest(
            c.t,
            c.req.input_tokens,
            c.req.output_tokens,
            c.req.hash_ids,
            session=c.session,
            after=index[c.after] if c.after >= 0 else -1,
            joins=tuple(index[j] for j in c.joins),
            delay_s=c.delay_s,
            api_s=c.api_s,
        )


def _document(file: str, block: int) -> dict:
    with refuse_malformed(file, WorkloadError):
        try:
            doc = loads_json(read_text(file, "Weka trace (JSON)"))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{file}:{exc.lineno}: not JSON ({exc.msg}); is this a Weka trace?") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise WorkloadError(f"{file}: not a Weka trace (expected an object with a requests list)")
    if doc.get("block_size") != block:
        size = shown(doc.get("block_size"))
        raise WorkloadError(f"{file}: block_size {size}; a Weka trace's blocks are {block} tokens")
    if doc.get("hash_id_scope") not in ("local", "global"):
        raise WorkloadError(f"{file}: hash_id_scope {shown(doc.get('hash_id_scope'))} is not local or global")
    return doc


def _seconds(entry: dict, key: str, where: str) -> float | None:
    value = entry.get(key)
    return None if value is None else parse_number(value_text(value), where, key)


class _Walk:
    """One file's sessions walked depth first: its calls in list order (positions offset by `base`, the calls of
    the files before it), each placed on the conversation's timeline and linked to what it waits for."""

    def __init__(self, block: int, base: int, first_session: int) -> None:
        self.block, self.base, self.next_session = block, base, first_session
        self.calls: list[_Call] = []

    def _end_of(self, anchor: int) -> float:
        return 0.0 if anchor < 0 else self.calls[anchor - self.base].end

    def session(
        self, entries: list, where: str, *, spawn_t: float, relative: bool, anchor: int, ancestry: tuple[str, ...]
    ) -> tuple[int, float | None]:
        """Place a session's entries; `anchor` is the call whose end its first call follows. Returns (position of
        its last call or -1, the end of its last call or None)."""
        number = self.next_session
        self.next_session += 1
        prev = -1  # this session's previous call
        prev_t = None
        children: list[tuple[float, int, str]] = []  # spawned, not joined yet: (recorded end, last call, where)
        last_end = None
        for i, entry in enumerate(entries):
            here = f"{where}[{i}]"
            if not isinstance(entry, dict) or "type" not in entry:
                raise WorkloadError(f"{here}: expected an object with a type")
            if entry["type"] == "subagent":
                if not isinstance(entry.get("requests"), list):
                    raise WorkloadError(f"{here}: a subagent without a requests list")
            elif entry["type"] not in ("n", "s"):
                raise WorkloadError(f"{here}: type {shown(entry['type'])} is not n, s or subagent")
            if "t" not in entry:
                raise WorkloadError(f"{here}: missing t (every Weka call and sub-agent has one)")
            t = parse_number(value_text(entry["t"]), here, "t")
            if i == 0 and ancestry:  # a sub-agent's first entry says in which form its times are
                relative = t + _JOIN_EPSILON_S < spawn_t
            if relative:
                t += spawn_t
            elif t + _JOIN_EPSILON_S < spawn_t:
                raise WorkloadError(
                    f"{here}: t {t:g} s is before its sub-agent's spawn at {spawn_t:g} s, and the sub-agent's first "
                    "entry gave times from the conversation's start"
                )
            if entry["type"] == "subagent":
                agent = entry.get("agent_id")
                name = shown(agent) if agent is not None else f"at {here}"
                if agent is not None and shown(agent) in ancestry:
                    raise WorkloadError(f"{here}: sub-agent {name} is spawned inside itself (a loop of spawns)")
                last, end = self.session(
                    entry["requests"],
                    f"{here}.requests",
                    spawn_t=t,
                    relative=False,
                    anchor=prev if prev >= 0 else anchor,
                    ancestry=(*ancestry, name),
                )
                duration = _seconds(entry, "duration_ms", here)
                recorded_end = t + duration / 1000.0 if duration is not None else end
                if last >= 0 and recorded_end is not None:
                    children.append((recorded_end, last, here))
                continue
            missing = [k for k in ("in", "out") if k not in entry]
            if missing:
                raise WorkloadError(f"{here}: missing {', '.join(missing)} (a Weka call has t, in, out, hash_ids)")
            if prev_t is not None and t + _JOIN_EPSILON_S < prev_t:
                raise WorkloadError(f"{here}: t {t:g} s is before the previous call of its session ({prev_t:g} s)")
            req = request_of(here, t, entry, "in", "out", self.block)
            api_s = _seconds(entry, "api_time", here)
            think = _seconds(entry, "think_time", here)
            if prev >= 0 and think is not None:
                delay = think
            else:  # from the end of what it follows: its session's previous call, or the parent's before the spawn
                delay = max(0.0, t - self._end_of(prev if prev >= 0 else anchor))
            pos = self.base + len(self.calls)
            call = _Call(here, t, req, number, prev if prev >= 0 else anchor, delay, api_s)
            # the sub-agents this call outlasts in the recording: it waits for them (SPAWN_JOIN)
            call.joins = [last for end, last, _ in children if t + _JOIN_EPSILON_S >= end]
            children = [c for c in children if t + _JOIN_EPSILON_S < c[0]]
            self.calls.append(call)
            prev, prev_t, last_end = pos, t, call.end
        return prev, last_end
