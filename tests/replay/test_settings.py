"""replay.common.settings: the one loader of both CLIs' configuration (defaults < --config YAML < environment < flags),
its one-line errors that name the layer a bad value came from, and help texts whose defaults come from the model."""

import argparse
import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvconnector.errors import ConfigError
from kvconnector.validation import describe_validation_error, error_path
from replay.common.settings import OTHER_VARIABLES, documented, load_settings, shown_default
from replay.openai import config as replay_config
from replay.synthetic import cli as bench_cli
from replay.synthetic.config import ENV_PREFIX as BENCH_ENV_PREFIX
from replay.synthetic.config import BenchConfig

PREFIX = "KVT_TEST_"


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    a: int = Field(1, ge=0)
    b: int = Field(2, ge=0)


class Toy(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    name: str
    count: int = Field(3, ge=1)
    rate: float = 0.5
    on: bool = False
    inner: Inner = Field(default_factory=Inner)
    items: list[int] = []

    @model_validator(mode="after")
    def _check(self):
        if self.name == "bad":
            raise ValueError("name 'bad' is refused")
        return self


def _yaml(tmp_path, **data) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _load(**kw):
    return load_settings(Toy, env_prefix=PREFIX, **kw)


def test_each_layer_overrides_the_one_below(tmp_path, monkeypatch):
    assert _load(flags={"name": "n"}).count == 3  # the model's default
    cfg = _yaml(tmp_path, name="n", count=4, rate=0.25)
    assert _load(config_path=cfg).count == 4
    monkeypatch.setenv(PREFIX + "COUNT", "5")
    got = _load(config_path=cfg)
    assert (got.count, got.rate) == (5, 0.25)  # the variable wins for its key only
    assert _load(config_path=cfg, flags={"count": 6}).count == 6


def test_environment_values_are_yaml_scalars_and_only_the_models_keys(monkeypatch):
    monkeypatch.setenv(PREFIX + "ON", "true")
    monkeypatch.setenv(PREFIX + "RATE", "0.125")
    monkeypatch.setenv(PREFIX + "NAME", "from-env")
    got = load_settings(Toy, env_prefix=PREFIX)
    assert got.on is True and got.rate == 0.125 and got.name == "from-env"
    assert load_settings(Toy, flags={"name": "x"}).on is False  # no prefix, no environment layer
    monkeypatch.setenv(PREFIX + "UNKNOWN_KEY", "1")  # a misspelt variable is refused, not ignored
    with pytest.raises(ConfigError, match=rf"^environment {PREFIX}UNKNOWN_KEY: no such setting"):
        load_settings(Toy, env_prefix=PREFIX)


@pytest.mark.parametrize(
    "prefix, misspelt", [("KVTIER_", "KVTIER_NUM_USER"), ("KVTIER_REPLAY_", "KVTIER_REPLAY_SEEDS")]
)
def test_every_command_refuses_a_misspelt_variable_and_leaves_the_others(monkeypatch, prefix, misspelt):
    """bench's prefix (KVTIER_) holds replay's, plan's and the scripts' variables: those are not misspellings."""
    for name in OTHER_VARIABLES:
        monkeypatch.setenv(name + ("SEED" if name.endswith("_") else ""), "5")
    model = BenchConfig if prefix == "KVTIER_" else replay_config.ReplayConfig
    flags = {} if model is BenchConfig else {"base_url": "http://127.0.0.1:1", "model": "m", "output": "o.json"}
    load_settings(model, env_prefix=prefix, flags=flags)
    monkeypatch.setenv(misspelt, "5")
    with pytest.raises(ConfigError, match=rf"^environment {misspelt}: no such setting"):
        load_settings(model, env_prefix=prefix, flags=flags)


def test_every_kvtier_variable_the_project_reads_is_a_setting_or_listed():
    """A KVTIER_ name read anywhere (Python, shell, the Makefile) is a setting's or in OTHER_VARIABLES, so bench's
    refusal of unknown names never refuses one of the project's own."""
    root = Path(__file__).resolve().parents[2]
    settings = {BENCH_ENV_PREFIX + k.upper() for k in BenchConfig.model_fields}
    read = set()
    for path in [*root.glob("*/**/*.py"), *root.glob("*/**/*.sh"), root / "Makefile"]:
        if ".venv" in path.parts or path.parts[len(root.parts)].startswith("."):
            continue
        text = path.read_text(errors="replace")
        read |= set(re.findall(r"(?:environ(?:\.get)?\(|environ\[|getenv\(|setenv\()[\"'](KVTIER_[A-Z0-9_]+)", text))
        read |= set(re.findall(r"\$\{?(KVTIER_[A-Z0-9_]+)", text))
    assert read, "the scan found nothing: it is broken"
    assert {v for v in read if v not in settings and not v.startswith(OTHER_VARIABLES)} == set()


def test_a_nested_flag_sets_one_key_and_keeps_the_sections_others(tmp_path):
    cfg = _yaml(tmp_path, name="n", inner={"a": 7, "b": 8})
    got = _load(config_path=cfg, flags={"inner_b": 9}, flag_paths={"inner_b": ("inner", "b")})
    assert (got.inner.a, got.inner.b) == (7, 9)
    got = _load(flags={"name": "n", "inner_b": 9}, flag_paths={"inner_b": ("inner", "b")})
    assert (got.inner.a, got.inner.b) == (1, 9)  # no section given: the section's defaults, one key changed


def _error(**kw) -> str:
    with pytest.raises(ConfigError) as exc:
        _load(**kw)
    line = str(exc.value)
    assert "\n" not in line
    return line


def test_a_bad_value_is_blamed_on_its_layer(tmp_path, monkeypatch):
    assert _error(flags={"name": "n", "count": 0}) == "--count: Input should be greater than or equal to 1"
    cfg = _yaml(tmp_path, name="n", count=0, inner={"a": -1})
    assert _error(config_path=cfg).startswith(f"--config {cfg}: count: Input should be greater")
    # The flag fixes count; the file's section is still wrong and the line gives its whole path.
    assert (
        _error(config_path=cfg, flags={"count": 2})
        == f"--config {cfg}: inner.a: Input should be greater than or equal to 0"
    )
    monkeypatch.setenv(PREFIX + "COUNT", "0")
    assert _error(flags={"name": "n"}) == "environment KVT_TEST_COUNT='0': Input should be greater than or equal to 1"
    monkeypatch.setenv(PREFIX + "COUNT", "[1, 2]")
    assert _error(flags={"name": "n"}) == "environment KVT_TEST_COUNT='[1, 2]': expected a single value"
    monkeypatch.delenv(PREFIX + "COUNT")
    # A nested flag is named by its flag, not by the path it sets.
    bad_b = _error(flags={"name": "n", "inner_b": -1}, flag_paths={"inner_b": ("inner", "b")})
    assert bad_b == "--inner-b: Input should be greater than or equal to 0"
    assert _error(flags={"name": "bad"}) == "name 'bad' is refused"  # a check across keys: its own message
    assert _error(flags={"name": "n", "rate": float("nan")}) == "--rate: Input should be a finite number"
    assert _error(config_path=_yaml(tmp_path, name="n", bogus=1)).endswith(": bogus: Extra inputs are not permitted")


def test_missing_required_keys_are_listed_as_flags(tmp_path):
    with pytest.raises(ConfigError, match=r"^missing --name \(see help\)$"):
        _load(flags={"count": 0}, missing_hint=" (see help)")  # reported before any other error


def test_config_file_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- 1\n")
    assert _error(config_path=str(path)) == f"--config {path}: expected a mapping of keys at the top"
    path.write_text("a: [\n")
    said = _error(config_path=str(path))
    assert said.startswith(f"--config {path}: not valid YAML (") and said.endswith(" at line 2)"), said


def test_one_formatter_for_every_validation_error():
    class M(BaseModel):
        xs: list[int]
        d: dict[int, int] = {}

    with pytest.raises(ValidationError) as exc:
        M(xs=[1, "x"])
    assert error_path(exc.value.errors()[0]["loc"]) == "xs[1]"
    assert describe_validation_error(exc.value, "--xs", skip=1).startswith("--xs: [1]: Input should be a valid integer")
    assert describe_validation_error(exc.value, "file f", show_input=True).startswith("file f: xs[1] = 'x': Input")
    with pytest.raises(ValidationError) as exc:
        M(xs=[], d={"k": 1})
    assert error_path(exc.value.errors()[0]["loc"]) == "d.k"  # pydantic's '[key]' marker is not shown


def test_env_prefixes_of_the_two_commands_do_not_collide():
    bench = {BENCH_ENV_PREFIX + k.upper() for k in BenchConfig.model_fields}
    replay = {replay_config.ENV_PREFIX + k.upper() for k in replay_config.ReplayConfig.model_fields}
    assert not bench & replay


# ---- help texts ---------------------------------------------------------------------------------------------------


def test_documented_help_ends_with_the_models_default():
    ap = argparse.ArgumentParser()
    add = documented(ap.add_argument, Toy, {"inner_b": ("inner", "b")})
    add("--count", type=int, help="how many")
    add("--rate", type=float, help="how fast")
    add("--inner-b", type=int, help="b of inner")
    add("--on", action="store_true", help="switch")
    add("--items", help="a list")
    helps = {a.dest: a.help for a in ap._actions}
    assert helps["count"] == "how many (default 3)"
    assert helps["rate"] == "how fast (default 0.5)"
    assert helps["inner_b"] == "b of inner (default 2)"
    assert helps["on"] == "switch" and helps["items"] == "a list"  # a switch or an empty list: nothing to repeat


def _parsers():
    return [
        (bench_cli.build_parser(), BenchConfig, bench_cli.SECTION_FLAGS),
        (replay_config.build_parser(), replay_config.ReplayConfig, {}),
    ]


@pytest.mark.parametrize("which", ["bench", "replay"])
def test_help_defaults_are_the_models_defaults(which):
    parser, model, paths = _parsers()[["bench", "replay"].index(which)]
    documented_flags = 0
    for action in parser._actions:
        if not action.help or action.dest in ("help", "config", "log_level"):
            continue
        path = paths.get(action.dest, (action.dest,))
        shown = shown_default(model, path)
        written = re.findall(r"\(default ([^)]*)\)", action.help)
        if shown is None:
            continue
        documented_flags += 1
        assert written == [shown], (action.dest, action.help)  # once, generated, equal to the model's
        default = model.model_fields[path[0]].get_default(call_default_factory=True)
        for key in path[1:]:
            default = getattr(default, key)
        if isinstance(default, tuple):
            assert tuple(float(x) for x in shown.split(",")) == default
        elif isinstance(default, (int, float)):
            assert float(shown) == default
        else:
            assert shown == str(default)
        # No figure written by hand in parentheses ("(600)") left to drift.
        assert not re.search(r"\(\d[\d.]*\)", action.help), (action.dest, action.help)
    assert documented_flags >= 15


# ---- the replay model --------------------------------------------------------------------------------------------


def _replay(*flags: str) -> replay_config.ReplayConfig:
    return replay_config.load_config(["--base-url", "http://h:1/v1", "--model", "m", "--output", "o.json", *flags])


def test_replay_config_is_typed_once():
    cfg = _replay("--percentiles", "50, 99.9", "--slo", "ttft_ms=500,tpot_ms=50", "--max-tokens", "12")
    assert cfg.percentiles == (50.0, 99.9)
    assert cfg.slo == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    assert cfg.max_tokens == 12 and cfg.base_url == "http://h:1"
    cfg = _replay()
    assert cfg.max_tokens == "dataset" and cfg.slo == {} and cfg.percentiles == (50.0, 90.0, 95.0, 99.0)
    assert cfg.request_rate == float("inf")  # inf stays the one non-finite value: 'all at once'


def test_replay_reads_its_environment_and_config_file(tmp_path, monkeypatch):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"seed": 4, "percentiles": [90, 99], "metrics_url": "http://m/metrics"}))
    cfg = _replay("--config", str(path))
    assert cfg.seed == 4 and cfg.percentiles == (90.0, 99.0) and cfg.metrics_url == ["http://m/metrics"]
    monkeypatch.setenv("KVTIER_REPLAY_SEED", "5")
    assert _replay("--config", str(path)).seed == 5
    assert _replay("--config", str(path), "--seed", "6").seed == 6
    monkeypatch.setenv("KVTIER_REPLAY_TURNS", "0")
    with pytest.raises(ConfigError, match=r"^environment KVTIER_REPLAY_TURNS='0': Input should be greater"):
        _replay()


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--max-tokens", "many"], "--max-tokens: must be 'dataset' or a whole number >= 1, got 'many'"),
        (["--percentiles", "50,100"], "--percentiles: [1]: Input should be less than 100"),
        (["--slo", "ttft=5"], "--slo: ttft: Input should be 'ttft_ms', 'tpot_ms', 'e2el_ms' or 'itl_ms'"),
        (["--request-timeout", "nan"], "--request-timeout: Input should be a finite number"),
        (["--turns", "0"], "--turns: Input should be greater than or equal to 1"),
    ],
)
def test_replay_bad_values_name_the_flag(flags, line):
    with pytest.raises(ConfigError) as exc:
        _replay(*flags)
    assert str(exc.value) == line


def test_bench_environment_then_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("KVTIER_NUM_USERS", "7")
    args = bench_cli.build_parser().parse_args(["--rag-top-k", "2"])
    cfg = bench_cli.config_from_args(args)
    assert cfg.num_users == 7 and cfg.rag.top_k == 2 and cfg.rag.chunk_tokens == 512
    args = bench_cli.build_parser().parse_args(["--num-users", "9"])
    assert bench_cli.config_from_args(args).num_users == 9
