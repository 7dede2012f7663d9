"""Token mixers built on the public API: :class:`LinearAttention` (every rule) and :class:`SoftmaxAttention`.

Both take ``x [B, T, hidden]`` and return ``(y [B, T, hidden], cache)``. The cache is what decoding needs next:
the recurrent state and the short convolution's last inputs (linear), or the keys and values seen so far
(softmax). Passing it back continues the sequence: a full forward equals a prefill at any split point followed by
token-by-token decode, to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import linattn
from linattn.state import State

# Feature map and normalizer per rule when not given: Katharopoulos et al. for accumulate, GLA (no map, no
# normalizer, the output norm keeps the scale) for gated, L2-normalized q and k for the delta rules (DeltaNet,
# Gated DeltaNet, KDA; the normalization fla and Qwen3-Next apply in the kernel).
DEFAULT_FEATURE_MAP = {"accumulate": "elu1", "gated": None, "delta": "l2", "gated_delta": "l2"}


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, computed in float32 (as HF and fla)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Gates in float32 at least (a half-precision gate rounds exp(g) coarsely); float64 stays float64, so that
    a float64 model's prefill and decode agree to float64 rounding."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@dataclass
class LinearAttentionCache:
    """Decode state of one :class:`LinearAttention` layer: ``state`` (S, z) and ``conv`` ``[B, K-1, C]``, the last
    K-1 inputs of the short convolution (``None`` without one)."""

    state: State
    conv: torch.Tensor | None = None


def _sequence_offsets(cu_seqlens: torch.Tensor, T: int) -> torch.Tensor:
    """Position of every packed token inside its own sequence, ``[T]``."""
    cu = cu_seqlens.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    return torch.arange(T, device=cu.device) - cu[:-1][rows]


def causal_conv(x, weight, history=None, cu_seqlens=None):
    """Depthwise causal convolution with SiLU: ``y_t = silu(sum_j w[:, j] x_{t-K+1+j})``, x ``[B, T, C]``,
    weight ``[C, K]``. ``history [B, K-1, C]`` is the input before x (zeros if None); with ``cu_seqlens`` no tap
    reaches into the previous sequence. Returns (y, the new history: the last K-1 inputs)."""
    B, T, C = x.shape
    K = weight.shape[-1]
    if history is None:
        history = x.new_zeros(B, K - 1, C)
    xs = torch.cat([history.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
    tail = xs[:, T:] if K > 1 else xs[:, :0]
    if cu_seqlens is None:  # one depthwise conv1d (oneDNN on CPU), valid positions only: the history is the padding
        y = F.conv1d(xs.transpose(1, 2), weight.unsqueeze(1), groups=C).transpose(1, 2)
        return F.silu(y), tail
    offsets = _sequence_offsets(cu_seqlens, T)
    y = 0
    for j in range(K):
        lag = K - 1 - j  # tap j reads token t - lag
        tap = xs[:, j:j + T] * weight[:, j]
        if lag:  # no tap reaches into the previous sequence
            tap = tap * (offsets >= lag).to(x.dtype)[None, :, None]
        y = y + tap
    return F.silu(y), tail


class LinearAttention(nn.Module):
    """A linear-attention token mixer for any rule, with the published parameterizations.

    Args:
        hidden_size, num_heads, head_dim: model width, q/k heads and their width.
        rule: ``"accumulate"``, ``"gated"`` (GLA), ``"delta"`` (DeltaNet) or ``"gated_delta"`` (Gated DeltaNet;
            with ``per_channel_gate=True`` Kimi Delta Attention).
        feature_map, normalize: passed to :func:`linattn.linear_attention`; default per rule (``DEFAULT_FEATURE_MAP``;
            ``normalize=None`` is the rule's own definition, except gated, which runs unnormalized as GLA does).
        num_v_heads, v_head_dim: value heads (a multiple of ``num_heads``: grouped value heads) and their width;
            default ``num_heads`` and ``head_dim``.
        conv_size: short causal depthwise convolution (with SiLU) over q, k, v, as in fla and Qwen3-Next; 0 for none.
        per_channel_gate: gated rules: one gate per key channel from a low-rank projection (GLA:
            ``logsigmoid(W2 W1 x) / 16``; KDA: ``-exp(A) softplus(W2 W1 x + dt_bias)``) instead of one per head
            (Gated DeltaNet: ``g = -exp(A) softplus(a(x) + dt_bias)``). Default: True for gated, False for gated_delta.
        gate_rank: rank of the low-rank gate projection (GLA uses 16).
        output_gate: ``o = RMSNorm(o) * silu(W_z x)`` per value head (Gated DeltaNet, GLA); else ``RMSNorm(o)``.
        chunk_size, form: passed to :func:`linattn.linear_attention` for sequences longer than one token.
        state_dtype: the recurrent state's accumulation dtype, passed to :func:`linattn.linear_attention` and
            :func:`linattn.step`; ``None`` (default) is linattn's own (float32, also under bfloat16 weights).

    ``forward(x, cache=None, cu_seqlens=None) -> (y, cache)``. One token with a cache decodes through
    :func:`linattn.step`; longer inputs run ``form`` with the cache's state as initial state. With ``cu_seqlens``
    (batch 1, packed sequences) the cache returned holds one entry per sequence.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        rule: str = "gated_delta",
        feature_map: str | None | object = "default",
        normalize: bool | None = None,
        num_v_heads: int | None = None,
        v_head_dim: int | None = None,
        conv_size: int = 4,
        per_channel_gate: bool | None = None,
        gate_rank: int = 16,
        output_gate: bool = True,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
        form: str = "chunk",
        state_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if rule not in linattn.RULES:
            raise ValueError(f"rule: unknown rule {rule!r}; expected one of {list(linattn.RULES)}")
        self.rule, self.form, self.chunk_size, self.state_dtype = rule, form, chunk_size, state_dtype
        self.feature_map = DEFAULT_FEATURE_MAP[rule] if feature_map == "default" else feature_map
        self.normalize = (False if rule == "gated" else None) if normalize is None else normalize
        self.num_heads, self.head_dim = num_heads, head_dim
        self.num_v_heads = num_v_heads or num_heads
        self.v_head_dim = v_head_dim or head_dim
        if self.num_v_heads % num_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) must be a multiple of num_heads ({num_heads})")
        key_dim, value_dim = num_heads * head_dim, self.num_v_heads * self.v_head_dim
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)
        self.conv_size = conv_size
        if conv_size:
            # One depthwise kernel over the concatenated [q | k | v] channels (Qwen3-Next's layout).
            self.conv_weight = nn.Parameter(torch.randn(2 * key_dim + value_dim, conv_size) / math.sqrt(conv_size))
        self.per_channel_gate = (rule == "gated") if per_channel_gate is None else per_channel_gate
        HV = self.num_v_heads
        if rule in ("gated", "gated_delta"):
            gate_width = HV * head_dim if self.per_channel_gate else HV
            if self.per_channel_gate:
                self.g_proj = nn.Sequential(nn.Linear(hidden_size, gate_rank, bias=False),
                                            nn.Linear(gate_rank, gate_width, bias=rule == "gated"))
            else:
                self.g_proj = nn.Linear(hidden_size, gate_width, bias=False)
            if rule == "gated_delta":  # Mamba-2 style discretization: dt in [1e-3, 0.1] at init, A in [1, 16]
                self.A_log = nn.Parameter(torch.empty(HV).uniform_(1, 16).log())
                dt = torch.exp(torch.rand(gate_width) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
                self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        if rule in ("delta", "gated_delta"):
            self.b_proj = nn.Linear(hidden_size, HV, bias=False)
        self.o_norm = RMSNorm(self.v_head_dim, eps=norm_eps)
        self.z_proj = nn.Linear(hidden_size, value_dim, bias=False) if output_gate else None

    def _gate(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.rule not in ("gated", "gated_delta"):
            return None
        B, T, _ = x.shape
        raw = _wide(self.g_proj(x))
        if self.rule == "gated":
            g = F.logsigmoid(raw) / 16  # GLA's gate_logit_normalizer
        else:
            g = -_wide(self.A_log).exp().repeat_interleave(raw.shape[-1] // self.num_v_heads) * F.softplus(
                raw + self.dt_bias)
        return g.view(B, T, self.num_v_heads, -1) if self.per_channel_gate else g

    def forward(self, x: torch.Tensor, cache: LinearAttentionCache | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, LinearAttentionCache]:
        B, T, _ = x.shape
        if cu_seqlens is not None and cache is not None:
            raise ValueError("cache: packed sequences (cu_seqlens) start from empty caches; pass cache=None")
        H, HV, Dk, Dv = self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        conv_tail = None
        if self.conv_size:
            pre = qkv
            qkv, conv_tail = causal_conv(qkv, self.conv_weight, None if cache is None else cache.conv, cu_seqlens)
            if cu_seqlens is not None:  # each sequence's own last K-1 inputs (zeros before its start)
                conv_tail = _packed_tails(pre[0], self.conv_size, cu_seqlens)
        q, k, v = qkv.split([H * Dk, H * Dk, HV * Dv], dim=-1)
        q, k, v = q.reshape(B, T, H, Dk), k.reshape(B, T, H, Dk), v.reshape(B, T, HV, Dv)
        g = self._gate(x)
        beta = _wide(self.b_proj(x)).sigmoid() if self.rule in ("delta", "gated_delta") else None
        kwargs = dict(rule=self.rule, feature_map=self.feature_map, normalize=self.normalize,
                      state_dtype=self.state_dtype)
        if T == 1 and cache is not None:
            o, state = linattn.step(q[:, 0], k[:, 0], v[:, 0], cache.state, g=None if g is None else g[:, 0],
                                    beta=None if beta is None else beta[:, 0], **kwargs)
            o = o[:, None]
        else:
            o, state = linattn.linear_attention(
                q, k, v, g=g, beta=beta, initial_state=None if cache is None else cache.state,
                output_final_state=True, chunk_size=self.chunk_size, form=self.form, cu_seqlens=cu_seqlens, **kwargs)
        o = self.o_norm(o)
        if self.z_proj is not None:
            o = o * F.silu(self.z_proj(x).view(B, T, HV, Dv))
        return self.o_proj(o.reshape(B, T, HV * Dv)), LinearAttentionCache(state, conv_tail)


def _packed_tails(qkv: torch.Tensor, K: int, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[N, K-1, C]: the pre-convolution inputs ``qkv [T, C]`` of each packed sequence's last K-1 tokens, zeros
    before its start."""
    cu = cu_seqlens.to(torch.int64)
    idx = cu[1:, None] - (K - 1) + torch.arange(K - 1, device=cu.device)  # [N, K-1]
    valid = idx >= cu[:-1, None]
    return qkv[idx.clamp_min(0)] * valid[..., None].to(qkv.dtype)


@dataclass
class KVCache:
    """Keys and values seen so far, ``[B, L, H, D]`` each (after rotary embedding)."""

    k: torch.Tensor
    v: torch.Tensor

    @property
    def length(self) -> int:
        return self.k.shape[1]


def rotary(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (half-split form) of ``x [B, T, H, D]`` at ``positions [T]`` or ``[B, T]``."""
    D = x.shape[-1]
    freqs = base ** (-torch.arange(0, D // 2, device=x.device, dtype=torch.float32) * 2 / D)
    angles = positions.to(torch.float32)[..., None] * freqs  # [..., T, D/2]
    while angles.dim() < 3:
        angles = angles.unsqueeze(0)
    cos, sin = angles.cos()[:, :, None].to(x.dtype), angles.sin()[:, :, None].to(x.dtype)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class SoftmaxAttention(nn.Module):
    """Causal softmax attention (PyTorch SDPA) with rotary positions and a KV cache; the same call signature as
    :class:`LinearAttention`. ``cu_seqlens`` becomes a block-diagonal causal mask (positions restart per sequence);
    the cache returned then is ``None``: sequences of different lengths have no common ``[B, L]`` cache."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, *, rope_base: float = 10000.0):
        super().__init__()
        self.num_heads, self.head_dim, self.rope_base = num_heads, head_dim, rope_base
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        past = 0 if cache is None else cache.length
        if cu_seqlens is not None:
            if cache is not None:
                raise ValueError("cache: packed sequences (cu_seqlens) start from empty caches; pass cache=None")
            positions = _sequence_offsets(cu_seqlens, T)
        else:
            positions = torch.arange(past, past + T, device=x.device)
        q = rotary(self.q_proj(x).view(B, T, H, D), positions, self.rope_base)
        k = rotary(self.k_proj(x).view(B, T, H, D), positions, self.rope_base)
        v = self.v_proj(x).view(B, T, H, D)
        if cache is not None:
            k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
        mask = None
        if cu_seqlens is not None:
            seq = torch.searchsorted(cu_seqlens.to(torch.int64)[1:], torch.arange(T, device=x.device), right=True)
            mask = (seq[:, None] == seq[None, :]) & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        elif past and T > 1:
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=mask is None and past == 0 and T > 1,
        )
        return self.o_proj(o.transpose(1, 2).reshape(B, T, H * D)), None if cu_seqlens is not None else KVCache(k, v)
