"""Where the benchmark's sessions come from: synthetic users, ShareGPT conversations or a BurstGPT trace.

Every source yields `Session`s (a conversation plus who runs it: profile, QoS class, system prompt). Closed-loop
sources (synthetic, ShareGPT, BurstGPT with --trace-speedup 0) hand the next session to whichever user asks;
the timed source (BurstGPT with a speed-up) releases sessions at their trace timestamps.

Every request's size is bounded: datasets are cut to the model's context length as they load (counted in the load
report), and `entry_tokens` bounds each entry the driver writes by the context length and by what the largest tier
can hold, counting each cut by reason (`truncated_requests`), so no input row can make an unbounded request.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..sources.base import Conversation, LoadReport, WorkloadError
from ..sources.burstgpt import load_burstgpt
from ..sources.sharegpt import load_sharegpt
from ..sources.synthetic_users import SyntheticUser
from .config import BenchConfig, UserTemplate


@dataclass(frozen=True, slots=True)
class Session:
    session_id: str
    conversation: Conversation
    profile: str
    qos: str
    system_prompt: int | None
    # Added to the turns' arrival times (timed sources replayed for several cycles).
    offset_s: float = 0.0


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
        if cfg.dataset_path:
            self.kind = "sharegpt"
            self.conversations, self.report = load_sharegpt(
                cfg.dataset_path,
                cfg.max_conversations,
                min_turns=cfg.sharegpt.min_turns,
                max_turn_tokens=cfg.sharegpt.max_turn_tokens,
                max_context_tokens=max_context_tokens,
            )
        elif cfg.use_burst_trace:
            self.kind = "burstgpt"
            self.conversations, self.report = load_burstgpt(cfg.burst_trace_path, max_context_tokens=max_context_tokens)
        else:
            self.kind = "synthetic"
        self.timed = self.kind == "burstgpt" and cfg.trace_speedup > 0
        self._next = 0
        self._cycle = 0
        self._qos_names = sorted(cfg.qos_distribution)
        self._qos_weights = [cfg.qos_distribution[n] for n in self._qos_names]
        self._templates = sorted(cfg.user_templates)
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
        return User(user_id, name, self.cfg.user_templates[name], qos, rng)

    def _system_prompt(self, rng: random.Random) -> int | None:
        pc = self.cfg.prefix_cache
        if self.cfg.disable_prefix_caching or not pc.system_prompts or rng.random() >= pc.probability:
            return None
        return rng.randrange(len(pc.system_prompts))

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
