"""Packed sequences (``cu_seqlens``) for :func:`linattn.linear_attention`, as in flash-linear-attention/FlashAttention.

``q, k [1, T, H, D]`` hold N sequences back to back; sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``.

Layout chosen: **segments of rows of a padded batch**. Segment j holds tokens ``j*seg ... (j+1)*seg - 1`` of every
sequence still running, one row each, padded to the longest; one ordinary call runs all its rows at once, starting
from the states the previous segment left (the N initial states for the first), and one gather per input and
per output moves tokens between packed and padded places: a Python loop over segments only, never over sequences
or chunks. ``seg`` is T_max when that wastes little (one call), else shorter (:func:`plan_segment`: within 1.5x
the slots of chunk-aligned packing). It is exact in every rule and form, with no kernel change: padding sits after
each sequence's last token with v = 0 (its ones column too), beta = 0 and log-gate 0, which leave the state
unchanged whatever k is (S <- 1 * S + k 0^T, and the delta write beta (v - S^T k) = 0); q and k there repeat a
real token of the row, so any feature map stays finite. A zero-length sequence is never in a row and passes its
initial state through. Nothing crosses a boundary because sequences never share a row.

Cost, measured (``python scripts/packing_cost.py``: gated delta, H=8, D=64, 1 thread of a shared 2-core EPYC,
8 sequences): one packed call took 1.3x to 1.6x one unpacked call over the same tokens and 1.2x to 1.6x a Python
loop of separate calls: similar lengths (900-1100) run as one call of 8 rows; one 4096-token sequence among seven
of 128 as 16 calls of 256 tokens (padding all rows to 4096 had cost 6x more). What is left over the unpacked call
is the padding and the smaller, wider batches. Chunk-aligned packing in one row (each sequence padded to a
multiple of the chunk, cost at most T + N*C in one call) needs the chunk carry to restart at each sequence start,
a change in every kernel; that is left for a fused backend.

On the CPU with a float32 state, the compiled prefill (:mod:`linattn.kernels.cpu_numba`) takes the packed tokens
as they lie instead: one state per sequence, no padding, no segments (``backend="auto"`` or ``"cpu"``; see
docs/perf.md). What follows describes the torch path.

The normalizer z is handled here rather than by the inner call: the inner call runs unnormalized on [v | 1] (the
ones column is 0 in the padding), and the division happens only at real tokens after the gather, so padding
never divides 0 by 0 (which with ``eps=0`` would put NaN into the gradients through the discarded outputs).
"""

from __future__ import annotations

import torch

from linattn import api, kernels
from linattn.feature_maps import resolve_feature_map
from linattn.ops.common import normalized_read
from linattn.state import State


def check_cu_seqlens(cu_seqlens: object, T: int, B: int, device) -> torch.Tensor:
    """``cu_seqlens`` as an int64 tensor ``[N + 1]`` on ``device``, after checking it describes T tokens."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor of ints, got {type(cu_seqlens).__name__}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] with N >= 1, got shape {tuple(cu_seqlens.shape)}")
    if B != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size 1 (all sequences in one row), got B = {B}")
    if cu_seqlens.is_meta:
        raise ValueError("cu_seqlens is on the meta device: its values (the sequence boundaries) are needed")
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {int(cu[0])} ... {int(cu[-1])}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be nondecreasing, got {cu.tolist()}")
    return cu


def plan_segment(lengths: torch.Tensor, chunk_size: int, slack: float = 1.5) -> int:
    """Segment length: the longest of T_max, then C * 2^j going down, whose padded slots stay within ``slack``
    times those of chunk-aligned packing (sum of ceil(L_i / C) * C). Longer segments mean fewer calls (each call
    costs a fixed overhead and runs a smaller batch); C itself always qualifies. ``lengths`` on the CPU, int64."""
    T_max = int(lengths.max())
    C = max(1, min(chunk_size, T_max))
    target = int(((lengths + C - 1) // C * C).sum())
    seg = T_max
    while True:
        starts = torch.arange(-(-T_max // seg)) * seg  # segment j covers offsets starts[j] ... starts[j] + seg - 1
        rem = (lengths[None, :] - starts[:, None]).clamp(0, seg)  # [segments, N] tokens of each sequence in each
        slots = int((rem.amax(dim=1) * (rem > 0).sum(dim=1)).sum())  # rows x width, summed over the calls
        if slots <= slack * target or seg <= C:
            return seg
        seg = max(C, 1 << ((seg - 1).bit_length() - 1))  # the next lower power of two


class _Segment:
    """Tokens ``j * seg ... (j + 1) * seg - 1`` of every sequence still running: one row each, padded to the
    longest. ``src`` are their packed positions, ``dst`` their places in the flattened ``[rows, width]``."""

    def __init__(self, cu: torch.Tensor, lengths: torch.Tensor, j: int, seg: int):
        self.active = torch.nonzero(lengths > j * seg).flatten()
        rem = (lengths[self.active] - j * seg).clamp(max=seg)
        self.rows, self.width = self.active.numel(), int(rem.max())
        row = torch.repeat_interleave(torch.arange(self.rows, device=cu.device), rem)
        starts = torch.cumsum(rem, 0) - rem
        offset = torch.arange(int(rem.sum()), device=cu.device) - starts[row]
        self.src = cu[:-1][self.active][row] + j * seg + offset
        self.dst = row * self.width + offset
        # For each padded slot, the packed token it holds; a padding slot reads its own row's first token here,
        # so even a NaN there stays inside the sequence that already has it (see pad).
        first = cu[:-1][self.active] + j * seg
        self.gather = first.repeat_interleave(self.width)
        self.gather[self.dst] = self.src
        mask = torch.ones(self.rows * self.width, dtype=torch.bool, device=cu.device)
        mask[self.dst] = False
        self.padding = torch.nonzero(mask).flatten()

    def pad(self, x: torch.Tensor | None, zero: bool) -> torch.Tensor | None:
        """``[1, T, ...]`` -> ``[rows, width, ...]`` in one gather; the padding holds a real token's values (q, k:
        finite features for any map), then zeros if ``zero`` (v, g, beta; a fresh tensor, zeroed in place)."""
        if x is None:
            return None
        y = x[0, self.gather]
        if zero and self.padding.numel():
            y.index_fill_(0, self.padding, 0)
        return y.view(self.rows, self.width, *x.shape[2:])

    def unpad(self, o: torch.Tensor) -> torch.Tensor:
        """``[rows, width, ...]`` -> the real tokens, in ``src`` order."""
        return o.reshape(self.rows * self.width, *o.shape[2:])[self.dst]


def packed_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    rule: str,
    form: str,
    feature_map,
    normalize: bool | None,
    scale: float | None,
    eps: float,
    eps_mode: str,
    g: torch.Tensor | None,
    beta: torch.Tensor | None,
    initial_state: State | None,
    output_final_state: bool,
    chunk_size: int,
    state_dtype: torch.dtype | None,
    backend: str = "auto",
) -> tuple[torch.Tensor, State | None]:
    """:func:`linattn.linear_attention` with ``cu_seqlens`` (same arguments; see the module docstring)."""
    # The checks of the unpacked call, in the same order, before any work.
    mod = api._rule_module(rule)
    api._check_form(mod, rule, form)
    kernels.check_backend(backend)
    api._check_qkv(q, k, v, 4)
    api._check_scalars(eps, eps_mode, scale, chunk_size)
    api._check_flag("output_final_state", output_final_state)
    B, T = q.shape[:2]
    HV, Dv = v.shape[-2:]
    cu = check_cu_seqlens(cu_seqlens, T, B, q.device)
    normalize = api._resolve_normalize(rule, normalize)
    dtype = api._compute_dtype(q.dtype, state_dtype)
    fmap = resolve_feature_map(feature_map)
    probe = api._features(q[:, :1].to(dtype), k[:, :1].to(dtype), fmap, scale)[0]
    Dk = probe.shape[-1]  # the feature width
    api._check_gate_and_beta(rule, g, beta, (B, T, HV), Dk, q.device)
    lengths = cu[1:] - cu[:-1]
    N = lengths.numel()
    S0 = None
    if initial_state is not None:
        S_in = getattr(initial_state, "S", None)
        if isinstance(initial_state, State) and isinstance(S_in, torch.Tensor) and S_in.dim() == 4 and (
                S_in.shape[0] != N):
            raise ValueError(f"initial_state holds {S_in.shape[0]} states but cu_seqlens describes N = {N} sequences; "
                             "a packed call takes one initial state per sequence, [N, H, Dk, Dv]")
        api._check_state(initial_state, N, HV, Dk, Dv, normalize, q.device, rule=rule, feature_map=feature_map,
                         d_in=q.shape[-1])
        S0 = State(api._augmented(initial_state, dtype) if normalize else initial_state.S.to(dtype))
    vv = v.to(dtype)
    if normalize:
        vv = api._with_ones_column(vv)
    S = torch.zeros(N, HV, Dk, vv.shape[-1], dtype=dtype, device=q.device) if S0 is None else S0.S
    # A compiled backend runs the packed tokens directly, one state per sequence (no padding, no segments).
    kernels.check_backend(backend)
    tracked = (q, k, v, g, beta) + (() if initial_state is None else (initial_state.S, initial_state.z))
    # A callable feature map may carry parameters: its output on one token tells whether autograd is needed.
    grad = torch.is_grad_enabled() and (probe.requires_grad or any(t is not None and t.requires_grad for t in tracked))
    fast = kernels.linear_attention(backend, rule=rule, form=form, q=q, k=k, v=v, g=g, beta=beta, state=S,
                                    fmap=fmap, scale=scale, normalize=normalize, eps=eps, eps_mode=eps_mode,
                                    grad=grad, chunk_size=chunk_size, cu_seqlens=cu)
    if fast is not None:
        return fast[0], (api._split(fast[1], normalize, rule, feature_map) if output_final_state else None)
    seg = plan_segment(lengths.cpu(), chunk_size)
    # q and k in the state dtype, as v: the unpacked call maps features in that dtype too, and the inner call
    # takes one dtype for all three.
    qq, kk = q.to(dtype), k.to(dtype)
    sources, outputs = [], []
    for j in range(-(-int(lengths.max()) // seg)):  # segments, each one call over all running sequences
        part = _Segment(cu, lengths, j, seg)
        o, S_part = api.linear_attention(
            part.pad(qq, False), part.pad(kk, False), part.pad(vv, True), rule=rule, form=form, feature_map=fmap,
            normalize=False, scale=scale, g=part.pad(g, True), beta=part.pad(beta, True),
            initial_state=State(S[part.active]),
            output_final_state=True, chunk_size=chunk_size, state_dtype=dtype, backend=backend,
        )
        S = S.index_copy(0, part.active, S_part.S.to(S.dtype))  # out of place: autograd keeps each segment's
        sources.append(part.src)
        outputs.append(part.unpad(o))
    o = torch.cat(outputs)
    o = o.new_empty(o.shape).index_copy_(0, torch.cat(sources), o).unsqueeze(0)  # back to packed order
    if normalize:
        o = normalized_read(o, eps, eps_mode)
    final = api._split(S, normalize, rule, feature_map) if output_final_state else None  # recorded as this call's
    return o.to(v.dtype).contiguous(), final
