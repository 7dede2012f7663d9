"""HF transformers' recurrent-state models on linattn: CPU, no Triton, no CUDA packages, the same cache.

``patch()`` is the one call (also a context manager). In every installed modeling file of the families below it
replaces the module-level functions the layers call, which transformers points at flash-linear-attention,
mamba-ssm or causal-conv1d when installed (failing on a CPU-only machine) and at its own slow torch code otherwise:

- Gated DeltaNet (qwen3_next, qwen3_5, qwen3_5_moe, olmo_hybrid): ``torch_chunk_gated_delta_rule``,
  ``torch_recurrent_gated_delta_rule`` -> rule ``"gated_delta"``;
- Kimi Delta Attention (kimi_linear, bailing_hybrid): ``chunk_kimi_delta_attention``,
  ``recurrent_kimi_delta_attention`` -> ``"gated_delta"`` with a gate per key channel;
- Mamba-2 / SSD (mamba2, bamba, granitemoehybrid, falcon_h1, nemotron_h, zamba2): ``mamba2_chunk_scan``,
  ``mamba2_selective_state_update``, ``mamba2_split_conv1d_scan_combined`` -> ``"gated"`` with g = dt A, k = B,
  q = C, v = dt x, no normalizer, scale 1, plus the D skip;
- the short convolution (all of the above, and lfm2): ``causal_conv1d_fn``, ``causal_conv1d_update`` ->
  [`linattn.nn.causal_conv`][linattn.nn.causal_conv] and its compiled one-token update.

Prefill runs the chunk form (the compiled kernel on CPU), decode a `linattn.Decoder` kept per state tensor of
HF's cache, which it updates in place; packed sequences (``cu_seq_lens_q``, ``cu_seqlens``, ``seq_idx``) restart
the state and the convolution at every boundary. ``patch(models=...)`` narrows it; ``backend=`` forces a linattn
backend (default ``"auto"``: CPU tensors on linattn, CUDA tensors to what HF chose). Patches nest: each one is in
force until undone, the latest on top, and undoing them in any order restores HF's functions once the last is gone.
``patch_qwen3_next()`` is `patch` for the Gated DeltaNet models (Qwen3-Next by default).

``gated_deltanet_from_qwen3_next(hf_layer)`` builds a `linattn.nn.LinearAttention` with the state dict of an
HF ``Qwen3NextGatedDeltaNet``. transformers itself is imported only when a patch is made (it is an optional extra).
"""

from linattn.integrations.transformers.conv import causal_conv1d_fn, causal_conv1d_update
from linattn.integrations.transformers.convert import convert_qwen3_next_state_dict, gated_deltanet_from_qwen3_next
from linattn.integrations.transformers.gated_delta import chunk_gated_delta_rule, recurrent_gated_delta_rule
from linattn.integrations.transformers.kda import chunk_kimi_delta_attention, recurrent_kimi_delta_attention
from linattn.integrations.transformers.mamba2 import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
    mamba2_split_conv1d_scan_combined,
)
from linattn.integrations.transformers.patching import (
    FAMILIES,
    FAMILY_OF,
    GATED_DELTA_MODELS,
    MODELS,
    Patch,
    hf_torch_fallback,
    modeling,
    original,
    patch,
    patch_qwen3_next,
    use_hf_torch_fallback,
)

__all__ = [
    "FAMILIES", "FAMILY_OF", "GATED_DELTA_MODELS", "MODELS", "Patch", "causal_conv1d_fn", "causal_conv1d_update",
    "chunk_gated_delta_rule", "chunk_kimi_delta_attention", "convert_qwen3_next_state_dict",
    "gated_deltanet_from_qwen3_next", "hf_torch_fallback", "mamba2_chunk_scan", "mamba2_selective_state_update",
    "mamba2_split_conv1d_scan_combined", "modeling", "original", "patch", "patch_qwen3_next",
    "recurrent_gated_delta_rule", "recurrent_kimi_delta_attention", "use_hf_torch_fallback",
]
