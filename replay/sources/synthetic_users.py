"""Synthetic users: each user has a profile (chatbot, coding, document) and runs conversation after conversation.

Turn sizes come from the profile's ranges (MLPerf KV Cache spec section 4.1); a conversation ends after each turn with
`end_conversation_probability`, so conversation length is geometric (one turn when multi-turn is disabled).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from .base import Conversation, Turn

MAX_TURNS = 64


@dataclass(frozen=True, slots=True)
class SyntheticUser:
    user_id: int
    profile: str
    context_tokens: tuple[int, int]
    generate_tokens: tuple[int, int]
    think_time_s: tuple[float, float]

    def conversations(
        self, rng: random.Random, multi_turn: bool, end_probability: float, max_turns: int = MAX_TURNS
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

    def think_time(self, rng: random.Random) -> float:
        return rng.uniform(*self.think_time_s)


def make_users(num_users: int, profiles: dict, rng: random.Random) -> list[SyntheticUser]:
    """Profiles drawn by weight; `profiles` maps a name to anything with context_tokens, generate_tokens,
    think_time_s and weight."""
    names = sorted(profiles)
    weights = [profiles[n].weight for n in names]
    chosen = rng.choices(names, weights=weights, k=num_users)
    return [
        SyntheticUser(
            i,
            name,
            tuple(profiles[name].context_tokens),
            tuple(profiles[name].generate_tokens),
            tuple(profiles[name].think_time_s),
        )
        for i, name in enumerate(chosen)
    ]
