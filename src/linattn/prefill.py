"""A prepared whole-sequence call (`linattn.call.Call`) computed: `compute` takes a compiled backend where it takes
the call (`compiled`, through `linattn.backends`), else the rule's torch form over slabs (`torch_forms`).

Inputs are the public layout ``q, k [B, T, H, D]``, ``v [B, T, HV, Dv']``, ``g``, ``beta``, already checked;
``S [B, HV, r, Dv']`` is the starting state in the accumulation dtype (``[S | z]`` when normalized: then ``Dv'``
is ``Dv + 1`` here and v gets its ones column here). Nothing is validated again.
"""

from __future__ import annotations

import dataclasses

import torch

from linattn import backends, buffers
from linattn.call import Call
from linattn.layout import features, group_heads, with_ones_column
from linattn.ops.common import normalized_read


def slab_tokens(heads: int, width: int, chunk_size: int, elem_bytes: int, budget: int = 4 << 20) -> int:
    """Tokens per slab of the chunk form: whole chunks whose ``width`` (Dk + Dv) columns over all heads take about
    ``budget`` bytes.

    4 MiB was the fastest of 1-16 MiB measured on a 2-core Xeon with 2 MiB of L2 per core (H=8, D=64, T=8192).
    """
    chunks = max(1, budget // (heads * width * elem_bytes * chunk_size))
    return chunks * chunk_size


def compute(call: Call, q, k, v, g, beta, S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``o [B, T, H, Dv]`` in v's dtype and the final state ``[B, H, Dk, Dv(+1)]`` (augmented when normalized)."""
    fast = compiled(call, q, k, v, g, beta, S)
    return fast if fast is not None else torch_forms(call, q, k, v, g, beta, S)


def compiled(call: Call, q, k, v, g, beta, S: torch.Tensor, cu_seqlens: torch.Tensor | None = None):
    """The call on the backend ``call.backend`` names, or None when the torch forms should run."""
    return backends.linear_attention(call.backend, rule=call.rule, form=call.form, q=q, k=k, v=v, g=g, beta=beta,
                                     state=S, fmap=call.fmap, scale=call.scale, normalize=call.normalize,
                                     eps=call.eps, eps_mode=call.eps_mode, grad=call.grad,
                                     chunk_size=call.chunk_size, cu_seqlens=cu_seqlens)


def segment_call(call: Call, rows: int, width: int) -> Call:
    """The description of one padded segment of a packed call (`linattn.packing`): ``rows`` sequences of
    ``width`` tokens, unnormalized (the packed caller divides once at the real tokens)."""
    return dataclasses.replace(call, B=rows, T=width, normalize=False, Dv=call.Dv + call.normalize,
                               cu_seqlens=None, output_final_state=True)


def torch_forms(call: Call, q, k, v, g, beta, S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule's torch form. The chunk form runs over slabs of whole chunks, carrying the state: the same
    arithmetic, but each slab's temporaries stay in cache and peak memory stays bounded however long the
    sequence. Other forms take it whole. Without autograd, each slab writes its share of the output in place."""
    B, T, H, Dv, dtype, normalize = call.B, call.T, call.HV, call.Dv, call.dtype, call.normalize
    form = call.ops.FORMS[call.form]
    slab = slab_tokens(B * H, call.r + Dv, call.chunk_size, torch.finfo(dtype).bits // 8) if (
        call.form == "chunk") else T
    if call.grad:
        out = None
    elif v.is_cpu:
        out = buffers.empty((B, T, H, Dv), v.dtype)
    else:
        out = torch.empty(B, T, H, Dv, dtype=v.dtype, device=v.device)
    pieces = []

    # torch.split, not slicing: autograd then joins the slabs' gradients in one concatenation, where each slice
    # would get a zero-filled gradient of the whole sequence (quadratic in the number of slabs).
    def slabs(x):
        return [None] * len(range(0, T, slab)) if x is None else x.split(slab, dim=1)

    t0 = 0
    for qs, ks, vs, gs, bs in zip(slabs(q), slabs(k), slabs(v), slabs(g), slabs(beta), strict=True):
        part = slice(t0, t0 + qs.shape[1])
        t0 = part.stop
        qf, kf, scale_ = features(qs.to(dtype), ks.to(dtype), call.fmap, call.scale)
        qf, kf = group_heads(qf, H), group_heads(kf, H)
        if dtype == torch.float16:  # narrow range: scale before the products rather than after them
            qf, scale_ = qf * scale_, 1.0

        # Internal layout [B, H, T, D]: each (batch, head) pair is one sequence for the batched matmuls.
        def heads_first(x):
            return None if x is None else x.transpose(1, 2).to(dtype)

        vh = with_ones_column(heads_first(vs)) if normalize else heads_first(vs)
        # The kernels apply the scale themselves (the chunk form folds it into its matmuls at no cost).
        o, S = form(
            qf.transpose(1, 2), kf.transpose(1, 2), vh, g=heads_first(gs), beta=heads_first(bs),
            initial_state=S, chunk_size=call.chunk_size, scale=scale_,
        )
        o = o.transpose(1, 2)
        if out is not None and normalize:
            normalized_read(o, call.eps, call.eps_mode, out=out[:, part])
        elif out is not None:
            out[:, part].copy_(o)
        else:
            pieces.append(normalized_read(o, call.eps, call.eps_mode) if normalize else o)
    if out is None:
        out = (torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0].contiguous()).to(v.dtype)
    # (The chunk form carries a half-precision state in float32 between slabs; it is stored as asked at the end.)
    return out, S.to(dtype)
