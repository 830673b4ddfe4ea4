"""Synthetic users: each user has a profile (chatbot, coding, document) and runs conversation after conversation.

Turn sizes come from the profile's ranges (MLPerf KV Cache spec section 4.1); a conversation ends after each turn with
`end_conversation_probability`, so conversation length is geometric (one turn when multi-turn is disabled), capped at
`max_turns` turns.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from .base import Conversation, Turn


@dataclass(frozen=True, slots=True)
class SyntheticUser:
    user_id: int
    profile: str
    context_tokens: tuple[int, int]
    generate_tokens: tuple[int, int]
    think_time_s: tuple[float, float]

    def conversations(
        self, rng: random.Random, multi_turn: bool, end_probability: float, max_turns: int
    ) -> Iterator[Conversation]:
        n = 0
        while True:
            turns = []
            while True:
                turns.append(
                    Turn(
                        input_tokens=rng.randint(*self.context_tokens), output_tokens=rng.randint(*self.generate_tokens)
                    )
                )
                if not multi_turn or len(turns) >= max_turns or rng.random() < end_probability:
                    break
            yield Conversation(f"u{self.user_id}-c{n}", tuple(turns))
            n += 1
