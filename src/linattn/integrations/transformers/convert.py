"""Weights: linattn's layers built from HF layers (HF's fused projections split into linattn's)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from linattn.nn import LinearAttention


def gated_deltanet_from_qwen3_next(hf_layer: torch.nn.Module, *, chunk_size: int = 64,
                                   backend: str = "auto") -> LinearAttention:
    """A `LinearAttention` (rule ``"gated_delta"``) equal to an HF ``Qwen3NextGatedDeltaNet``, weights
    loaded from its state dict (same dtype and device); ``chunk_size`` and ``backend`` go to the layer."""
    layer = LinearAttention(
        hf_layer.hidden_size, hf_layer.num_k_heads, hf_layer.head_k_dim, rule="gated_delta", feature_map="l2",
        num_v_heads=hf_layer.num_v_heads, v_head_dim=hf_layer.head_v_dim, conv_size=hf_layer.conv_kernel_size,
        per_channel_gate=False, output_gate=True, norm_eps=hf_layer.layer_norm_epsilon, chunk_size=chunk_size,
        backend=backend,
    )
    if hf_layer.activation != "silu":
        raise ValueError(f"hf_layer: its convolution uses {hf_layer.activation!r}; linattn's short convolution is SiLU")
    ref = next(hf_layer.parameters())
    layer.to(device=ref.device, dtype=ref.dtype)
    layer.load_state_dict(convert_qwen3_next_state_dict(hf_layer.state_dict(), num_k_heads=hf_layer.num_k_heads,
                                                        head_k_dim=hf_layer.head_k_dim,
                                                        num_v_heads=hf_layer.num_v_heads,
                                                        head_v_dim=hf_layer.head_v_dim))
    return layer


def convert_qwen3_next_state_dict(sd: Mapping[str, torch.Tensor], *, num_k_heads: int, head_k_dim: int,
                                  num_v_heads: int, head_v_dim: int) -> dict[str, torch.Tensor]:
    """HF ``Qwen3NextGatedDeltaNet`` parameter names and layout -> `LinearAttention`'s.

    HF fuses q, k, v, z into ``in_proj_qkvz`` grouped per key head: rows ``[H, (Dk, Dk, G*Dv, G*Dv)]`` with
    G = HV/H, and b, a into ``in_proj_ba`` as ``[H, (G, G)]``; its depthwise conv runs over [q | k | v] channels.
    """
    H, Dk, HV, Dv = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    G = HV // H
    hidden = sd["in_proj_qkvz.weight"].shape[-1]
    qkvz = sd["in_proj_qkvz.weight"].view(H, 2 * Dk + 2 * G * Dv, hidden)
    q, k, v, z = qkvz.split([Dk, Dk, G * Dv, G * Dv], dim=1)
    ba = sd["in_proj_ba.weight"].view(H, 2 * G, hidden)
    b, a = ba.split([G, G], dim=1)
    return {
        "q_proj.weight": q.reshape(H * Dk, hidden),
        "k_proj.weight": k.reshape(H * Dk, hidden),
        "v_proj.weight": v.reshape(HV * Dv, hidden),
        "z_proj.weight": z.reshape(HV * Dv, hidden),
        "b_proj.weight": b.reshape(HV, hidden),
        "g_proj.weight": a.reshape(HV, hidden),
        "conv_weight": sd["conv1d.weight"][:, 0, :],
        "A_log": sd["A_log"],
        "dt_bias": sd["dt_bias"],
        "o_norm.weight": sd["norm.weight"],
        "o_proj.weight": sd["out_proj.weight"],
    }
