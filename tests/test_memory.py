"""Memory planner: hand-computed bytes, crossovers, real presets, config errors and the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from linattn.tools import memory as mem
from linattn.tools.cli import main as cli_main

# ---------------------------------------------------------------------------------------------- formulas


def test_acceptance_state_bytes_32_layers_16_heads_128_float32():
    # 32 layers · 16 heads · (128·128 + 128) · 4 bytes
    assert mem.state_bytes(1, 32, 16, 128, 128, 4) == 33_816_576
    assert mem.state_bytes(1, 32, 16, 128, 128, "float32") == 33_816_576
    assert mem.state_bytes(1, 32, 16, 128, 128, "fp32", normalizer=False) == 32 * 16 * 128 * 128 * 4


def test_acceptance_per_head_crossover_bf16_kv_against_float32_state():
    head_state = mem.state_bytes(1, 1, 1, 128, 128, "float32")  # (16384 + 128) · 4 = 66,048
    kv_per_token = mem.kv_cache_bytes(1, 1, 1, 128, 1, "bfloat16")  # 2 · 128 · 2 = 512
    assert (head_state, kv_per_token) == (66_048, 512)
    T = mem.crossover_length(head_state, kv_per_token)
    assert T == 129
    assert mem.kv_cache_bytes(1, 1, 1, 128, T - 1, "bf16") < head_state <= mem.kv_cache_bytes(1, 1, 1, 128, T, 2)
    # the same crossover for the whole 32-layer, 16-head model
    model_kv = mem.kv_cache_bytes(1, 32, 16, 128, 1, "bf16")
    assert mem.crossover_length(33_816_576, model_kv) == 129


def test_kv_cache_and_conv_formulas():
    assert mem.kv_cache_bytes(2, 3, 4, 64, 10, 2) == 2 * 3 * 4 * 2 * 10 * 64 * 2 == 61_440
    assert mem.kv_cache_bytes(1, 1, 1, 1, 0, 4) == 0
    assert mem.conv_state_bytes(1, 1, 8192, 4, "bf16") == 8192 * 3 * 2 == 49_152
    assert mem.conv_state_bytes(3, 2, 10, 1, 4) == 0  # width-1 conv needs no history


def test_crossover_is_exact_for_huge_integers():
    assert mem.crossover_length(1024, 1024) == 1
    assert mem.crossover_length(1025, 1024) == 2
    assert mem.crossover_length(10**30 + 1, 10**15) == 10**15 + 1  # float division would give 10**15


@given(st.integers(1, 10**18), st.integers(1, 10**9))
def test_crossover_is_the_smallest_length_that_covers_the_state(state, kv):
    T = mem.crossover_length(state, kv)
    assert T * kv >= state > (T - 1) * kv


@pytest.mark.parametrize(
    "name,size",
    [("float32", 4), ("fp32", 4), ("bfloat16", 2), ("bf16", 2), ("float16", 2), ("fp16", 2), ("float64", 8),
     ("torch.bfloat16", 2), ("BF16", 2)],
)  # fmt: skip
def test_dtype_names(name, size):
    assert mem.dtype_bytes(name) == size


def test_format_bytes():
    assert mem.format_bytes(33_816_576) == "32.25 MiB"
    assert mem.format_bytes(1023) == "1023 B"
    assert mem.format_bytes(1024**3) == "1.00 GiB"


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: mem.state_bytes(1, 32, -16, 128, 128, 4), "heads must be positive, got -16"),
        (lambda: mem.state_bytes(0, 32, 16, 128, 128, 4), "batch must be positive"),
        (lambda: mem.state_bytes(1, 32, 16, 128, 0, 4), "value_dim must be positive"),
        (lambda: mem.kv_cache_bytes(1, 1, 1, 128, -1, 2), "seq_len must be >= 0"),
        (lambda: mem.kv_cache_bytes(1, 1, 1, 128, 5, 0), "dtype_bytes must be positive"),
        (lambda: mem.crossover_length(0, 512), "state_bytes must be positive"),
        (lambda: mem.crossover_length(100, -2), "kv_bytes_per_token must be positive"),
        (lambda: mem.state_bytes(1, 1, 1, 128, 128, "int8"), "unknown dtype 'int8'"),
        (lambda: mem.memory_report(mem.load_preset("qwen3-next-80b-a3b"), [8], kv_dtype="fp8"), "kv_dtype"),
    ],
)
def test_bad_sizes_and_dtypes_are_value_errors_naming_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_non_integer_sizes_are_type_errors():
    with pytest.raises(TypeError, match="layers must be an integer"):
        mem.state_bytes(1, 2.0, 16, 128, 128, 4)
    with pytest.raises(TypeError, match="heads must be an integer"):
        mem.state_bytes(1, 1, True, 128, 128, 4)


# ---------------------------------------------------------------------------------------------- presets


def test_presets_name_their_source():
    names = mem.list_presets()
    assert {"qwen3-next-80b-a3b", "kimi-linear-48b-a3b"} <= set(names)
    for name in names:
        src = mem.load_preset(name).source
        assert src["model"] and src["file"] == "config.json" and "huggingface.co" in src["url"]


def test_qwen3_next_preset_numbers():
    plan = mem.load_preset("qwen3-next-80b-a3b")
    assert (plan.n_layers, plan.n_linear, plan.n_full) == (48, 36, 12)
    assert plan.pattern() == "(LLLF)x12" and plan.layer_types[3] == "full"
    r = mem.memory_report(plan, [4096])
    pl = r["per_layer"]
    assert pl["linear_state_bytes"] == 32 * 128 * 128 * 4 == 2_097_152  # 32 value heads, no normalizer
    assert pl["conv_state_bytes"] == (2 * 16 * 128 + 32 * 128) * 3 * 2 == 49_152
    assert pl["kv_bytes_per_token"] == 2 * 2 * 256 * 2 == 2048
    assert r["per_head"] == {"state_bytes": 65_536, "kv_bytes_per_token": 1024, "crossover_length": 64}
    assert r["crossovers"]["per_layer"] == 1048  # 2,146,304 / 2,048 exactly
    assert r["crossovers"]["hybrid_kv_vs_fixed"] == 3144  # 36 · 2,146,304 / (12 · 2,048)
    row = r["rows"][0]
    assert row["hybrid_bytes"] == 36 * 2_146_304 + 12 * 2048 * 4096 == 177_930_240
    no_conv = mem.memory_report(plan, [1], include_conv=False)
    assert no_conv["per_layer"]["conv_state_bytes"] == 0 and no_conv["crossovers"]["per_layer"] == 1024


def test_kimi_linear_preset_numbers():
    plan = mem.load_preset("kimi-linear-48b-a3b")
    assert (plan.n_layers, plan.n_linear, plan.n_full) == (27, 20, 7)
    full = [i + 1 for i, t in enumerate(plan.layer_types) if t == "full"]
    assert full == [4, 8, 12, 16, 20, 24, 27]  # 1-based in the config
    r = mem.memory_report(plan, [1])
    assert r["per_head"] is None  # MLA: one latent shared by all heads
    assert r["per_layer"]["kv_bytes_per_token"] == (512 + 64) * 2 == 1152
    assert r["per_layer"]["conv_state_bytes"] == 3 * 32 * 128 * 3 * 2 == 73_728
    assert r["crossovers"]["per_layer"] == 1885  # ceil(2,170,880 / 1,152)
    expanded = mem.memory_report(plan, [1], mla_expanded=True)
    assert expanded["per_layer"]["kv_bytes_per_token"] == 32 * (128 + 64 + 128) * 2 == 20_480


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "kimi-linear-48b-a3b"])
def test_whole_model_crossover_matches_a_search_over_totals(name):
    plan = mem.load_preset(name)
    r = mem.memory_report(plan, [1], batch=3)
    T = r["crossovers"]["hybrid_vs_all_full"]
    lens = list(range(1, 3 * T))
    c = mem.curve(r, lens)
    first = next(t for t, full, hyb in zip(lens, c["all_full_kv_bytes"], c["hybrid_bytes"], strict=True) if full >= hyb)
    assert first == T == r["crossovers"]["per_layer"]
    # batch scales bytes, never the crossover
    assert (
        r["rows"][0]["all_linear_state_bytes"] == 3 * mem.memory_report(plan, [1])["rows"][0]["all_linear_state_bytes"]
    )


# ---------------------------------------------------------------------------------------------- configs


def _qwen_config(**overrides):
    cfg = {
        "model_type": "qwen3_next", "num_hidden_layers": 8, "full_attention_interval": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "vocab_size": 100,
    }  # fmt: skip
    cfg.update(overrides)
    return cfg


def test_layer_types_and_interval_agree():
    a = mem.plan_from_config(_qwen_config())
    types = ["linear_attention"] * 3 + ["full_attention"]
    b = mem.plan_from_config(_qwen_config(layer_types=types * 2))
    assert a.layer_types == b.layer_types == ("linear", "linear", "linear", "full") * 2


def test_head_dim_falls_back_to_hidden_size_over_heads():
    cfg = _qwen_config(hidden_size=512)
    del cfg["head_dim"]
    assert mem.plan_from_config(cfg).attention.head_dim == 128


@pytest.mark.parametrize(
    "change,match",
    [
        ({"rope_tricks": 3}, r"unknown key\(s\) rope_tricks;"),
        ({"num_hidden_layers": "48"}, "'num_hidden_layers' must be an integer"),
        ({"linear_key_head_dim": -128}, "'linear_key_head_dim' must be an integer >= 1, got -128"),
        ({"linear_num_value_heads": 3}, "must be a multiple of 'linear_num_key_heads'"),
        ({"layer_types": ["linear_attention"] * 7}, "'layer_types' must be a list of num_hidden_layers=8"),
        ({"layer_types": ["mamba"] * 8}, "'layer_types': unknown entries 'mamba'; expected full_attention, linear"),
        ({"torch_dtype": "int4"}, "config key 'torch_dtype': unknown dtype 'int4'"),
        ({"linear_attn_config": {"num_heads": 2}}, "mixes Kimi 'linear_attn_config' with Qwen3-Next keys"),
    ],
)
def test_malformed_qwen_configs_name_the_key(change, match):
    with pytest.raises(ValueError, match=match):
        mem.plan_from_config(_qwen_config(**change))


def test_missing_keys_are_named():
    cfg = _qwen_config()
    del cfg["linear_value_head_dim"]
    with pytest.raises(ValueError, match="missing required key 'linear_value_head_dim'"):
        mem.plan_from_config(cfg)
    cfg = _qwen_config()
    del cfg["full_attention_interval"]
    with pytest.raises(ValueError, match="'layer_types' or 'full_attention_interval'"):
        mem.plan_from_config(cfg)
    with pytest.raises(ValueError, match="no linear-attention layers described"):
        mem.plan_from_config({"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 8})
    with pytest.raises(TypeError, match="JSON object"):
        mem.plan_from_config([1, 2])


def test_unknown_keys_can_be_skipped_on_request():
    plan = mem.plan_from_config(_qwen_config(rope_tricks=3), strict=False)
    assert plan.n_full == 2


def _kimi_config(**lac_overrides):
    lac = {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4}
    lac.update(lac_overrides)
    return {"num_hidden_layers": 4, "num_attention_heads": 2, "kv_lora_rank": 16, "qk_rope_head_dim": 4,
            "linear_attn_config": lac}  # fmt: skip


@pytest.mark.parametrize(
    "change,match",
    [
        ({"full_attn_layers": [3]}, "layer 3 is listed twice"),
        ({"full_attn_layers": []}, r"layers \[4\] are in neither"),
        ({"kda_layers": [0, 1, 2]}, r"'linear_attn_config.kda_layers': layer 0 is not in 1..4"),
        ({"kda_layers": "1-3"}, "'linear_attn_config.kda_layers' must be a list"),
        ({"chunk": 64}, r"unknown key\(s\) linear_attn_config.chunk;"),
        ({"num_heads": 0}, "'linear_attn_config.num_heads' must be an integer >= 1"),
    ],
)
def test_malformed_kimi_configs_name_the_key(change, match):
    with pytest.raises(ValueError, match=match):
        mem.plan_from_config(_kimi_config(**change))


def test_load_config_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"num_hidden_layers": 4,')
    with pytest.raises(ValueError, match=r"bad.json.*not valid JSON"):
        mem.load_config(bad)
    with pytest.raises(ValueError, match="cannot read"):
        mem.load_config(tmp_path / "absent.json")
    odd = tmp_path / "config.json"
    odd.write_text(json.dumps(_qwen_config(extra_thing=1)))
    with pytest.raises(ValueError, match=r"config.json: config: unknown key\(s\) extra_thing;"):
        mem.load_config(odd)


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_shapes_print_the_acceptance_numbers():
    args = ["memory", "--layers", "32", "--heads", "16", "--feature-dim", "128", "--full-attention-interval", "0",
            "--seq-len", "128", "--seq-len", "129"]  # fmt: skip
    res = CliRunner().invoke(cli_main, args)
    assert res.exit_code == 0, res.output
    assert "33,816,576 B (32.25 MiB)" in res.output
    assert "per head:  T = 129" in res.output
    assert "33,554,432 B (32.00 MiB)" in res.output  # KV cache at T = 128, just under the state


def test_cli_writes_json_and_png_and_refuses_to_overwrite(tmp_path):
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    args = ["memory", "--preset", "qwen3-next-80b-a3b", "--seq-len", "4096", "--output", str(out), "--plot", str(png)]
    res = CliRunner().invoke(cli_main, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["rows"][0]["hybrid_bytes"] == 177_930_240
    assert doc["crossovers"]["per_layer"] == 1048 and doc["model"]["source"]["model"].startswith("Qwen/")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = CliRunner().invoke(cli_main, args)
    assert again.exit_code == 2 and "exists; refusing to overwrite" in again.output
    assert json.loads(out.read_text()) == doc
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "args,match",
    [
        (["--preset", "qwen3-next-80b-a3b", "--layers", "4"], "use one of --preset, --config or shape flags"),
        (["--layers", "4", "--heads", "2"], "missing ['--feature-dim']"),
        (["--layers", "0", "--heads", "2", "--feature-dim", "8"], "'--layers': 0 is not in the range x>=1"),
        (["--layers", "4", "--heads", "2", "--feature-dim", "8", "--kv-dtype", "int8"], "'int8' is not one of"),
        (["--preset", "llama"], "'llama' is not one of"),
    ],
)
def test_cli_bad_input_is_a_usage_error(args, match):
    res = CliRunner().invoke(cli_main, ["memory", *args])
    assert res.exit_code == 2
    assert match in res.output


def test_cli_config_with_unknown_key_names_it(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_qwen_config(mystery=1)))
    res = CliRunner().invoke(cli_main, ["memory", "--config", str(cfg)])
    assert res.exit_code == 2 and "mystery" in res.output
    res = CliRunner().invoke(cli_main, ["memory", "--config", str(cfg), "--ignore-unknown-keys", "--seq-len", "8"])
    assert res.exit_code == 0, res.output
