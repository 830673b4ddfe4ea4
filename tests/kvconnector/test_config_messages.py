"""Sizes and configuration mistakes as a user reads them: the one size parser and the one validation-error line."""

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvconnector.backend_config import BackendConfig
from kvconnector.errors import ConfigError
from kvconnector.units import parse_size
from kvconnector.validation import describe_validation_error


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1KB", 1e3),
        ("1.5MB", 1.5e6),
        ("2 GB", 2e9),
        ("46.09TB", 46.09e12),
        ("500M", 5e8),
        ("1KiB", 1024),
        ("1.5MiB", 1.5 * 1024**2),
        ("2 GiB", 2 * 1024**3),
        ("1gib", 1024**3),
        ("4096", 4096),
        (10, 10),
    ],
)
def test_parse_size_reads_decimal_and_binary_units(text, expected):
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "GB", "1 XB", "-1GB", "0", True])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError):
        parse_size(text)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")
    top_k: int = Field(1, ge=1)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rag: _Section = _Section()


def _error(doc: dict) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _Doc.model_validate(doc)
    return info.value


def test_validation_line_names_source_path_and_first_error_only():
    exc = _error({"rag": {"top_k": 0}, "bogus": 1})
    line = describe_validation_error(exc, "--config c.yaml")
    assert line.startswith("--config c.yaml: rag.top_k: ") and "bogus" not in line and "\n" not in line


def test_validation_line_with_key_prefix_and_unknown_key_message():
    exc = _error({"bogus": 1})
    assert describe_validation_error(exc) == "bogus: Extra inputs are not permitted"
    assert (
        describe_validation_error(exc, "x", key_prefix="ns.", unknown_key="unknown key") == "x: ns.bogus: unknown key"
    )


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            {"kvtier.disk_dir": "/tmp/x", "kvtier.no_such_key": 1},
            "kvtier: invalid configuration: kvtier.no_such_key: unknown key",
        ),
        (
            {"kvtier.disk_dir": "/tmp/x", "kvtier.disk_capacity_gb": -1},
            "kvtier: invalid configuration: kvtier.disk_capacity_gb: ",
        ),
    ],
)
def test_backend_config_mistake_is_one_line_naming_the_key(extra, expected):
    with pytest.raises(ConfigError) as info:
        BackendConfig.from_extra_config(extra)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)
