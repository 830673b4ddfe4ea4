"""How `kvtier bench` and `kvtier replay` load their configuration: one way, for both.

Layers, later ones win: the pydantic model's defaults < the `--config` YAML file < environment variables
(`<PREFIX><KEY>`, e.g. KVTIER_NUM_USERS=50 for bench, KVTIER_REPLAY_SEED=3 for replay) < command-line flags.
The model validates the merged values once; its types and `Field` constraints are the only checks.

Each value remembers the layer it came from, so a bad one is one line (kvconnector.validation's format) that
blames its source:
    --num-users: Input should be greater than or equal to 1
    environment KVTIER_NUM_USERS='0': Input should be greater than or equal to 1
    --config run.yaml: rag.top_k: Input should be greater than 0

`documented()` writes each flag's "(default X)" from the model, so help texts cannot drift from the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kvconnector.errors import ConfigError
from kvconnector.validation import describe_validation_error

from .json_files import MALFORMED, check_input, describe_malformed, open_regular, refuse_malformed, shown

M = TypeVar("M", bound=BaseModel)

__all__ = ["documented", "env_layer", "flag_name", "load_settings", "read_yaml", "shown_default"]


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: the base constructor says what is wrong
                break
            if first != key_node.start_mark.line + 1:
                raise ConfigError(f"key {key!r} given twice (lines {first} and {key_node.start_mark.line + 1})")
        return super().construct_mapping(node, deep)

    def construct_object(self, node, deep=False):
        # A value PyYAML's constructors take apart with int() or datetime() (past Python's 4300 digits, a month 13):
        # a YAML error at its line, as a syntax error is.
        try:
            return super().construct_object(node, deep)
        except ConfigError:
            raise
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(None, None, describe_malformed(exc), node.start_mark) from None

    def construct_yaml_timestamp(self, node):
        # `!!timestamp x`: PyYAML's own constructor does not check that its pattern matched (AttributeError)
        if self.timestamp_regexp.match(self.construct_scalar(node)) is None:
            raise yaml.constructor.ConstructorError(None, None, "not a timestamp", node.start_mark)
        return super().construct_yaml_timestamp(node)


_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:timestamp", _UniqueKeyLoader.construct_yaml_timestamp)


def read_yaml(path: str) -> dict:
    """The top-level mapping of a YAML config file; ConfigError (one line naming the file) for anything else, a key
    given twice in one mapping included."""
    try:
        # MALFORMED: YAML syntax, bytes that are no text, a number past Python's int digits, a date out of range, ...
        with open_regular(path) as f, refuse_malformed(f"--config {path}", ConfigError):
            try:
                loaded = yaml.load(f, Loader=_UniqueKeyLoader) or {}
            except ConfigError as exc:  # a key given twice
                raise ConfigError(f"--config {path}: {exc}") from None
            check_input(loaded)
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: expected a mapping of keys at the top")
    return loaded


# Variables under KVTIER_ that are no setting of `kvtier bench` (whose prefix is KVTIER_ itself): the other
# commands' prefixes, and what the deploy scripts, the bench's own clients and the test suite read. Any other
# KVTIER_<NAME> is refused as a misspelling, by bench as by replay and plan.
OTHER_VARIABLES = (
    "KVTIER_REPLAY_",  # kvtier replay's settings
    "KVTIER_PLAN_",  # kvtier plan's settings
    "KVTIER_CLIENT_STATUS",  # a bench client's status file, set by its parent (replay/synthetic/view.py)
    "KVTIER_STACK_DIR",  # deploy/run-stack.sh's state directory
    "KVTIER_VLLM_NEWEST_SRC",  # the test suite: vLLM's newest sources
    "KVTIER_TINY_MODEL_DIR",  # the test suite: where the offline model is built
    "KVTIER_TRACE_TMP",  # the test suite: a disk-backed folder for traced I/O
    "KVTIER_REPORT_SCREENSHOTS",  # the test suite: where the report's screenshots go
    "KVTIER_TEST_IMAGE",  # the test suite: a built kvtier image (make image) to run bench in
    "KVTIER_MLPSTORAGE_SRC",  # the test suite: a checkout of mlpstorage, whose aggregation kvtier's is compared with
    "KVTIER_AIPERF_PYTHON",  # the test suite and benchmarks/aiperf_vs_kvtier.py: a Python with AIPerf 0.13.0
)


def env_layer(
    model: type[BaseModel], prefix: str, known_elsewhere: frozenset[str] = frozenset()
) -> dict[str, tuple[str, Any]]:
    """`<prefix><TOP_LEVEL_KEY>=value` for the model's top-level keys, each parsed as a YAML scalar (so `50` is a
    number and `true` a boolean; the model converts further). Returns {key: (source description, value)}.
    A variable of the prefix that names no key (nor one of `known_elsewhere`, keys of a sibling command sharing the
    prefix, nor one of OTHER_VARIABLES) is a mistake, as an unknown key in the YAML file is (a misspelt variable would
    otherwise be ignored)."""
    keys = set(model.model_fields) | known_elsewhere
    others = tuple(o for o in OTHER_VARIABLES if o != prefix)  # a command's own prefix is no exemption
    unknown = sorted(
        v
        for v in os.environ
        if v.startswith(prefix) and v[len(prefix) :].lower() not in keys and not v.startswith(others)
    )
    if unknown:
        raise ConfigError(f"environment {unknown[0]}: no such setting ({prefix}<KEY> for a key of --config)")
    out = {}
    for key in model.model_fields:
        var = prefix + key.upper()
        raw = os.environ.get(var)
        if raw is None:
            continue
        where = f"environment {var}={shown(raw)}"
        _empty_string(where, raw)
        try:
            val = yaml.load(raw, Loader=_UniqueKeyLoader)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not a valid value") from exc
        except RecursionError:  # a value of nested brackets: not one value either
            raise ConfigError(f"{where}: expected a single value") from None
        except MALFORMED as exc:  # a number past Python's int digits, a date out of range
            raise ConfigError(f"{where}: {describe_malformed(exc)}") from None
        if isinstance(val, (list, dict)):
            raise ConfigError(f"{where}: expected a single value")
        out[key] = (where, val)
    return out


def _set_path(data: dict, path: tuple[str, ...], value: Any) -> None:
    """Set a (possibly nested) key; a section is copied, keeping its other keys. A section that is not a mapping
    is left as it is: validation then reports it, blamed on the layer that gave it."""
    if len(path) == 1:
        data[path[0]] = value
        return
    section = data.get(path[0], {})
    if isinstance(section, dict):
        section = dict(section)
        _set_path(section, path[1:], value)
        data[path[0]] = section


def load_settings(
    model: type[M],
    *,
    config_path: str | None = None,
    env_prefix: str | None = None,
    flags: Mapping[str, Any] | None = None,
    flag_paths: Mapping[str, tuple[str, ...]] | None = None,
    missing_hint: str = "",
    env_known_elsewhere: frozenset[str] = frozenset(),
) -> M:
    """Merge the layers and validate once. `flags` are the command line's values by argparse dest (only those the
    user gave); `flag_paths` maps a dest to the nested key it sets (`rag_top_k` -> ('rag', 'top_k')): it overrides
    that key of the section and keeps the section's others. Raises ConfigError with one line."""
    data: dict = {}
    origin: dict[tuple, str] = {}  # path of a value -> where it came from
    overridden: list[tuple[str, Any, str]] = []  # (top-level key, the lower layer's value, that layer)
    if config_path:
        loaded = read_yaml(config_path)
        for k, v in loaded.items():
            _empty_string(f"--config {config_path}: {k}", v)
        data.update(loaded)
        origin.update({(k,): f"--config {config_path}" for k in loaded})
    env = env_layer(model, env_prefix, env_known_elsewhere) if env_prefix else {}
    for key, (where, val) in env.items():
        _empty_string(where, val)
        if key in data:
            overridden.append((key, data[key], origin[(key,)]))
        data[key] = val
        origin[(key,)] = where
    for dest, val in (flags or {}).items():
        path = (flag_paths or {}).get(dest, (dest,))
        _empty_string(flag_name(dest), val)
        if path[0] in data and not any(o[0] == path[0] for o in overridden):
            overridden.append((path[0], data[path[0]], origin.get((path[0],), "--config")))
        _set_path(data, path, val)
        origin[path] = flag_name(dest)
    try:
        settings = model(**data)
    except ValidationError as exc:
        missing = [flag_name(str(e["loc"][0])) for e in exc.errors() if e["type"] == "missing" and len(e["loc"]) == 1]
        if missing:
            raise ConfigError(f"missing {', '.join(missing)}{missing_hint}") from None
        raise ConfigError(_blame(exc, origin)) from None
    _check_overridden(model, settings, overridden)
    return settings


def _empty_string(where: str, value: Any) -> None:
    """An empty flag or variable (`--output ''`) is a mistake, never "use the default": no setting means ''."""
    if isinstance(value, str) and not value.strip():
        raise ConfigError(f"{where}: empty value")


def _check_overridden(model: type[BaseModel], settings: BaseModel, overridden: list[tuple[str, Any, str]]) -> None:
    """A value a later layer replaced is still checked on its own: a bad key in the YAML file is reported even when
    a flag overrides it today (it would surface the day the flag is left off). Only the key's own checks count;
    checks across keys hold for the merged values, which passed."""
    for key, value, where in overridden:
        if key not in model.model_fields:
            continue
        try:
            model.__pydantic_validator__.validate_assignment(settings.model_copy(), key, value)
        except ValidationError as exc:
            errors = [e for e in exc.errors() if e["loc"] and e["loc"][0] == key]
            if errors:
                raise ConfigError(_blame(exc, {(key,): where})) from None


def _blame(exc: ValidationError, origin: Mapping[tuple, str]) -> str:
    """The error's line, naming the layer of the longest prefix of its location that a layer set."""
    loc = tuple(exc.errors()[0]["loc"])
    for n in range(len(loc), 0, -1):
        where = origin.get(loc[:n])
        if where is not None:
            # A flag or a variable names its key; a file does not, so its line keeps the whole path.
            named = 0 if where.startswith("--config ") else n
            return describe_validation_error(exc, where, skip=named)
    return describe_validation_error(exc)


# ---- help texts -------------------------------------------------------------------------------------------------


def _default(model: type[BaseModel], path: tuple[str, ...]) -> Any:
    """The model's default for a (possibly nested) key; None when the key has none or is not in the model."""
    field = model.model_fields.get(path[0])
    if field is None or field.is_required():
        return None
    value = field.get_default(call_default_factory=True)
    for key in path[1:]:
        value = getattr(value, key, None)
    return value


def shown_default(model: type[BaseModel], path: tuple[str, ...]) -> str | None:
    """How the default of `path` reads in a help text, or None when it says nothing a help text should repeat (no
    default, a boolean switch, a section, an empty collection)."""
    value = _default(model, path)
    if value is None or isinstance(value, (bool, BaseModel, dict, list)) or value == ():
        return None
    if isinstance(value, tuple):
        return ",".join(_scalar(v) for v in value)
    return _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"
    return str(value)


def documented(
    add_argument: Callable[..., Any],
    model: type[BaseModel],
    flag_paths: Mapping[str, tuple[str, ...]] | None = None,
) -> Callable[..., Any]:
    """`add_argument` (of a parser or a group) whose help texts end with the model's default for the flag's key,
    `(default 600)`; help texts never write a model default by hand."""

    def add(*names: str, **kwargs: Any) -> Any:
        dest = kwargs.get("dest") or next((n for n in names if n.startswith("--")), names[0]).lstrip("-")
        dest = dest.replace("-", "_")
        shown = shown_default(model, (flag_paths or {}).get(dest, (dest,)))
        if shown is not None and kwargs.get("help"):
            kwargs["help"] = f"{kwargs['help']} (default {shown})"
        return add_argument(*names, **kwargs)

    return add
