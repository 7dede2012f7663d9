"""The softmax token mixer with the same call signature as `LinearAttention`: causal SDPA with rotary positions
and a KV cache (the keys and values seen so far), for hybrid models and as the baseline the tools compare against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from linattn.nn.checks import (
    check_cache_tensor,
    check_int,
    check_packing,
    check_positive_number,
    check_x,
)
from linattn.nn.conv import causal_conv, sequence_offsets


@dataclass
class KVCache:
    """Keys and values seen so far, ``[B, L, H, D]`` each (after rotary embedding), and ``conv`` ``[B, K-1, 3HD]``,
    the last K-1 inputs of the layer's short convolution (``None`` without one)."""

    k: torch.Tensor
    v: torch.Tensor
    conv: torch.Tensor | None = None

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
    `LinearAttention`. ``cu_seqlens`` (batch 1, as in the API) becomes a block-diagonal causal mask (positions
    restart per sequence); the cache returned then is ``None``: sequences of different lengths have no common
    ``[B, L]`` cache. It makes no linattn call, so it has no ``backend``.

    ``conv_size`` (default 0, none): the short causal depthwise convolution with SiLU of `LinearAttention`
    over q, k, v before the rotary embedding, as zoology's recall models put a short convolution before every
    mixer; it hands each position its neighbours' tokens, which attention otherwise learns through positions."""

    cache_name = "cache"  # as in LinearAttention

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, *, rope_base: float = 10000.0,
                 conv_size: int = 0):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads), ("head_dim", head_dim)):
            check_int(name, value)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even (rotary embedding rotates pairs of channels), got {head_dim}")
        check_positive_number("rope_base", rope_base)
        check_int("conv_size", conv_size, minimum=0)
        self.hidden_size, self.num_heads, self.head_dim, self.rope_base = hidden_size, num_heads, head_dim, rope_base
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.conv_size = conv_size
        if conv_size:  # one depthwise kernel over [q | k | v], as LinearAttention's
            self.conv_weight = nn.Parameter(torch.randn(3 * num_heads * head_dim, conv_size) / math.sqrt(conv_size))

    def check_cache(self, cache: object, B: int, x: torch.Tensor, name: str | None = None) -> None:
        """``cache`` is a `KVCache` of this layer's heads and width for B rows, in x's dtype and device;
        errors call it ``name`` (default ``self.cache_name``, as in `LinearAttention.check_cache`)."""
        name = name or self.cache_name
        if not isinstance(cache, KVCache):
            raise TypeError(f"{name} must be a KVCache (from this layer's forward) or None, got {type(cache).__name__}")
        L = cache.k.shape[1] if isinstance(cache.k, torch.Tensor) and cache.k.dim() == 4 else 0
        for part in ("k", "v"):
            t = getattr(cache, part)
            check_cache_tensor(f"{name}.{part}", t, (B, L, self.num_heads, self.head_dim),
                               "[B, L, num_heads, head_dim]", x)
            if t.dtype != x.dtype:
                raise TypeError(f"{name}.{part} is {t.dtype} but x is {x.dtype}")
        K = self.conv_size
        if (cache.conv is None) != (not K):
            raise ValueError(f"{name}.conv is {'None' if cache.conv is None else 'set'} but this layer has "
                             f"conv_size={K} (a cache from another layer?)")
        if K:
            check_cache_tensor(f"{name}.conv", cache.conv, (B, K - 1, 3 * self.num_heads * self.head_dim),
                               "[B, conv_size - 1, 3 * num_heads * head_dim]", x)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        B, T = check_x(x, self.hidden_size, self.q_proj.weight)
        cu_seqlens = check_packing(cu_seqlens, cache, B, T, x.device)
        if cache is not None:
            self.check_cache(cache, B, x)
        H, D = self.num_heads, self.head_dim
        past = 0 if cache is None else cache.length
        if cu_seqlens is not None:
            positions = sequence_offsets(cu_seqlens, T)
        else:
            positions = torch.arange(past, past + T, device=x.device)
        q, k, v, conv_tail = self.q_proj(x), self.k_proj(x), self.v_proj(x), None
        if self.conv_size:
            qkv, conv_tail = causal_conv(torch.cat([q, k, v], dim=-1), self.conv_weight,
                                         None if cache is None else cache.conv, cu_seqlens)
            q, k, v = qkv.split(H * D, dim=-1)
        q = rotary(q.reshape(B, T, H, D), positions, self.rope_base)
        k = rotary(k.reshape(B, T, H, D), positions, self.rope_base)
        v = v.reshape(B, T, H, D)
        if cache is not None:
            k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
        mask = None
        if cu_seqlens is not None:
            seq = torch.searchsorted(cu_seqlens[1:], torch.arange(T, device=x.device), right=True)
            mask = (seq[:, None] == seq[None, :]) & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        elif past and T > 1:
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
            is_causal=mask is None and past == 0 and T > 1,
        )
        y = self.o_proj(o.transpose(1, 2).reshape(B, T, H * D))
        return y, None if cu_seqlens is not None else KVCache(k, v, conv_tail)
