"""PyTorch modules built on the public API: token mixers with decode caches and a small causal LM.

    layer = linattn.nn.LinearAttention(hidden_size=64, num_heads=2, head_dim=32, rule="gated_delta")
    y, cache = layer(x)                    # x [B, T, 64]; the cache continues the sequence
    y_next, cache = layer(x_next, cache)   # decode one token (or prefill more)
"""

from linattn.nn.conv import causal_conv
from linattn.nn.linear_attention import LinearAttention, LinearAttentionCache, RMSNorm
from linattn.nn.lm import MIXERS, CausalLM, hybrid_pattern
from linattn.nn.softmax_attention import KVCache, SoftmaxAttention


def GatedDeltaNet(hidden_size: int, num_heads: int, head_dim: int, **kwargs) -> LinearAttention:  # noqa: N802
    """Gated DeltaNet (Yang et al. 2025) as Qwen3-Next builds it: `LinearAttention` with rule
    ``"gated_delta"``, per-head gates ``-exp(A) softplus(a(x) + dt_bias)``, sigmoid beta, L2-normalized q and k,
    a short convolution of 4 and the gated RMSNorm output."""
    return LinearAttention(hidden_size, num_heads, head_dim, rule="gated_delta", per_channel_gate=False, **kwargs)


__all__ = [
    "MIXERS", "CausalLM", "GatedDeltaNet", "KVCache", "LinearAttention", "LinearAttentionCache", "RMSNorm",
    "SoftmaxAttention", "causal_conv", "hybrid_pattern",
]
