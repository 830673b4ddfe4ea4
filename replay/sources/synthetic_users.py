"""Synthetic users: each user has a profile (chatbot, coding, document) and runs conversation after conversation.

Turn sizes come from the profile's ranges (MLPerf KV Cache spec section 4.1); a conversation ends after each turn with
`end_conversation_probability`, so conversation length is geometric (one turn when multi-turn is disabled), capped at
`max_turns` turns.

Generation is lazy: a conversation's length is drawn up front (one draw from the geometric distribution, however
large `max_turns` is) and each turn is made when a driver first asks for it, so `max_turns: 100000000` with
`end_probability: 0` costs what the run actually sends, not 10^8 turns before the first request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .base import Conversation, Turn


def draw_turn_count(rng: random.Random, multi_turn: bool, end_probability: float, max_turns: int) -> int:
    """A conversation's length: 1 + the turns before the first end (each turn ends it with `end_probability`),
    capped at `max_turns`; drawn by inverting the geometric distribution, so its cost does not grow with the cap."""
    if not multi_turn or max_turns <= 1 or end_probability >= 1:
        return 1
    if end_probability <= 0:
        return max_turns
    u = 1.0 - rng.random()  # in (0, 1]
    extra = math.log(u) / math.log1p(-end_probability)
    return 1 + int(min(extra, max_turns - 1))


class LazyTurns(Sequence[Turn]):
    """A conversation's turns, made in order the first time each is asked for (then kept, so a driver that reads
    turn r twice sees the same turn). Memory grows with the turns a run reached, not with the conversation's length."""

    __slots__ = ("_context", "_generate", "_made", "_n", "_rng")

    def __init__(self, n: int, rng: random.Random, context: tuple[int, int], generate: tuple[int, int]) -> None:
        self._n, self._rng, self._context, self._generate = n, rng, context, generate
        self._made: list[Turn] = []

    def __len__(self) -> int:
        return self._n

    def _make_until(self, i: int) -> None:
        while len(self._made) <= i:
            self._made.append(
                Turn(input_tokens=self._rng.randint(*self._context), output_tokens=self._rng.randint(*self._generate))
            )

    def __getitem__(self, i):
        if isinstance(i, slice):
            idx = range(*i.indices(self._n))
            if not idx:
                return ()
            self._make_until(max(idx[0], idx[-1]))
            return tuple(self._made[k] for k in idx)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        self._make_until(i)
        return self._made[i]

    def __iter__(self) -> Iterator[Turn]:
        for i in range(self._n):
            yield self[i]


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
            count = draw_turn_count(rng, multi_turn, end_probability, max_turns)
            # Each conversation draws its turns from its own generator, seeded from the user's, so the turns are
            # the same whenever they are made (the user's own draws, think times, go on interleaved with them).
            turns = LazyTurns(count, random.Random(rng.getrandbits(64)), self.context_tokens, self.generate_tokens)
            yield Conversation(f"u{self.user_id}-c{n}", turns)
            n += 1
