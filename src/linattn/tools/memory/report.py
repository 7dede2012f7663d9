"""A `LayerPlan` priced at a list of lengths: exact bytes per head, per layer
and for the whole model, and the crossover lengths."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from linattn.tools.memory.formulas import (
    MAX_SEQ_LEN,
    LayerPlan,
    canonical_dtype,
    check_int,
    conv_state_bytes,
    crossover_length,
    dtype_bytes,
    kv_cache_bytes,
    state_bytes,
)


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
    B = check_int("batch", batch)
    kv_dtype = canonical_dtype(kv_dtype or plan.model_dtype, name="kv_dtype")
    conv_dtype = canonical_dtype(conv_dtype or kv_dtype, name="conv_dtype")
    state_dtype = canonical_dtype(state_dtype, name="state_dtype")
    sb, kb, cb = dtype_bytes(state_dtype), dtype_bytes(kv_dtype), dtype_bytes(conv_dtype)
    lin, att = plan.linear, plan.attention
    lens = [check_int("seq_len", T, minimum=0, maximum=MAX_SEQ_LEN) for T in seq_lens]
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
