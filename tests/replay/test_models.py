import json

import pytest

from kvconnector.errors import ConfigError
from replay.models import CATALOG, resolve_model


@pytest.mark.parametrize(
    "name,expected",
    [
        ("tiny-1b", 24_576),
        ("mistral-7b", 131_072),
        ("llama2-7b", 524_288),
        ("llama3.1-8b", 131_072),
        ("llama3.1-70b-instruct", 327_680),
        ("deepseek-v3", 70_272),
        ("qwen3-32b", 163_840),
        ("gpt-oss-120b", 73_728),
        ("gpt-oss-20b", 49_152),
    ],
)
def test_bytes_per_token_match_the_spec_table(name, expected):
    assert CATALOG[name].bytes_per_token("bf16") == expected


def test_dtype_sizes_objects_by_its_real_width():
    m = CATALOG["llama3.1-8b"]
    assert m.bytes_per_token("fp32") == 2 * m.bytes_per_token("bf16") == 4 * m.bytes_per_token("fp8")
    assert m.bytes_per_token("int8") == m.bytes_per_token("fp8") == 65_536
    with pytest.raises(ConfigError, match="kv-dtype"):
        m.bytes_per_token("fp4")


def test_hf_config_json_gqa_and_mla(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(
        json.dumps({"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096})
    )
    assert resolve_model(str(tmp_path / "llama")).bytes_per_token() == 131_072
    mla = tmp_path / "ds.json"
    mla.write_text(json.dumps({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}))
    assert resolve_model(str(mla)).bytes_per_token() == 70_272


def test_unknown_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown model"):
        resolve_model("gpt-5")
    bad = tmp_path / "config.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="lacks"):
        resolve_model(str(bad))
