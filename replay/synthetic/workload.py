"""Where the benchmark's sessions come from: synthetic users, ShareGPT conversations or a BurstGPT trace.

Every source yields `Session`s (a conversation plus who runs it: profile, QoS class, system prompt). Closed-loop
sources (synthetic, ShareGPT, BurstGPT with --trace-speedup 0) hand the next session to whichever user asks;
the timed source (BurstGPT with a speed-up) releases sessions at their trace timestamps.

Every request's size is bounded: datasets are cut to the model's context length as they load (counted in the load
report), and `entry_tokens` bounds each entry the driver writes by the context length and by what the largest tier
can hold, counting each cut by reason (`truncated_requests`), so no input row can make an unbounded request.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..sources.base import Conversation, LoadReport, Turn, WorkloadError
from ..sources.block_traces import BlockTrace
from ..sources.registry import SOURCES
from ..sources.sharegpt import default_token_counter
from ..sources.synthetic_users import SyntheticUser
from ..sources.trace_timing import has_sessions
from .config import REFERENCE_BURST_TRACE_PATH, BenchConfig, UserTemplate


def sharegpt_counter(chars_per_token: float):
    """tiktoken's counter when its data is here, else len(text) / chars_per_token (sharegpt.chars_per_token_estimate);
    returns (counter, name for the load report)."""
    count, name = default_token_counter()
    if not name.startswith("estimate") or chars_per_token == 4:
        return count, name

    def estimate(text: str) -> int:
        return max(1, math.ceil(len(text) / chars_per_token)) if text else 0

    return estimate, name.replace("chars/4", f"chars/{chars_per_token:g}")


def cut_turns(
    conversations: list[Conversation], max_input: int | None, max_output: int | None, report: LoadReport
) -> list[Conversation]:
    """Turns' input / answer tokens cut to sharegpt.max_context_tokens / max_generation_tokens, each cut counted."""
    if max_input is None and max_output is None:
        return conversations
    out = []
    for conv in conversations:
        turns = []
        for t in conv.turns:
            inp, outp = t.input_tokens, t.output_tokens
            if max_input is not None and inp > max_input:
                inp = max_input
                report.truncated["over_sharegpt_max_context_tokens"] = (
                    report.truncated.get("over_sharegpt_max_context_tokens", 0) + 1
                )
            if max_output is not None and outp > max_output:
                outp = max_output
                report.truncated["over_sharegpt_max_generation_tokens"] = (
                    report.truncated.get("over_sharegpt_max_generation_tokens", 0) + 1
                )
            turns.append(
                t
                if (inp, outp) == (t.input_tokens, t.output_tokens)
                else Turn(inp, outp, t.arrival_s, t.text, t.answer_text)
            )
        out.append(Conversation(conv.conversation_id, tuple(turns), conv.system_prompt))
    return out


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    conversation: Conversation
    profile: str
    qos: str
    system_prompt: int | None
    # Added to the turns' arrival times (timed sources replayed for several cycles).
    offset_s: float = 0.0


def reference_user_ranges(template: UserTemplate, rng: random.Random) -> UserTemplate:
    """The MLPerf reference's users: a user's context C, answer A and think time T are drawn once from the
    profile's ranges (UserSimulator.generate_user in kv_cache_benchmark/kv_cache/workload.py of mlcommons/storage),
    and each request then draws its context from [C/4, C], its answer from [A/4, A] and its think time from
    [0.8T, 1.2T] (user_worker in kv_cache/benchmark.py). Drawing every request from the profile's whole range
    instead makes requests larger on average and far more of them reach the 10,000 tokens above which the reference
    writes without decoding: the device's read:write mix then differs from the reference's several-fold."""
    context = rng.randint(*template.context_tokens)
    answer = rng.randint(*template.generate_tokens)
    think = rng.uniform(*template.think_time_s)
    return template.model_copy(
        update={
            "context_tokens": (max(1, context // 4), context),
            "generate_tokens": (min(answer, max(1, answer // 4)), answer),
            "think_time_s": (0.8 * think, 1.2 * think),
        }
    )


@dataclass
class User:
    """One simulated user: a worker that runs sessions one after another until told to stop."""

    user_id: int
    profile: str
    template: UserTemplate
    qos: str
    rng: random.Random
    stop: bool = False
    _conversations: Iterator[Conversation] | None = field(default=None, repr=False)

    def think_time(self, throughput_profile: bool) -> float:
        return 0.0 if throughput_profile else self.rng.uniform(*self.template.think_time_s)


class Workload:
    def __init__(self, cfg: BenchConfig, seed: int, max_context_tokens: int | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self._rng = random.Random(seed ^ 0x5EED)
        self._lock = threading.Lock()
        self.report: LoadReport | None = None
        self.conversations: list[Conversation] = []
        self.max_context_tokens = max_context_tokens
        # Bound on one entry's tokens and the limit that sets it; see set_entry_limit.
        self._entry_limit, self._entry_reason = max_context_tokens, "over_max_context_tokens"
        self.truncated_requests: dict[str, int] = {}
        self.block_trace: BlockTrace | None = None
        if cfg.source == "hit-rate":  # made by TraceBlocks, which knows the tiers' room (--cache-tokens' default)
            self.kind = "block_trace"
            if cfg.trace_timing == "think":
                raise WorkloadError("--trace-timing think paces sessions' calls; --target-hit-rate's have no pauses")
        elif cfg.source:
            self.kind = "block_trace"
            try:
                self.block_trace = SOURCES[cfg.source].load(
                    cfg.dataset_path,
                    block_tokens=cfg.trace_block_tokens,
                    max_requests=cfg.max_requests or None,
                    max_context_tokens=max_context_tokens,
                    # a timed run reads no row past its window (rows are in arrival order); under the think timing a
                    # session's calls go when the calls before them end, whatever their recorded times
                    until_s=cfg.duration * cfg.trace_speedup
                    if cfg.trace_speedup and cfg.trace_timing == "timestamps"
                    else None,
                )
            except WorkloadError as exc:
                raise WorkloadError(f"--dataset-path {exc}") from exc
            if cfg.trace_timing == "think" and not has_sessions(self.block_trace):
                raise WorkloadError(
                    f"--dataset-path {cfg.dataset_path}: --trace-timing think paces sessions' calls, and this "
                    f"{cfg.source} trace has none"
                )
            self.report = self.block_trace.report
        elif cfg.dataset_path:
            self.kind = "sharegpt"
            count, name = sharegpt_counter(cfg.sharegpt.chars_per_token_estimate)
            self.conversations, self.report = SOURCES["sharegpt"].load(
                cfg.dataset_path,
                max_requests=cfg.max_conversations,
                min_turns=cfg.sharegpt.min_turns,
                max_turn_tokens=cfg.sharegpt.max_turn_tokens,
                max_context_tokens=max_context_tokens,
                count_tokens=count,
                tokenizer_name=name,
            )
            self.conversations = cut_turns(
                self.conversations, cfg.sharegpt.max_context_tokens, cfg.sharegpt.max_generation_tokens, self.report
            )
        elif cfg.use_burst_trace:
            self.kind = "burstgpt"
            try:
                self.conversations, self.report = SOURCES["burstgpt"].load(
                    cfg.burst_trace_path, max_context_tokens=max_context_tokens
                )
            except WorkloadError as exc:
                hint = ""
                if cfg.burst_trace_path == REFERENCE_BURST_TRACE_PATH:
                    hint = " (the reference's default path; give --burst-trace-path FILE|DIR|GLOB)"
                raise WorkloadError(f"--burst-trace-path {exc}{hint}") from exc
        else:
            self.kind = "synthetic"
        self.timed = self.kind == "burstgpt" and cfg.trace_speedup > 0
        self._next = 0
        self._cycle = 0
        self._qos_names = sorted(cfg.qos_distribution)
        self._qos_weights = [cfg.qos_distribution[n] for n in self._qos_names]
        self._templates = sorted(cfg.user_templates)
        # System prompts with cached prefixes: the first max_prefix_entries (0 = all) of at least min_prefix_length.
        pc = cfg.prefix_cache
        self._prompts = [
            i
            for i, p in enumerate(pc.system_prompts[: pc.max_prefix_entries or None])
            if p.tokens >= pc.min_prefix_length
        ]
        self.rag_docs: list[int] = []  # chunks of each RAG document (rag_documents)
        self._template_weights = [cfg.user_templates[n].weight for n in self._templates]
        if self.kind == "burstgpt" and cfg.enable_autoscaling and self.timed:
            raise WorkloadError("--enable-autoscaling needs closed-loop users: use --trace-speedup 0 with a trace")

    def set_entry_limit(self, tier_tokens: int) -> None:
        """Entries are also bounded by what the largest tier takes (`tier_tokens`): the tighter bound wins."""
        if self._entry_limit is None or tier_tokens < self._entry_limit:
            self._entry_limit, self._entry_reason = tier_tokens, "over_tier_capacity"

    def entry_tokens(self, tokens: int) -> int:
        """`tokens` cut to the entry bound; each cut counted by the limit that made it."""
        if self._entry_limit is None or tokens <= self._entry_limit:
            return tokens
        self.truncated_requests[self._entry_reason] = self.truncated_requests.get(self._entry_reason, 0) + 1
        return self._entry_limit

    @property
    def span_s(self) -> float:
        arrivals = [t.arrival_s for c in self.conversations for t in c.turns if t.arrival_s is not None]
        return (max(arrivals) - min(arrivals)) if arrivals else 0.0

    # ---- users -----------------------------------------------------------------------------------------------------
    def new_user(self, user_id: int) -> User:
        rng = random.Random(self.seed * 1_000_003 + user_id)
        name = rng.choices(self._templates, weights=self._template_weights)[0]
        qos = rng.choices(self._qos_names, weights=self._qos_weights)[0]
        template = self.cfg.user_templates[name]
        if self.cfg.request_model == "reference":
            template = reference_user_ranges(template, rng)
        return User(user_id, name, template, qos, rng)

    def _system_prompt(self, rng: random.Random) -> int | None:
        pc = self.cfg.prefix_cache
        if self.cfg.disable_prefix_caching or not self._prompts or rng.random() >= pc.probability:
            return None
        return self._prompts[rng.randrange(len(self._prompts))]

    def rag_documents(self, large_model: bool) -> list[int]:
        """The chunk count of each RAG document (kept in `rag_docs`): --rag-num-docs documents, at most
        rag.max_documents (0 = no cap), of rag.chunks_per_doc chunks each, or, when the model's class of document
        token range is set (large: hidden_dim >= 8192 or >= 64 layers, as the reference decides), of
        ceil(tokens / chunk tokens) chunks for tokens drawn per document (seeded)."""
        rc = self.cfg.rag
        docs = min(self.cfg.rag_num_docs, rc.max_documents or self.cfg.rag_num_docs)
        lo, hi = (
            (rc.large_model_doc_tokens_min, rc.large_model_doc_tokens_max)
            if large_model
            else (rc.small_model_doc_tokens_min, rc.small_model_doc_tokens_max)
        )
        if lo is None and hi is None:
            self.rag_docs = [rc.chunks_per_doc] * docs
        else:
            lo = lo if lo is not None else hi
            hi = hi if hi is not None else lo
            if hi < lo:
                raise WorkloadError(f"rag doc tokens: min {lo} exceeds max {hi}")
            rng = random.Random(self.seed ^ 0xD0C)
            self.rag_docs = [max(1, -(-rng.randint(lo, hi) // rc.chunk_tokens)) for _ in range(docs)]
        return self.rag_docs

    def next_session(self, user: User) -> Session | None:
        """The next session for a closed-loop user, or None when the source is exhausted."""
        if self.kind == "synthetic":
            if user._conversations is None:
                t = user.template
                su = SyntheticUser(user.user_id, user.profile, t.context_tokens, t.generate_tokens, t.think_time_s)
                multi = not self.cfg.disable_multi_turn
                user._conversations = su.conversations(
                    user.rng, multi, self.cfg.conversation.end_probability, self.cfg.conversation.max_turns
                )
            conv = next(user._conversations)
            return Session(conv.conversation_id, conv, user.profile, user.qos, self._system_prompt(user.rng))
        with self._lock:
            if self._next >= len(self.conversations):
                self._cycle += 1
                if self.cfg.replay_cycles and self._cycle >= self.cfg.replay_cycles:
                    return None
                self._next = 0
            conv = self.conversations[self._next]
            self._next += 1
            cycle = self._cycle
        return Session(
            f"{conv.conversation_id}-cy{cycle}",
            self._turns_for(conv),
            self.kind,
            user.qos,
            self._system_prompt(user.rng),
        )

    def _turns_for(self, conv: Conversation) -> Conversation:
        if self.cfg.disable_multi_turn and len(conv.turns) > 1:
            return Conversation(conv.conversation_id, conv.turns[:1], conv.system_prompt)
        return conv

    # ---- timed (open loop) -----------------------------------------------------------------------------------------
    def timed_sessions(self) -> Iterator[Session]:
        """Sessions in arrival order, cycled `replay_cycles` times (0 = until the run ends)."""
        span = self.span_s + 1.0
        cycle = 0
        while not self.cfg.replay_cycles or cycle < self.cfg.replay_cycles:
            for conv in self.conversations:
                qos = self._rng.choices(self._qos_names, weights=self._qos_weights)[0]
                yield Session(
                    f"{conv.conversation_id}-cy{cycle}",
                    self._turns_for(conv),
                    self.kind,
                    qos,
                    self._system_prompt(self._rng),
                    offset_s=cycle * span,
                )
            cycle += 1
