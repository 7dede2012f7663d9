"""Model configs read into a `LayerPlan`: HuggingFace-style ``config.json``
files (Qwen3-Next and Kimi Linear keys) and the presets shipped beside this module (``presets/``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from linattn.tools.harness.jsonfile import read_json
from linattn.tools.memory.formulas import (
    MAX_LAYERS,
    MAX_SIZE,
    AttentionCache,
    LayerPlan,
    LinearMixer,
    canonical_dtype,
)

# Keys that decide the memory of a Qwen3-Next or Kimi Linear model, read below.
_USED_KEYS = {
    "model_type", "num_hidden_layers", "layer_types", "full_attention_interval",
    "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "torch_dtype", "dtype",
    "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
    "linear_conv_kernel_dim", "linear_attn_config",
    "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
}  # fmt: skip
# Keys of the same configs that do not change the state or the cache (MoE, RoPE, norms, tokens, bookkeeping).
_IGNORED_KEYS = {
    "architectures", "auto_map", "transformers_version", "attention_bias", "attention_dropout", "bos_token_id",
    "eos_token_id", "pad_token_id", "hidden_act", "initializer_range", "intermediate_size", "rms_norm_eps",
    "max_position_embeddings", "model_max_length", "use_cache", "tie_word_embeddings", "vocab_size",
    "rope_theta", "rope_scaling", "rope_parameters", "partial_rotary_factor", "use_sliding_window", "sliding_window",
    "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "shared_expert_intermediate_size",
    "num_experts", "num_experts_per_tok", "num_experts_per_token", "num_shared_experts", "norm_topk_prob",
    "output_router_logits", "router_aux_loss_coef", "q_lora_rank", "mla_use_nope", "first_k_dense_replace",
    "moe_layer_freq", "moe_renormalize", "moe_router_activation_func", "routed_scaling_factor",
    "use_grouped_topk", "num_expert_group", "topk_group", "n_routed_experts", "n_shared_experts", "n_group",
    "num_nextn_predict_layers", "mtp_num_hidden_layers", "pretraining_tp", "quantization_config",
}  # fmt: skip
_KIMI_LINEAR_KEYS = {"kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size"}
_KIMI_LINEAR_IGNORED = {"gate_lower_bound", "use_full_rank_gate"}
_QWEN_LINEAR_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def _ckey(config: Mapping[str, Any], key: str, *, prefix: str = "", default: Any = ..., minimum: int = 1,
          maximum: int = MAX_SIZE) -> int:
    """A positive integer from the config, with an error that names the key."""
    if key not in config or config[key] is None:
        if default is ...:
            raise ValueError(f"config: missing required key {prefix + key!r}")
        return default
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"config key {prefix + key!r} must be an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise ValueError(f"config key {prefix + key!r} must be at most {maximum:,} (far beyond any real model)")
    return value


def _check_keys(config: Mapping[str, Any], allowed: set[str], prefix: str = "") -> None:
    # Leading-underscore keys are metadata (HF's _name_or_path, our presets' _source).
    unknown = sorted(k for k in config if k not in allowed and not str(k).startswith("_"))
    if unknown:
        raise ValueError(
            f"config: unknown key(s) {', '.join(prefix + str(k) for k in unknown)}; the memory planner reads "
            "Qwen3-Next and Kimi Linear style keys (pass strict=False / --ignore-unknown-keys to skip keys it does "
            "not know)"
        )


def _qwen_layer_types(config: Mapping[str, Any], n_layers: int) -> tuple[str, ...]:
    if "layer_types" in config and config["layer_types"] is not None:
        types = config["layer_types"]
        if not isinstance(types, list) or len(types) != n_layers:
            raise ValueError(f"config key 'layer_types' must be a list of num_hidden_layers={n_layers} names")
        mapping = {"linear_attention": "linear", "full_attention": "full"}
        bad = sorted({str(t) for t in types if t not in mapping})
        if bad:
            raise ValueError(f"config key 'layer_types': unknown entries {', '.join(map(repr, bad))}; expected "
                             f"{', '.join(sorted(mapping))}")
        return tuple(mapping[t] for t in types)
    if "full_attention_interval" not in config:
        raise ValueError("config: needs 'layer_types' or 'full_attention_interval' to place the full-attention layers")
    interval = _ckey(config, "full_attention_interval")
    return tuple("full" if (i + 1) % interval == 0 else "linear" for i in range(n_layers))


def _kimi_layer_types(lac: Mapping[str, Any], n_layers: int) -> tuple[str, ...]:
    types: list[str | None] = [None] * n_layers
    for key, kind in (("kda_layers", "linear"), ("full_attn_layers", "full")):
        idx = lac.get(key)
        if not isinstance(idx, list):
            raise ValueError(f"config key 'linear_attn_config.{key}' must be a list of 1-based layer numbers")
        for i in idx:
            if isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= n_layers:
                raise ValueError(f"config key 'linear_attn_config.{key}': layer {i!r} is not in 1..{n_layers}")
            if types[i - 1] is not None:
                raise ValueError(f"config key 'linear_attn_config.{key}': layer {i} is listed twice")
            types[i - 1] = kind
    missing = [i + 1 for i, t in enumerate(types) if t is None]
    if missing:
        raise ValueError(
            f"config: layers {missing} are in neither 'linear_attn_config.kda_layers' nor 'full_attn_layers'"
        )
    return tuple(t for t in types if t is not None)


def _attention_cache(config: Mapping[str, Any]) -> AttentionCache:
    heads = _ckey(config, "num_attention_heads", default=None)
    if config.get("kv_lora_rank") is not None:  # multi-head latent attention (DeepSeek-style, Kimi Linear)
        if heads is None:
            raise ValueError("config: missing required key 'num_attention_heads' (MLA layers need it)")
        return AttentionCache(
            "mla",
            kv_heads=heads,
            head_dim=_ckey(config, "qk_nope_head_dim", default=0, minimum=0),
            latent_dim=_ckey(config, "kv_lora_rank"),
            rope_dim=_ckey(config, "qk_rope_head_dim", default=0, minimum=0),
            value_dim=_ckey(config, "v_head_dim", default=0, minimum=0),
        )
    kv_heads = _ckey(config, "num_key_value_heads", default=heads)
    if kv_heads is None:
        raise ValueError("config: missing required key 'num_key_value_heads' (or 'num_attention_heads')")
    head_dim = _ckey(config, "head_dim", default=None)
    if head_dim is None:  # HF's fallback: hidden_size / num_attention_heads
        if heads is None or "hidden_size" not in config:
            raise ValueError("config: missing required key 'head_dim' (or 'hidden_size' and 'num_attention_heads')")
        head_dim = _ckey(config, "hidden_size") // heads
    return AttentionCache("gqa", kv_heads=kv_heads, head_dim=head_dim)


def plan_from_config(config: Mapping[str, Any], *, strict: bool = True, name: str | None = None) -> LayerPlan:
    """A [`LayerPlan`][linattn.tools.memory.LayerPlan] from a HuggingFace-style ``config.json`` dict.

    Qwen3-Next style: ``layer_types`` or ``full_attention_interval``; ``linear_num_{key,value}_heads``,
    ``linear_{key,value}_head_dim``, ``linear_conv_kernel_dim``; full layers from ``num_key_value_heads`` and
    ``head_dim``. Kimi Linear style: ``linear_attn_config`` with 1-based ``kda_layers``/``full_attn_layers``,
    ``num_heads``, ``head_dim``, ``short_conv_kernel_size``; full layers are MLA (``kv_lora_rank``,
    ``qk_rope_head_dim``). Both linear kinds are delta rules: no normalizer. With ``strict``, a key the planner
    does not know is an error naming it.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a JSON object (dict), got {type(config).__name__}")
    lac = config.get("linear_attn_config")
    qwen_keys = [k for k in _QWEN_LINEAR_KEYS if k in config]
    if lac is not None and qwen_keys:
        raise ValueError(f"config: mixes Kimi 'linear_attn_config' with Qwen3-Next keys {qwen_keys}; use one style")
    if strict:
        _check_keys(config, _USED_KEYS | _IGNORED_KEYS)
    n_layers = _ckey(config, "num_hidden_layers", maximum=MAX_LAYERS)
    attention = _attention_cache(config)
    dtype_key = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    dtype_name = config.get(dtype_key) or "bfloat16"
    if not isinstance(dtype_name, str):
        raise ValueError(f"config key {dtype_key!r} must be a dtype name, got {dtype_name!r}")
    model_dtype = canonical_dtype(dtype_name, name=f"config key {dtype_key!r}")

    if lac is not None:
        if not isinstance(lac, Mapping):
            raise ValueError(f"config key 'linear_attn_config' must be an object, got {type(lac).__name__}")
        if strict:
            _check_keys(lac, _KIMI_LINEAR_KEYS | _KIMI_LINEAR_IGNORED, prefix="linear_attn_config.")
        types = _kimi_layer_types(lac, n_layers)
        p = "linear_attn_config."
        heads, dim = _ckey(lac, "num_heads", prefix=p), _ckey(lac, "head_dim", prefix=p)
        kernel = _ckey(lac, "short_conv_kernel_size", prefix=p, default=0, minimum=0)
        # KDA: per head a dim x dim state (value width = key width); q, k and v each pass a short conv.
        linear = LinearMixer(heads, dim, dim, normalizer=False, conv_channels=3 * heads * dim if kernel else 0,
                             conv_kernel=kernel)  # fmt: skip
    elif qwen_keys:
        types = _qwen_layer_types(config, n_layers)
        nk, nv = _ckey(config, "linear_num_key_heads"), _ckey(config, "linear_num_value_heads")
        dk, dv = _ckey(config, "linear_key_head_dim"), _ckey(config, "linear_value_head_dim")
        if nv % nk:
            raise ValueError(
                f"config: 'linear_num_value_heads' ({nv}) must be a multiple of 'linear_num_key_heads' ({nk})"
            )
        kernel = _ckey(config, "linear_conv_kernel_dim", default=0, minimum=0)
        # Gated DeltaNet: keys are shared across value heads, so the state is nv heads of dk x dv;
        # the conv runs over the concatenated q, k, v projections (2·nk·dk + nv·dv channels).
        linear = LinearMixer(nv, dk, dv, normalizer=False, conv_channels=(2 * nk * dk + nv * dv) if kernel else 0,
                             conv_kernel=kernel)  # fmt: skip
    else:
        raise ValueError(
            "config: no linear-attention layers described; expected Qwen3-Next keys "
            f"{', '.join(map(str, _QWEN_LINEAR_KEYS))} or a Kimi 'linear_attn_config'"
        )
    label = name or str(config.get("_name_or_path") or config.get("model_type") or "config")
    return LayerPlan(label, types, linear, attention, model_dtype, source=config.get("_source"))


def load_config(path: str | Path, *, strict: bool = True) -> LayerPlan:
    """Read a ``config.json`` file into a [`LayerPlan`][linattn.tools.memory.LayerPlan]; errors name the file."""
    p = Path(path)
    try:  # a regular file of bounded size, bounded nesting and finite numbers (linattn.tools.harness.jsonfile)
        data = read_json(p, what="config:")
    except FileNotFoundError as e:
        raise ValueError(f"config: cannot read {str(p)!r}: it does not exist") from e
    try:
        return plan_from_config(data, strict=strict, name=p.stem if p.name != "config.json" else p.parent.name)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{p}: {e}") from e


def list_presets() -> list[str]:
    """Names of the configs shipped in ``linattn/tools/memory/presets``."""
    folder = resources.files("linattn.tools.memory") / "presets"
    return sorted(f.name[: -len(".json")] for f in folder.iterdir() if f.name.endswith(".json"))


def load_preset(name: str) -> LayerPlan:
    """A shipped preset by name (see [`list_presets`][linattn.tools.memory.list_presets])."""
    names = list_presets()
    if name not in names:
        raise ValueError(f"preset: unknown preset {name!r}; expected one of {names}")
    text = (resources.files("linattn.tools.memory") / "presets" / f"{name}.json").read_text(encoding="utf-8")
    return plan_from_config(json.loads(text), name=name)
