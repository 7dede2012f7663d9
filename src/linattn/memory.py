"""What the state costs: bytes of a fixed linear-attention state against a growing KV cache, for hybrids too.

Pure arithmetic, no torch. The building blocks are the three formulas of docs/mechanism.md §4::

    state_bytes(B, L, H, r, dv, b)            = B·L·H·(r·dv + r)·b      (no "+ r" without a normalizer)
    kv_cache_bytes(B, L, H_kv, d, T, b)       = B·L·H_kv·2·T·d·b
    crossover_length(state, kv_per_token)     = smallest T with T·kv_per_token >= state

A :class:`LayerPlan` describes a whole model: which layers are linear and which keep a KV cache, the shape of
each, and the short-convolution buffers linear layers carry. :func:`plan_from_config` reads one from a
HuggingFace-style ``config.json`` (Qwen3-Next and Kimi Linear keys), :func:`load_preset` from the presets
shipped in ``linattn/presets``, and :func:`memory_report` prices a plan at a list of lengths.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from linattn.jsonfile import read_json

# Element sizes by name. Names are matched case-insensitively; "torch." prefixes (as in some configs) are dropped.
DTYPE_BYTES = {
    "float64": 8, "fp64": 8,
    "float32": 4, "fp32": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2,
}  # fmt: skip


# ---------------------------------------------------------------------------------------------- validation
# Upper bounds that keep every answer constant in time and memory: a plan lists its layers (bounded by
# MAX_LAYERS), everything else is integer arithmetic on bounded numbers. Each is far above any real model.
MAX_LAYERS = 100_000  # real models have at most a few hundred layers
MAX_SEQ_LEN = 2**50  # about 1.1e15 tokens
MAX_SIZE = 2**24  # batch, heads, widths, kernel sizes, byte counts of a dtype


def _check_int(name: str, value: object, *, minimum: int = 1, maximum: int = MAX_SIZE) -> int:
    # bool is an int subclass; True as a head count is a bug upstream, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be {what}, got {value}")
    if value > maximum:
        shown = f"{value:,}" if value.bit_length() < 200 else f"an integer of {value.bit_length()} bits"
        raise ValueError(f"{name} must be at most {maximum:,}, got {shown} (far beyond any real model)")
    return value


def dtype_bytes(dtype: str | int, *, name: str = "dtype") -> int:
    """Bytes per element for a dtype name (float32/fp32, bfloat16/bf16, float16/fp16, float64) or a byte count."""
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key not in DTYPE_BYTES:
            raise ValueError(f"{name}: unknown dtype {dtype!r}; expected one of {', '.join(sorted(DTYPE_BYTES))}")
        return DTYPE_BYTES[key]
    return _check_int(name, dtype)


def canonical_dtype(dtype: str, *, name: str = "dtype") -> str:
    """The long name of a dtype alias: ``"bf16" -> "bfloat16"``."""
    if not isinstance(dtype, str):
        raise TypeError(f"{name} must be a dtype name, got {type(dtype).__name__} {dtype!r}")
    dtype_bytes(dtype, name=name)  # validates the name
    key = dtype.strip().lower().removeprefix("torch.")
    return {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(key, key)


# ---------------------------------------------------------------------------------------------- formulas


def state_bytes(
    batch: int,
    layers: int,
    heads: int,
    feature_dim: int,
    value_dim: int,
    dtype_bytes: int | str,
    normalizer: bool = True,
) -> int:
    """Bytes of the recurrent state: ``B·L·H·(r·dv + r)·b``, or ``B·L·H·r·dv·b`` when ``normalizer=False``.

    Independent of the history length. ``dtype_bytes`` is a byte count or a dtype name.
    """
    b = _dtype_arg(dtype_bytes)
    r = _check_int("feature_dim", feature_dim)
    per_head = r * _check_int("value_dim", value_dim) + (r if normalizer else 0)
    L = _check_int("layers", layers, maximum=MAX_LAYERS)
    return _check_int("batch", batch) * L * _check_int("heads", heads) * per_head * b


def kv_cache_bytes(batch: int, layers: int, kv_heads: int, head_dim: int, seq_len: int, dtype_bytes: int | str) -> int:
    """Bytes of a KV cache holding ``seq_len`` tokens: ``B·L·H_kv·2·T·d·b`` (keys and values)."""
    b = _dtype_arg(dtype_bytes)
    T = _check_int("seq_len", seq_len, minimum=0, maximum=MAX_SEQ_LEN)  # an empty cache is a real thing: 0 bytes
    return (
        _check_int("batch", batch)
        * _check_int("layers", layers, maximum=MAX_LAYERS)
        * _check_int("kv_heads", kv_heads)
        * 2
        * T
        * (_check_int("head_dim", head_dim) * b)
    )


def conv_state_bytes(batch: int, layers: int, channels: int, kernel_size: int, dtype_bytes: int | str) -> int:
    """Bytes of short causal-convolution buffers: ``B·L·channels·(kernel_size − 1)·b``.

    A width-k causal conv needs the previous k − 1 inputs of each channel to produce the next output, so that
    is what is counted. (transformers' eager Qwen3-Next cache keeps k columns, i.e. k/(k−1) of this.)
    """
    b = _dtype_arg(dtype_bytes)
    k = _check_int("kernel_size", kernel_size)
    L = _check_int("layers", layers, maximum=MAX_LAYERS)
    return _check_int("batch", batch) * L * _check_int("channels", channels) * (k - 1) * b


def crossover_length(state_bytes: int, kv_bytes_per_token: int) -> int:
    """Smallest T whose KV cache (``T · kv_bytes_per_token``) is at least ``state_bytes``: ``ceil(state / kv)``.

    Use it per head, per layer or for a whole model; the units only have to match. Exact integer arithmetic.
    """
    s = _check_int("state_bytes", state_bytes, maximum=2**256)  # products of bounded sizes
    kv = _check_int("kv_bytes_per_token", kv_bytes_per_token, maximum=2**256)
    return -(-s // kv)


def _dtype_arg(value: int | str) -> int:
    return dtype_bytes(value, name="dtype_bytes")


def format_bytes(n: int) -> str:
    """Binary (IEC) units with two decimals: ``33816576 -> "32.25 MiB"``."""
    _check_int("n", n, minimum=0, maximum=2**256)
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = min(int(math.log(n, 1024)) if n else 0, len(units) - 1)
    while i and n < 1024**i:  # guard log rounding at exact powers
        i -= 1
    return f"{n} B" if i == 0 else f"{n / 1024**i:.2f} {units[i]}"


# ---------------------------------------------------------------------------------------------- layer plan


@dataclass(frozen=True)
class LinearMixer:
    """Shape of one linear-attention layer's fixed state.

    ``heads`` state heads of ``key_dim x value_dim`` (plus a ``key_dim`` normalizer each when ``normalizer``),
    and optional short-conv buffers of ``conv_channels`` channels and width ``conv_kernel`` (0 = none).
    """

    heads: int
    key_dim: int
    value_dim: int
    normalizer: bool
    conv_channels: int = 0
    conv_kernel: int = 0

    def __post_init__(self) -> None:
        for name in ("heads", "key_dim", "value_dim"):
            _check_int(f"LinearMixer.{name}", getattr(self, name))
        _check_int("LinearMixer.conv_channels", self.conv_channels, minimum=0)
        _check_int("LinearMixer.conv_kernel", self.conv_kernel, minimum=0)


@dataclass(frozen=True)
class AttentionCache:
    """What one full-attention layer caches per token.

    ``kind="gqa"``: ``kv_heads`` keys and values of ``head_dim`` each. ``kind="mla"``: one compressed latent of
    ``latent_dim + rope_dim`` shared by all heads (what vLLM/SGLang keep for multi-head latent attention), or,
    with ``mla_expanded=True``, the decompressed per-head keys and values that transformers' eager cache holds.
    """

    kind: str
    kv_heads: int
    head_dim: int = 0
    latent_dim: int = 0
    rope_dim: int = 0
    value_dim: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("gqa", "mla"):
            raise ValueError(f"AttentionCache.kind must be 'gqa' or 'mla', got {self.kind!r}")
        _check_int("AttentionCache.kv_heads", self.kv_heads)
        if self.kind == "gqa":
            _check_int("AttentionCache.head_dim", self.head_dim)
        else:
            _check_int("AttentionCache.latent_dim", self.latent_dim)
            _check_int("AttentionCache.rope_dim", self.rope_dim, minimum=0)

    def elements_per_token(self, *, mla_expanded: bool = False) -> int:
        if self.kind == "gqa":
            return 2 * self.kv_heads * self.head_dim
        if mla_expanded:  # K: heads x (nope + rope), V: heads x v_head_dim
            return self.kv_heads * (self.head_dim + self.rope_dim + self.value_dim)
        return self.latent_dim + self.rope_dim


@dataclass(frozen=True)
class LayerPlan:
    """A model as a sequence of ``"linear"`` and ``"full"`` layers with one shape for each kind."""

    name: str
    layer_types: tuple[str, ...]
    linear: LinearMixer
    attention: AttentionCache
    model_dtype: str = "bfloat16"
    source: Any = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            raise ValueError("LayerPlan.layer_types must name at least one layer")
        if len(self.layer_types) > MAX_LAYERS:
            raise ValueError(f"LayerPlan.layer_types: {len(self.layer_types):,} layers, more than {MAX_LAYERS:,}")
        bad = sorted({t for t in self.layer_types if t not in ("linear", "full")})
        if bad:
            raise ValueError(f"LayerPlan.layer_types: unknown layer type(s) {', '.join(map(repr, bad))}; expected "
                             "'linear' or 'full'")
        canonical_dtype(self.model_dtype, name="LayerPlan.model_dtype")

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @property
    def n_linear(self) -> int:
        return self.layer_types.count("linear")

    @property
    def n_full(self) -> int:
        return self.layer_types.count("full")

    def pattern(self) -> str:
        """Compact layer pattern, ``L`` linear and ``F`` full, with a repeat count when periodic: ``"(LLLF)x12"``."""
        s = "".join("L" if t == "linear" else "F" for t in self.layer_types)
        for p in range(1, len(s) // 2 + 1):
            if len(s) % p == 0 and s[:p] * (len(s) // p) == s:
                return f"({s[:p]})x{len(s) // p}"
        return s


def plan_from_shapes(
    *,
    layers: int,
    heads: int,
    feature_dim: int,
    value_dim: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    full_attention_interval: int = 0,
    normalizer: bool = True,
    model_dtype: str = "bfloat16",
    name: str = "custom",
) -> LayerPlan:
    """A plan from bare shapes: every ``full_attention_interval``-th layer keeps a KV cache (0: none do).

    ``value_dim`` defaults to ``feature_dim``, ``kv_heads`` to ``heads``, ``head_dim`` to ``feature_dim``.
    """
    _check_int("layers", layers, maximum=MAX_LAYERS)
    interval = _check_int("full_attention_interval", full_attention_interval, minimum=0, maximum=MAX_LAYERS)
    types = tuple("full" if interval and (i + 1) % interval == 0 else "linear" for i in range(layers))
    linear = LinearMixer(
        heads=_check_int("heads", heads),
        key_dim=_check_int("feature_dim", feature_dim),
        value_dim=_check_int("value_dim", feature_dim if value_dim is None else value_dim),
        normalizer=bool(normalizer),
    )
    attention = AttentionCache(
        "gqa",
        kv_heads=_check_int("kv_heads", heads if kv_heads is None else kv_heads),
        head_dim=_check_int("head_dim", feature_dim if head_dim is None else head_dim),
    )
    return LayerPlan(name, types, linear, attention, canonical_dtype(model_dtype, name="model_dtype"))


# ---------------------------------------------------------------------------------------------- config.json

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
            "Qwen3-Next and "
            "Kimi Linear style keys (pass strict=False / --ignore-unknown-keys to skip keys it does not know)"
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
    """A :class:`LayerPlan` from a HuggingFace-style ``config.json`` dict.

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
    """Read a ``config.json`` file into a :class:`LayerPlan`; errors name the file."""
    p = Path(path)
    try:  # a regular file of bounded size, bounded nesting and finite numbers (linattn.jsonfile)
        data = read_json(p, what="config:")
    except FileNotFoundError as e:
        raise ValueError(f"config: cannot read {str(p)!r}: it does not exist") from e
    try:
        return plan_from_config(data, strict=strict, name=p.stem if p.name != "config.json" else p.parent.name)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{p}: {e}") from e


def list_presets() -> list[str]:
    """Names of the configs shipped in ``linattn/presets``."""
    folder = resources.files("linattn") / "presets"
    return sorted(f.name[: -len(".json")] for f in folder.iterdir() if f.name.endswith(".json"))


def load_preset(name: str) -> LayerPlan:
    """A shipped preset by name (see :func:`list_presets`)."""
    names = list_presets()
    if name not in names:
        raise ValueError(f"preset: unknown preset {name!r}; expected one of {names}")
    text = (resources.files("linattn") / "presets" / f"{name}.json").read_text(encoding="utf-8")
    return plan_from_config(json.loads(text), name=name)


# ---------------------------------------------------------------------------------------------- report


def memory_report(
    plan: LayerPlan,
    seq_lens: Iterable[int],
    *,
    batch: int = 1,
    state_dtype: str = "float32",
    kv_dtype: str | None = None,
    conv_dtype: str | None = None,
    include_conv: bool = True,
    mla_expanded: bool = False,
) -> dict[str, Any]:
    """Exact bytes of ``plan`` at each length, per head, per layer and for the whole model, and the crossovers.

    Three models are compared at every T: ``all_full`` (every layer keeps the KV cache of the full layers),
    ``all_linear`` (every layer keeps the linear state) and ``hybrid`` (the plan as given). ``kv_dtype`` and
    ``conv_dtype`` default to the model's dtype; the state defaults to float32 (mechanism §5). Returns a JSON-ready
    dict; all byte counts are Python ints.
    """
    B = _check_int("batch", batch)
    kv_dtype = canonical_dtype(kv_dtype or plan.model_dtype, name="kv_dtype")
    conv_dtype = canonical_dtype(conv_dtype or kv_dtype, name="conv_dtype")
    state_dtype = canonical_dtype(state_dtype, name="state_dtype")
    sb, kb, cb = dtype_bytes(state_dtype), dtype_bytes(kv_dtype), dtype_bytes(conv_dtype)
    lin, att = plan.linear, plan.attention
    lens = [_check_int("seq_len", T, minimum=0, maximum=MAX_SEQ_LEN) for T in seq_lens]
    if not lens:
        raise ValueError("seq_lens must name at least one length")

    state_layer = state_bytes(B, 1, lin.heads, lin.key_dim, lin.value_dim, sb, normalizer=lin.normalizer)
    conv_layer = (
        conv_state_bytes(B, 1, lin.conv_channels, lin.conv_kernel, cb) if include_conv and lin.conv_kernel else 0
    )
    fixed_layer = state_layer + conv_layer
    kv_token_layer = B * att.elements_per_token(mla_expanded=mla_expanded) * kb
    L, n_lin, n_full = plan.n_layers, plan.n_linear, plan.n_full

    def totals(T: int) -> dict[str, int]:
        return {
            "seq_len": T,
            "all_full_kv_bytes": L * kv_token_layer * T,
            "all_linear_state_bytes": L * fixed_layer,
            "hybrid_bytes": n_lin * fixed_layer + n_full * kv_token_layer * T,
            "hybrid_fixed_bytes": n_lin * fixed_layer,
            "hybrid_kv_bytes": n_full * kv_token_layer * T,
        }

    per_head = None
    if att.kind == "gqa":  # MLA's latent is shared by all heads: no per-head cache to compare against
        head_state = state_bytes(1, 1, 1, lin.key_dim, lin.value_dim, sb, normalizer=lin.normalizer)
        head_kv = kv_cache_bytes(1, 1, 1, att.head_dim, 1, kb)
        per_head = {
            "state_bytes": head_state,
            "kv_bytes_per_token": head_kv,
            "crossover_length": crossover_length(head_state, head_kv),
        }
    crossovers = {
        "per_head": None if per_head is None else per_head["crossover_length"],
        # one linear layer's fixed bytes against one full layer's cache; also where the hybrid beats all-full
        "per_layer": crossover_length(fixed_layer, kv_token_layer),
        # whole model: the hybrid holds no more than full attention in every layer from here on. Equal to
        # per_layer by algebra (n_lin·S <= n_lin·kv·T), computed from the model totals as a cross-check.
        "hybrid_vs_all_full": crossover_length(n_lin * fixed_layer, n_lin * kv_token_layer) if n_lin else None,
        # where the hybrid's own KV cache outgrows its fixed linear states
        "hybrid_kv_vs_fixed": crossover_length(n_lin * fixed_layer, n_full * kv_token_layer)
        if n_lin and n_full
        else None,
    }
    return {
        "model": {
            "name": plan.name,
            "source": plan.source,
            "layers": L,
            "linear_layers": n_lin,
            "full_attention_layers": n_full,
            "pattern": plan.pattern(),
            "linear": {
                "heads": lin.heads,
                "key_dim": lin.key_dim,
                "value_dim": lin.value_dim,
                "normalizer": lin.normalizer,
                "conv_channels": lin.conv_channels,
                "conv_kernel": lin.conv_kernel,
            },
            "attention": {
                "kind": att.kind,
                "kv_heads": att.kv_heads,
                "head_dim": att.head_dim,
                "latent_dim": att.latent_dim,
                "rope_dim": att.rope_dim,
                "value_dim": att.value_dim,
                "elements_per_token": att.elements_per_token(mla_expanded=mla_expanded),
                "mla_cache": ("expanded" if mla_expanded else "latent") if att.kind == "mla" else None,
            },
        },
        "settings": {
            "batch": B,
            "state_dtype": state_dtype,
            "kv_dtype": kv_dtype,
            "conv_dtype": conv_dtype,
            "include_conv_state": bool(include_conv and lin.conv_kernel),
        },
        "per_head": per_head,
        "per_layer": {
            "linear_state_bytes": state_layer,
            "conv_state_bytes": conv_layer,
            "linear_fixed_bytes": fixed_layer,
            "kv_bytes_per_token": kv_token_layer,
        },
        "crossovers": crossovers,
        "rows": [totals(T) for T in lens],
    }


def curve(report: Mapping[str, Any], seq_lens: Sequence[int]) -> dict[str, list[int]]:
    """The three totals of ``report`` at other lengths (for plots), from its per-layer numbers."""
    m, pl = report["model"], report["per_layer"]
    L, n_lin, n_full = m["layers"], m["linear_layers"], m["full_attention_layers"]
    fixed, kv = pl["linear_fixed_bytes"], pl["kv_bytes_per_token"]
    return {
        "seq_len": list(seq_lens),
        "all_full_kv_bytes": [L * kv * T for T in seq_lens],
        "all_linear_state_bytes": [L * fixed for _ in seq_lens],
        "hybrid_bytes": [n_lin * fixed + n_full * kv * T for T in seq_lens],
    }
