"""The records every workload source yields and every driver consumes.

Sources (synthetic users, ShareGPT, BurstGPT, RAG, long sessions) turn their input into `Conversation`s; the
synthetic driver turns them into tiered-store operations, the OpenAI driver into HTTP requests. Nothing here knows
about either driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class WorkloadError(ValueError):
    """A workload input the user gave cannot be used (missing file, malformed row). The message names the file/line."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a conversation: the tokens the user adds and the tokens of the answer."""

    input_tokens: int
    output_tokens: int
    # Offset from the start of the trace, for sources that carry timing (BurstGPT); None means "as soon as possible".
    arrival_s: float | None = None
    # The user's message and the dataset's answer, for sources that carry text (ShareGPT).
    text: str | None = None
    answer_text: str | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A session: turn N's context is every earlier turn plus its own input, so turn N reuses turn N-1's KV."""

    conversation_id: str
    turns: tuple[Turn, ...]
    system_prompt: str | None = None


@dataclass(slots=True)
class LoadReport:
    """What a loader kept and dropped, reported in the results so nobody wonders where rows went."""

    source: str
    conversations: int = 0
    turns: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    tokenizer: str = "none"

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count
