"""What the state costs: bytes of a fixed linear-attention state against a growing KV cache, for hybrids too.

Pure arithmetic, no torch. The building blocks are the three formulas of docs/mechanism.md §4::

    state_bytes(B, L, H, r, dv, b)            = B·L·H·(r·dv + r)·b      (no "+ r" without a normalizer)
    kv_cache_bytes(B, L, H_kv, d, T, b)       = B·L·H_kv·2·T·d·b
    crossover_length(state, kv_per_token)     = smallest T with T·kv_per_token >= state

A `LayerPlan` describes a whole model: which layers are linear and which keep a KV cache, the shape of each,
and the short-convolution buffers linear layers carry. `configs` reads one from a model's `config.json` or a
shipped preset; `report` prices a plan at a list of lengths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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


def check_int(name: str, value: object, *, minimum: int = 1, maximum: int = MAX_SIZE) -> int:
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
    return check_int(name, dtype)


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
    r = check_int("feature_dim", feature_dim)
    per_head = r * check_int("value_dim", value_dim) + (r if normalizer else 0)
    L = check_int("layers", layers, maximum=MAX_LAYERS)
    return check_int("batch", batch) * L * check_int("heads", heads) * per_head * b


def kv_cache_bytes(batch: int, layers: int, kv_heads: int, head_dim: int, seq_len: int, dtype_bytes: int | str) -> int:
    """Bytes of a KV cache holding ``seq_len`` tokens: ``B·L·H_kv·2·T·d·b`` (keys and values)."""
    b = _dtype_arg(dtype_bytes)
    T = check_int("seq_len", seq_len, minimum=0, maximum=MAX_SEQ_LEN)  # an empty cache is a real thing: 0 bytes
    return (
        check_int("batch", batch)
        * check_int("layers", layers, maximum=MAX_LAYERS)
        * check_int("kv_heads", kv_heads)
        * 2
        * T
        * (check_int("head_dim", head_dim) * b)
    )


def conv_state_bytes(batch: int, layers: int, channels: int, kernel_size: int, dtype_bytes: int | str) -> int:
    """Bytes of short causal-convolution buffers: ``B·L·channels·(kernel_size − 1)·b``.

    A width-k causal conv needs the previous k − 1 inputs of each channel to produce the next output, so that
    is what is counted. (transformers' eager Qwen3-Next cache keeps k columns, i.e. k/(k−1) of this.)
    """
    b = _dtype_arg(dtype_bytes)
    k = check_int("kernel_size", kernel_size)
    L = check_int("layers", layers, maximum=MAX_LAYERS)
    return check_int("batch", batch) * L * check_int("channels", channels) * (k - 1) * b


def crossover_length(state_bytes: int, kv_bytes_per_token: int) -> int:
    """Smallest T whose KV cache (``T · kv_bytes_per_token``) is at least ``state_bytes``: ``ceil(state / kv)``.

    Use it per head, per layer or for a whole model; the units only have to match. Exact integer arithmetic.
    """
    s = check_int("state_bytes", state_bytes, maximum=2**256)  # products of bounded sizes
    kv = check_int("kv_bytes_per_token", kv_bytes_per_token, maximum=2**256)
    return -(-s // kv)


def _dtype_arg(value: int | str) -> int:
    return dtype_bytes(value, name="dtype_bytes")


def format_bytes(n: int) -> str:
    """Binary (IEC) units with two decimals: ``33816576 -> "32.25 MiB"``."""
    check_int("n", n, minimum=0, maximum=2**256)
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
            check_int(f"LinearMixer.{name}", getattr(self, name))
        check_int("LinearMixer.conv_channels", self.conv_channels, minimum=0)
        check_int("LinearMixer.conv_kernel", self.conv_kernel, minimum=0)


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
        check_int("AttentionCache.kv_heads", self.kv_heads)
        if self.kind == "gqa":
            check_int("AttentionCache.head_dim", self.head_dim)
        else:
            check_int("AttentionCache.latent_dim", self.latent_dim)
            check_int("AttentionCache.rope_dim", self.rope_dim, minimum=0)

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
    check_int("layers", layers, maximum=MAX_LAYERS)
    interval = check_int("full_attention_interval", full_attention_interval, minimum=0, maximum=MAX_LAYERS)
    types = tuple("full" if interval and (i + 1) % interval == 0 else "linear" for i in range(layers))
    linear = LinearMixer(
        heads=check_int("heads", heads),
        key_dim=check_int("feature_dim", feature_dim),
        value_dim=check_int("value_dim", feature_dim if value_dim is None else value_dim),
        normalizer=bool(normalizer),
    )
    attention = AttentionCache(
        "gqa",
        kv_heads=check_int("kv_heads", heads if kv_heads is None else kv_heads),
        head_dim=check_int("head_dim", feature_dim if head_dim is None else head_dim),
    )
    return LayerPlan(name, types, linear, attention, canonical_dtype(model_dtype, name="model_dtype"))
