"""Sequence parallelism over ``torch.distributed``: one sequence split across ranks, states exchanged, never tokens.

Each rank holds one contiguous segment of the sequence. A segment acts on the state that enters it as an affine
map, ``S -> a*S + B`` for accumulate and gated (``a`` the product of its gates, per head or per key channel) and
``S -> M S + B`` for the delta rules (``M`` a ``Dk x Dk`` transition). Every rank computes its map with one call of
the public `linattn.linear_attention`, the maps are exchanged with one all-gather (as LASP-2: the message is
state-sized, independent of the segment length), each rank composes the prefix before it in float64 and corrects
its outputs by the read of that incoming state. No segment is run twice:

- rank 0 starts from the initial state: a plain call gives its outputs, and its final state is its whole map.
- later ranks, accumulate / gated: the segment runs from a zero state with the normalizer as one more value column
  ``[v | 1]`` and no division, so numerator and denominator stay apart; the incoming state adds
  ``(scale * phi(q_t) * exp(G_t)) @ S_in`` to both (``G_t`` the log-gate summed from the segment's start; the
  features are computed here, slab by slab, passed to the call as features and reused for this read).
- later ranks, delta / gated delta: the segment runs once with ``Dk`` extra value columns that start as the
  identity and receive zero values. Each column evolves on its own, so those columns end as ``M`` and their
  outputs are ``scale * M_t^T q_t``, the query seen through the transition so far;
  ``o_t = o_t^zero + (scale M_t^T q_t) @ S_in``. The price is ``Dk`` extra value columns (``linattn sp-bench``
  measures it).

Autograd: the all-gather is a custom Function whose backward reduce-scatters the gradients of the maps (every rank
receives the sum, over all ranks, of the gradient of its own map), so gradients w.r.t. q, k, v, g, beta and the
initial state equal those of one process running the whole sequence. The backward is collective: every rank must
backpropagate (as with DistributedDataParallel).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import linattn
from linattn.call import Call, prepare
from linattn.feature_maps import FeatureMap
from linattn.layout import split_state, state_tensor, with_ones_column
from linattn.ops import DELTA_RULES
from linattn.ops.common import normalized_read
from linattn.state import State

# The descriptor fields every rank must agree on, with the words an error uses for them.
_AGREE = {
    "rule": "rule", "B": "batch size B", "H": "heads H", "D": "query/key width D", "Dv": "value width Dv",
    "r": "feature width r", "dtype": "input dtype", "state_dtype": "state dtype", "device_type": "device type",
    "normalize": "normalize", "feature_map": "feature_map", "scale": "scale", "eps": "eps", "eps_mode": "eps_mode",
    "gate": "gate shape (per head / per channel)", "grad": "autograd (some rank's inputs require grad)",
    "backend": "backend",
}


class RankMismatchError(ValueError):
    """Ranks passed inconsistent configurations (shapes, rule, dtype...) or one rank rejected its input.

    Raised on every rank of the group, with the same message, before any state is exchanged.
    """


class _AllGather(torch.autograd.Function):
    """``[n]`` on each rank -> ``[W, n]`` everywhere; backward reduce-scatters ``[W, n]`` back to ``[n]``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = torch.empty_like(grad[0])
        dist.reduce_scatter(out, list(grad.contiguous().unbind(0)), op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None


class _Attach(torch.autograd.Function):
    """Returns ``x`` unchanged but makes ``anchor`` part of its graph, so that every rank's backward reaches the
    all-gather (rank 0's outputs do not depend on it, yet the other ranks wait for its reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        ctx.anchor_shape, ctx.anchor_dtype = anchor.shape, anchor.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, grad.new_zeros(ctx.anchor_shape, dtype=ctx.anchor_dtype)


def message_bytes(
    rule: str, B: int, H: int, Dk: int, Dv: int, *, normalize: bool | None = None, per_channel: bool = False,
    state_dtype: torch.dtype = torch.float32,
) -> int:
    """Bytes of one rank's map, the all-gathered message (each rank sends it ``W - 1`` times in a ring all-gather).

    accumulate/gated: ``B`` is ``[B, H, Dk, Dv (+1 normalizer)]`` plus the log-gate total ``[B, H]`` or
    ``[B, H, Dk]`` (gated only); delta rules: ``[B | M]`` is ``[B, H, Dk, Dv + Dk]``. Independent of T.
    """
    elem = torch.finfo(state_dtype).bits // 8
    if rule in DELTA_RULES:
        return B * H * Dk * (Dv + Dk) * elem
    norm = (rule in ("accumulate", "gated")) if normalize is None else normalize
    gate = 0 if rule == "accumulate" else (B * H * Dk if per_channel else B * H)
    return (B * H * Dk * (Dv + int(norm)) + gate) * elem


def _group_info(group) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "linattn.distributed.linear_attention needs an initialized torch.distributed process group: call "
            "torch.distributed.init_process_group('gloo') (CPU) or ('nccl') (CUDA) in every process, e.g. in a "
            "script started with `torchrun --nproc-per-node 4 script.py`; see docs/distributed.md"
        )
    return dist.get_rank(group), dist.get_world_size(group)


def _describe(call: Call, q: torch.Tensor, state_dtype) -> dict:
    """What every rank must agree on (from its prepared call), plus this rank's own segment length (free to
    differ)."""
    fmap = call.fmap
    name = None if fmap is None else getattr(fmap, "__qualname__", repr(fmap))

    def plain(x):  # compared with == on every rank: anything else by its repr
        return x if x is None or isinstance(x, (bool, int, float, str)) else repr(x)

    return {
        "rule": call.rule, "B": call.B, "H": call.H, "D": call.D, "Dv": call.Dv, "r": call.r, "T": call.T,
        "dtype": str(q.dtype), "state_dtype": str(state_dtype), "device_type": q.device.type,
        "normalize": call.normalize, "feature_map": name, "scale": plain(call.scale), "eps": plain(call.eps),
        "eps_mode": call.eps_mode, "gate": call.gate, "grad": call.grad, "backend": call.backend, "error": None,
    }


def _agree(desc: dict, rank: int, world: int, group) -> list[dict]:
    """One small collective of every rank's descriptor; raises on every rank if they disagree or one failed."""
    all_desc: list = [None] * world
    dist.all_gather_object(all_desc, desc, group=group)
    problems = [f"rank {r} rejected its input: {d['error']}" for r, d in enumerate(all_desc) if d["error"]]
    if not problems:
        for key, words in _AGREE.items():
            values = [d[key] for d in all_desc]
            if any(x != values[0] for x in values):
                per_rank = ", ".join(f"rank {r}: {x!r}" for r, x in enumerate(values))
                problems.append(f"ranks disagree on {words} ({key}): {per_rank}")
    if problems:
        raise RankMismatchError(f"linattn.distributed (rank {rank} of {world}): " + "; ".join(problems))
    return all_desc


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    rule: str = "accumulate",
    feature_map: str | FeatureMap | None = None,
    normalize: bool | None = None,
    scale: float | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    initial_state: State | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    state_dtype: torch.dtype | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, State | None]:
    """Causal linear attention over one sequence whose tokens are split across the ranks of ``group``.

    Every rank passes its own contiguous segment, in rank order: ``q, k [B, T_r, H, D]``, ``v [B, T_r, H, Dv]``,
    ``g [B, T_r, H]`` or ``[B, T_r, H, r]``, ``beta [B, T_r, H]``; ``T_r >= 1`` may differ between ranks (and be
    shorter than a chunk). Returns this rank's outputs ``o [B, T_r, H, Dv]`` and, with ``output_final_state``, the
    state after the last token of the last rank, on every rank. All other keywords mean what they mean in
    `linattn.linear_attention` (``form`` is always the chunk form; ``cu_seqlens`` is rejected; ``backend`` is
    passed to each rank's local call).

    ``group``: the process group (default: the world). ``initial_state``: the state before rank 0's first token,
    given on rank 0 only (``None`` elsewhere); its gradient arrives on rank 0.

    Collective: every rank of the group must call this with the same rule, batch, heads, widths, dtype and
    options; disagreement (or a rank whose input is rejected) raises `RankMismatchError` on every rank
    before any state is exchanged. Every rank must also run the backward if any does.
    """
    rank, world = _group_info(group)
    # Everything below that can fail runs inside the agreement: every argument is checked (and the local segment
    # computed) before the one collective where each rank reports its descriptor or its error, so that a bad
    # argument on one rank raises on every rank instead of leaving the others waiting in a collective.
    desc: dict = dict.fromkeys(_AGREE) | {"T": None, "error": None}
    error = None
    try:
        if rank > 0 and initial_state is not None:
            raise ValueError(f"initial_state is given on rank {rank}; pass it on rank 0 only (None on ranks > 0)")
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: packed variable-length batches are not supported by linattn.distributed; "
                             "split one sequence per batch row across the ranks")
        call = prepare(q, k, v, rule=rule, form="chunk", feature_map=feature_map, normalize=normalize, scale=scale,
                       eps=eps, eps_mode=eps_mode, g=g, beta=beta, initial_state=initial_state,
                       output_final_state=output_final_state, chunk_size=chunk_size, state_dtype=state_dtype,
                       cu_seqlens=None, backend=backend)
        if call.HV != call.H:
            raise ValueError(f"v has {call.HV} heads but q has {call.H}: grouped value heads are not supported by "
                             "linattn.distributed")
        desc = _describe(call, q, state_dtype)
        normalize, dtype = call.normalize, call.dtype
        local = dict(rule=rule, feature_map=call.fmap, scale=scale, eps=eps, eps_mode=eps_mode, g=g, beta=beta,
                     output_final_state=True, chunk_size=chunk_size, state_dtype=dtype, backend=backend)
        if rank == 0:
            o, S_loc = _first_segment(q, k, v, initial_state, normalize, rule, local)
        else:  # in the accumulation dtype: these outputs are corrected before they are rounded
            o, S_loc, qf = _later_segment(q.to(dtype), k.to(dtype), v.to(dtype), normalize, rule, local)
    except Exception as exc:  # noqa: BLE001 - any local failure must reach the other ranks, not strand them
        error, desc["error"] = exc, f"{type(exc).__name__}: {exc}"
    try:
        _agree(desc, rank, world, group)
    except RankMismatchError:
        if error is not None:
            raise error from None  # this rank's own error, as a single-process call would raise it
        raise

    # Exchange: one all-gather of every rank's map; compose the prefix (and the whole) in float64.
    Dv = v.shape[-1]
    gate_total = None
    if rule == "gated":  # log of the product of the segment's gates
        gate_total = g.to(torch.float64).sum(dim=1).to(dtype)  # [B, H] or [B, H, r]
    msg = S_loc.reshape(-1) if gate_total is None else torch.cat([gate_total.reshape(-1), S_loc.reshape(-1)])
    maps = _AllGather.apply(msg, group)  # [W, n]
    S_in, S_out = _compose(maps, rank, world, rule, gate_total, S_loc.shape, Dv, output_final_state)

    if rank == 0:
        o = _Attach.apply(o, maps)
    else:  # the read of the incoming state, added to numerator and denominator alike, then the one division
        o = _add_incoming(o, S_in.to(dtype), qf, g, rule, scale, Dv)
        if normalize:
            o = normalized_read(o, eps, eps_mode)  # the library's one eps convention
    final = None
    if output_final_state:
        final = split_state(S_out.to(dtype), normalize, rule, feature_map)  # records rule and feature map
    return o.to(v.dtype), final


def _first_segment(q, k, v, initial_state, normalize, rule, call):
    """Rank 0 starts from the initial state: a plain call gives its outputs, and its final state is its whole
    contribution (sent with the normalizer as a last column, and for the delta rules padded to ``[B | M]``)."""
    o, S = linattn.linear_attention(q, k, v, normalize=normalize, initial_state=initial_state, **call)
    S_loc = state_tensor(S, normalize, S.dtype)  # [S | z] when normalized
    if rule in DELTA_RULES:  # rank 0's transition is never used: zeros keep every message the same size
        S_loc = torch.cat([S_loc, S_loc.new_zeros(*S_loc.shape[:-1], S_loc.shape[-2])], dim=-1)
    return o, S_loc


def _later_segment(q, k, v, normalize, rule, call):
    """A later rank starts from zero: zero-start outputs (numerator and denominator apart) and its map.

    delta rules: ``Dk`` extra value columns with zero values and the identity as their start carry the transition
    ``M`` (final state ``[B | M]``) and read ``scale * M_t^T q_t`` as their outputs.
    """
    B, T, H, _ = q.shape
    if rule in DELTA_RULES:
        Dk = _feature_width(k, call["feature_map"])
        eye = torch.eye(Dk, dtype=v.dtype, device=v.device).expand(B, H, Dk, Dk)
        start = torch.cat([eye.new_zeros(B, H, Dk, v.shape[-1]), eye], dim=-1)
        v = torch.cat([v, v.new_zeros(B, T, H, Dk)], dim=-1)
        o, S = linattn.linear_attention(q, k, v, normalize=False, initial_state=State(start), **call)
        return o, S.S, None
    # Features computed here (slab by slab, in cache) and passed as features: the correction reads phi(q) again.
    fmap = call["feature_map"]
    if fmap is not None:
        q, k = (torch.cat([fmap(x) for x in t.split(_SLAB, dim=1)], dim=1) for t in (q, k))
    if normalize:
        v = with_ones_column(v)
    o, S = linattn.linear_attention(q, k, v, normalize=False, **(call | {"feature_map": None}))
    return o, S.S, q


_SLAB = 2048  # tokens per slab of the elementwise work done here


def _feature_width(k, fmap) -> int:
    return k.shape[-1] if fmap is None else fmap(k[:1, :1]).shape[-1]


def _add_incoming(o, S_in, qf, g, rule, scale, Dv, slab: int = _SLAB):
    """``o + q_in @ S_in``: the incoming state as read by each query.

    delta rules: ``q_in = scale * M_t^T q_t``, the extra output columns. accumulate / gated:
    ``q_in = scale * phi(q_t) * exp(G_t)`` (``qf`` holds phi(q)), ``G_t`` the log-gate summed from the segment's
    start (float64); built slab by slab along T so that the temporaries stay in cache.
    """
    if rule in DELTA_RULES:
        return o[..., :Dv] + torch.einsum("bthk,bhkv->bthv", o[..., Dv:], S_in)
    scale = S_in.shape[-2] ** -0.5 if scale is None else scale
    S_in = S_in * scale  # the scale on the small state rather than on every query
    inplace = not (torch.is_grad_enabled() and (o.requires_grad or S_in.requires_grad))
    carry = None
    pieces = []
    gs = [None] * len(range(0, qf.shape[1], slab)) if g is None else g.split(slab, dim=1)
    for q_in, os_, gs_ in zip(qf.split(slab, dim=1), o.split(slab, dim=1), gs, strict=True):
        if gs_ is not None:  # per head [B, t, H] or per channel [B, t, H, r]
            G = gs_.to(torch.float64).cumsum(dim=1)
            if carry is not None:
                G = G + carry
            carry = G[:, -1:]
            decay = G.exp().to(q_in.dtype)
            q_in = q_in * (decay if gs_.dim() == 4 else decay.unsqueeze(-1))
        read = torch.einsum("bthk,bhkv->bthv", q_in, S_in)
        if inplace:  # without autograd the zero-start outputs are ours to update
            os_.add_(read)
        else:
            pieces.append(os_ + read)
    if inplace:
        return o
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def _compose(maps, rank, world, rule, gate_total, shape, Dv, want_final):
    """The state entering this rank (None on rank 0, whose map already starts from the initial state) and, if
    asked, the state after the last rank. Rank 0's map is its final state itself; each later map is applied in turn.
    """
    maps = maps.to(torch.float64)
    n_gate = 0 if gate_total is None else gate_total.numel()
    delta = rule in DELTA_RULES

    def state_map(r):
        S_r = maps[r, n_gate:].reshape(shape)  # [B | M] for the delta rules
        return (S_r[..., :Dv], S_r[..., Dv:]) if delta else (S_r, None)

    S = state_map(0)[0]
    S_in = None
    for r in range(1, world if want_final else rank + 1):
        if r == rank:
            S_in = S
            if not want_final:
                break
        B_r, M_r = state_map(r)
        if delta:
            S = torch.matmul(M_r, S) + B_r
        elif gate_total is None:
            S = S + B_r
        else:
            a = maps[r, :n_gate].reshape(gate_total.shape).exp()
            S = (a.unsqueeze(-1) if gate_total.dim() == 3 else a[..., None, None]) * S + B_r
    return S_in, (S if want_final else None)
