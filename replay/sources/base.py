"""The records every workload source yields and every driver consumes.

Sources (synthetic users, ShareGPT, BurstGPT, RAG, long sessions) turn their input into `Conversation`s; the
synthetic driver turns them into tiered-store operations, the OpenAI driver into HTTP requests. Nothing here knows
about either driver.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from kvconnector.errors import UserError
from replay.common.json_files import open_regular, shown


class WorkloadError(UserError, ValueError):
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
    turns: Sequence[Turn]  # a tuple, or turns made as they are asked for (synthetic users)
    system_prompt: str | None = None


@dataclass(slots=True)
class LoadReport:
    """What a loader kept and dropped, reported in the results so nobody wonders where rows went."""

    source: str
    conversations: int = 0
    turns: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    # Rows kept but cut to the bound a request may have (the model's context length), by reason.
    truncated: dict[str, int] = field(default_factory=dict)
    tokenizer: str = "none"

    def skip(self, reason: str, count: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + count

    def truncate(self, reason: str, count: int = 1) -> None:
        self.truncated[reason] = self.truncated.get(reason, 0) + count


def bound_turn(turn: Turn, max_tokens: int | None, report: LoadReport, reason: str = "over_max_context_tokens") -> Turn:
    """The turn cut so that its prompt plus its answer fit `max_tokens` (a model's context holds both): the prompt
    first keeps up to max_tokens, the answer what is left. Text is cut in proportion, for drivers that send it."""
    if max_tokens is None or turn.input_tokens + turn.output_tokens <= max_tokens:
        return turn
    report.truncate(reason)
    inp = min(turn.input_tokens, max_tokens)
    out = min(turn.output_tokens, max_tokens - inp)
    text = turn.text
    if text is not None and inp < turn.input_tokens:
        text = text[: len(text) * inp // max(1, turn.input_tokens)]
    answer = turn.answer_text
    if answer is not None and out < turn.output_tokens:
        answer = answer[: len(answer) * out // max(1, turn.output_tokens)]
    return Turn(inp, out, turn.arrival_s, text, answer)


# ---- reading workload files: one way for every source --------------------------------------------------------------
# The longest row read: a bound against a file with no newlines (a binary file, a dump on one line), not against
# real rows. A real trace row can be long: 200,000 hash ids of 7 digits are 1.8 MB, a 10M-token prompt in 16-token
# blocks is 625,000 SipHash ids (14 MB). At 64 MiB a row still fits in memory several times over while parsed (its
# bytes, its text and its ids as Python ints, about 5x its size).
MAX_LINE_BYTES = 64 << 20


def _utf8_error(path, data: bytes, exc: UnicodeDecodeError, first_line: int = 1) -> WorkloadError:
    line = first_line + data.count(b"\n", 0, exc.start)
    return WorkloadError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); is this the right file?")


def read_text(path, what: str) -> str:
    """The whole file as text: UTF-8 with or without a BOM. A multi-byte character cut by the end of a truncated file
    is dropped (the loaders keep what precedes damage); any other undecodable byte is a WorkloadError naming the
    line."""
    try:
        with open_regular(path) as fh:
            data = fh.read()
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    data = data.removeprefix(codecs.BOM_UTF8)  # by hand: utf-8-sig's error offsets would not count it
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.end == len(data) and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8")
        raise _utf8_error(path, data, exc) from None


def read_lines(path, what: str) -> Iterator[str]:
    """The file's lines as text (line endings kept, for csv), decoded one by one so an undecodable byte is reported
    with its line; a BOM on the first line is dropped (Excel writes one)."""
    try:
        fh = open_regular(path)
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot open {what}: {exc.strerror or exc}") from exc
    with fh:
        number = 0
        while True:
            try:
                raw = fh.readline(MAX_LINE_BYTES + 1)
            except OSError as exc:
                raise WorkloadError(f"{path}:{number + 1}: cannot read: {exc.strerror or exc}") from exc
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES:
                raise WorkloadError(
                    f"{path}:{number}: row {number} is over {MAX_LINE_BYTES >> 20} MiB, the longest row kvtier reads "
                    f"in a {what}"
                )
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _utf8_error(path, raw, exc, number) from None


def parse_count(text: str, where: str, column: str) -> int:
    """A token count: a finite, non-negative whole number ("1e3" and "12.0" are fine, "1.7", "inf", "-1" are not)."""
    value = parse_number(text, where, column)
    if value != int(value):
        raise WorkloadError(f"{where}: {column} {shown(text.strip())} is not a whole number")
    return int(value)


def parse_number(text: str, where: str, column: str) -> float:
    """A finite, non-negative number (seconds, tokens)."""
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{where}: {column} {shown(text.strip())} is not numeric") from None
    if not math.isfinite(value) or value < 0:
        raise WorkloadError(f"{where}: {column} {shown(text.strip())} must be a finite number >= 0")
    return value
