"""A malformed input file is a one-line refusal of its reader, never a traceback: every reader of a user's file (the
block-hash traces, ShareGPT, BurstGPT, YAML --config, a model's config.json, results files, --validation-trace) wears
`json_files.refuse_malformed`, which turns what Python's parsers raise (ValueError with Python's 4300-digit limit,
RecursionError, OverflowError, csv.Error, yaml.YAMLError) into the reader's UserError subclass."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import yaml

from kvconnector.errors import ConfigError, UserError
from replay.common.json_files import InputError, refuse_malformed
from replay.common.settings import read_yaml
from replay.models import resolve_model
from replay.outputs.results_file import ResultsFileError, load_results_file
from replay.sources.base import MAX_LINE_BYTES, WorkloadError
from replay.sources.block_traces import load_block_trace
from replay.sources.burstgpt import load_burstgpt
from replay.sources.sharegpt import estimate_tokens, load_sharegpt
from replay.synthetic.validation_trace import load_validation_trace

BIG = "9" * 5000  # past Python's int-to-text limit (sys.get_int_max_str_digits(), 4300)
JUST = "9" * 4300  # at the limit: read, then refused where it is no count (it does not fit a float)
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_ROW = "2023-11-16 18:15:46.6805900,374,44\n"
BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_ROW = "5,ChatGPT,100,20,120,Conversation log\n"
MOON = {"timestamp": "0", "input_length": "1000", "output_length": "5", "hash_ids": "[1, 2]"}


def _row(fields: dict[str, str], **over: str) -> str:
    return "{" + ", ".join(f'"{k}": {over.get(k, v)}' for k, v in fields.items()) + "}"


def refused(fn, error: type[UserError], *where: str) -> str:
    """`fn()` raises `error`: one line, short, naming each of `where`."""
    with pytest.raises(error) as exc:
        fn()
    message = str(exc.value)
    assert "\n" not in message and len(message) < 400, message
    for w in where:
        assert w in message, (w, message)
    return message


# ---- the one place ------------------------------------------------------------------------------------------------


def _raise_csv():
    list(csv.reader(["x" * (csv.field_size_limit() + 1)]))


def _recurse(n=0):
    return _recurse(n + 1)


@pytest.mark.parametrize(
    ("raise_it", "says"),
    [
        (lambda: int(BIG), "integer"),
        (lambda: json.loads("{"), "not JSON"),
        (lambda: b"\xff".decode("utf-8"), "not UTF-8"),
        (_raise_csv, "malformed CSV"),
        (lambda: yaml.safe_load("a: ["), "not valid YAML"),
        (lambda: yaml.safe_load("a: 2001-13-01"), "month must be in 1..12"),
        (_recurse, "nested more than"),
        (lambda: 10**400 / 3, "too large"),
        (lambda: float("x"), "could not convert"),
    ],
    ids=["int-digits", "json", "utf8", "csv", "yaml", "yaml-date", "recursion", "overflow", "value"],
)
def test_refuse_malformed_turns_each_parser_error_into_the_readers_error(raise_it, says):
    with pytest.raises(WorkloadError) as exc:
        with refuse_malformed("f.txt:3", WorkloadError):
            raise_it()
    assert str(exc.value).startswith("f.txt:3: ") and says in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_refuse_malformed_names_the_place_of_an_input_error_and_passes_other_user_errors():
    with pytest.raises(ConfigError, match=r"^--config c\.yaml: NaN is not"):
        with refuse_malformed("--config c.yaml", ConfigError):
            raise InputError("NaN is not a finite number")
    with pytest.raises(WorkloadError, match=r"^t\.csv:9: row 9 is bad$"):
        with refuse_malformed("other", ConfigError):
            raise WorkloadError("t.csv:9: row 9 is bad")
    with pytest.raises(TypeError):  # a TypeError is our bug, not the file's: it stays one
        with refuse_malformed("t.csv", WorkloadError):
            raise TypeError("unsupported operand")


# ---- the cases ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(MOON))
def test_an_integer_past_4300_digits_in_any_field_of_a_jsonl_trace(tmp_path, key):
    path = tmp_path / "t.jsonl"
    value = f"[1, {BIG}]" if key == "hash_ids" else BIG
    path.write_text(_row(MOON) + "\n" + _row(MOON, **{key: value}) + "\n")
    refused(lambda: load_block_trace(path), WorkloadError, f"{path}:2: ", "an integer of 5000 digits", "4300")


def test_an_integer_past_4300_digits_in_a_sharegpt_file_and_a_yaml_config(tmp_path):
    sg = tmp_path / "sg.json"
    conv = '[{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]'
    sg.write_text(f'[{{"id": "a", "conversations": {conv}}}, {{"id": {BIG}, "conversations": {conv}}}]')
    refused(lambda: load_sharegpt(sg, count_tokens=estimate_tokens), WorkloadError, f"{sg}: item 1: ", "5000 digits")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"seed: 1\nnum_users: {BIG}\n")
    refused(lambda: read_yaml(str(cfg)), ConfigError, f"--config {cfg}: not valid YAML", "4300", "line 2")


def test_azure_rows_with_and_without_a_time_zone(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(AZURE + AZ_ROW + "2023-11-16 18:15:50.9951690+00:00,396,109\n")
    refused(lambda: load_block_trace(path, "azure"), WorkloadError, f"{path}:3: ", "has a time zone, the first row")
    path.write_text(AZURE + "2023-11-16 18:15:46+01:00,1,1\n" + AZ_ROW)
    refused(lambda: load_block_trace(path, "azure"), WorkloadError, f"{path}:3: ", "has none, the first row's has one")
    path.write_text(AZURE + "2023-11-16 18:15:46+01:00,1,1\n2023-11-16 17:15:47+00:00,1,1\n")  # zones, all rows
    assert [r.arrival_s for r in load_block_trace(path, "azure").requests] == [0.0, 1.0]


@pytest.mark.parametrize("reader", ["azure", "burstgpt"])
def test_a_csv_field_over_128_kib_and_an_unclosed_quote(tmp_path, reader):
    head, row = (AZURE, AZ_ROW) if reader == "azure" else (BURST, BURST_ROW)
    load = (lambda p: load_block_trace(p, "azure")) if reader == "azure" else load_burstgpt
    path = tmp_path / "t.csv"
    path.write_text(head + row + '"' + "x" * (200 << 10) + '",1,1\n')
    refused(lambda: load(path), WorkloadError, f"{path}:3: ", "malformed CSV (field larger than field limit")
    path.write_text(head + row + '"2023' + row * 20_000)  # the quote swallows the rest of the file into one field
    refused(lambda: load(path), WorkloadError, f"{path}:", "malformed CSV")


# ---- more of the same kind ----------------------------------------------------------------------------------------

VALUES = [BIG, "-" + BIG, JUST, "1e400", "NaN", "-Infinity", "[" * 5000 + "]" * 5000, "[" * 150 + "]" * 150]
VALUES += ['"x"', "null", "true", "{}", "[]", "1.5", "-1", "18446744073709551616", "1" + "0" * 30, "1e308", '"\\u0000"']
VALUES += ['"' + "a" * 300_000 + '"']


@pytest.mark.parametrize("fmt", ["mooncake", "bailian"])
def test_every_value_in_every_field_of_a_jsonl_trace(tmp_path, fmt):
    fields = MOON if fmt == "mooncake" else {"chat_id": "1", "parent_chat_id": "-1", "turn": "1", **MOON}
    for i, key in enumerate(fields):
        for j, value in enumerate(VALUES):
            path = tmp_path / f"{i}-{j}.jsonl"
            path.write_text(_row(fields) + "\n" + _row(fields, **{key: value}) + "\n")
            try:
                load_block_trace(path, fmt, block_tokens=7)
            except WorkloadError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 400 and f"{path}:2: " in str(exc), (key, value, exc)


def test_every_value_in_a_weka_document(tmp_path):
    call = {"type": '"n"', "t": "0", "in": "100", "out": "5", "hash_ids": "[1]"}
    doc = {"id": '"x"', "block_size": "64", "hash_id_scope": '"local"'}
    for key in [*call, *doc, "requests", None]:
        for j, value in enumerate(VALUES):
            c = _row(call, **{key: value}) if key in call else _row(call)
            text = _row({**doc, "requests": f"[{c}]"}, **({key: value} if key in (*doc, "requests") else {}))
            path = tmp_path / f"{key}-{j}.json"
            path.write_text(value if key is None else text)
            try:
                load_block_trace(path, "weka")
            except WorkloadError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 400 and str(path) in str(exc), (key, value, exc)


CSV_VALUES = [
    BIG,
    JUST,
    "1e400",
    "nan",
    "-1",
    "1.5",
    "",
    '"',
    "\x00",
    "x" * 200_000,
    "2023-02-30 00:00:00",
    "0001-01-01",
]
CSV_VALUES += ["9999-12-31 23:59:59", "2023-11-16 18:15:50+25:00", "2023-11-16T18:15:50Z", "\u0663", " 12 ", "1_000"]


def test_every_value_in_every_column_of_a_csv_trace(tmp_path):
    for reader, head, row in (("azure", AZURE, AZ_ROW), ("burstgpt", BURST, BURST_ROW)):
        load = (lambda p: load_block_trace(p, "azure")) if reader == "azure" else load_burstgpt
        fields = row.rstrip("\n").split(",")
        for col in range(len(fields)):
            for j, value in enumerate(CSV_VALUES):
                bad = ",".join(value if k == col else f for k, f in enumerate(fields))
                path = tmp_path / f"{reader}-{col}-{j}.csv"
                path.write_text(head + row + bad + "\n" + row)
                try:
                    load(path)
                except WorkloadError as exc:
                    assert "\n" not in str(exc) and len(str(exc)) < 400 and f"{path}:" in str(exc), (col, value, exc)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (AZURE + AZ_ROW + "2023-11-16 18:15:50,1,1,7\n", ":3: expected 3 fields, found 4"),  # a column more mid-file
        (AZURE + AZ_ROW + "2023-11-16 18:15:50,1\n", ":3: expected 3 fields, found 2"),
        (AZURE + AZ_ROW + "2023-11-16 18:15:50,1\x00,1\n", ":3: ContextTokens '1\\x00' is not numeric"),  # a NUL
        ("\ufeff" + AZURE, "no request"),  # a BOM, then nothing
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,\xe9\xff,1\n", ":2: not UTF-8"),
        ("TIMESTAMP,ContextTokens\n" + AZ_ROW, ":1: not an Azure LLM inference trace"),
    ],
)
def test_malformed_azure_files(tmp_path, text, says):
    path = tmp_path / "az.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(lambda: load_block_trace(path, "azure"), WorkloadError, says)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"num_users: {BIG}\n", "line 1"),
        (f"seed: 1\nrag:\n  top_k: {BIG}\n", "line 3"),
        ("seed: 2001-13-01\n", "month must be in 1..12 at line 1"),
        ("seed: 2001-01-01 10:00:00 +99:00\n", "offset must be"),
        ("seed: !!timestamp soon\n", "not a timestamp at line 1"),  # PyYAML's own constructor raised AttributeError
        ("seed: !!binary zz=\n", "base64"),
        ("seed: !!python/object:os.system x\n", "could not determine a constructor"),
        ("seed: [" * 3000, "nested more than"),
        (b"seed: \xe9\n", "not valid YAML"),
        ("seed: 1\x00\n", "not valid YAML"),
        (f"seed: !!float {BIG}\n", "inf is not a finite number"),
        ("seed: .nan\n", "not a finite number"),
    ],
)
def test_malformed_yaml_configs(tmp_path, text, says):
    path = tmp_path / "c.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(lambda: read_yaml(str(path)), ConfigError, f"--config {path}", says)


@pytest.mark.parametrize("value", [BIG, JUST, "1e400", "NaN", "[" * 5000 + "]" * 5000, '"' + "a" * 300_000 + '"'])
def test_other_json_files_a_user_hands_over(tmp_path, value):
    model = tmp_path / "config.json"
    model.write_text('{"num_hidden_layers": ' + value + ', "num_attention_heads": 8, "hidden_size": 512}')
    refused(lambda: resolve_model(str(model)), ConfigError, str(model))
    results = tmp_path / "r.json"
    results.write_text('{"summary": {"elapsed_time": ' + value + "}}")
    refused(lambda: load_results_file(str(results)), ResultsFileError, str(results))
    records = tmp_path / "v.json"
    fields = '"context_tokens": ' + value + ', "generation_tokens": 1, "read_bytes": 1, "write_bytes": 1'
    records.write_text('[{"cache_hit": true, ' + fields + "}]")
    refused(lambda: load_validation_trace(str(records)), ConfigError, f"--validation-trace {records}")


# ---- a long trace row -------------------------------------------------------------------------------------------


def test_a_row_of_200k_hash_ids_is_read(tmp_path):
    path = tmp_path / "long.jsonl"
    ids = list(range(1_000_000, 1_200_000))  # 7 digits each: 1.8 MB on one line, over the old 1 MiB cap
    path.write_text(json.dumps({"timestamp": 0, "input_length": 200_000 * 512, "output_length": 1, "hash_ids": ids}))
    assert path.stat().st_size > 1 << 20
    assert load_block_trace(path).requests[0].hash_ids == tuple(ids)


@pytest.mark.slow  # 64 MiB written and read
def test_a_row_past_the_row_bound_says_so(tmp_path):
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(_row(MOON).encode() + b"\n" + b" " * (MAX_LINE_BYTES + 1) + b"\n")
    message = refused(lambda: load_block_trace(path), WorkloadError, f"{path}:2: row 2 is over 64 MiB")
    assert "not a" not in message


def test_the_int_limit_is_pythons(tmp_path):
    # the figure said is the interpreter's own, whatever it is set to
    path = tmp_path / "t.jsonl"
    path.write_text(_row(MOON, input_length=BIG) + "\n")
    limit = sys.get_int_max_str_digits()
    refused(lambda: load_block_trace(path), WorkloadError, f"at most {limit} digits")
