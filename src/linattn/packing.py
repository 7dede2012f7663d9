"""Packed sequences (``cu_seqlens``) for `linattn.linear_attention`, as in flash-linear-attention/FlashAttention.

``q, k [1, T, H, D]`` hold N sequences back to back; sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``.

Layout chosen: **segments of rows of a padded batch**. Segment j holds tokens ``j*seg ... (j+1)*seg - 1`` of every
sequence still running, one row each, padded to the longest; one ordinary call runs all its rows at once, starting
from the states the previous segment left (the N initial states for the first), and one gather per input and
per output moves tokens between packed and padded places: a Python loop over segments only, never over sequences
or chunks. ``seg`` is T_max when that wastes little (one call), else shorter (`plan_segment`: within 1.5x
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

On the CPU with a float32 state, the compiled prefill (`linattn.kernels.cpu_prefill`) takes the packed tokens
as they lie instead: one state per sequence, no padding, no segments (``backend="auto"`` or ``"cpu"``; see
docs/perf.md). What follows describes the torch path.

The normalizer z is handled here rather than by the inner call: the inner call runs unnormalized on [v | 1] (the
ones column is 0 in the padding), and the division happens only at real tokens after the gather, so padding
never divides 0 by 0 (which with ``eps=0`` would put NaN into the gradients through the discarded outputs).
"""

from __future__ import annotations

import torch

from linattn.call import Call
from linattn.layout import split_state, state_tensor, with_ones_column, zero_state
from linattn.ops.common import normalized_read
from linattn.prefill import compiled, compute, segment_call
from linattn.state import State


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

    def __init__(self, cu: torch.Tensor, lengths: torch.Tensor, j: int, seg: int, device: torch.device):
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
        if cu.device != device:  # meta tensors: the boundaries were read on the CPU, the indices go to meta
            for name in ("active", "src", "dst", "gather", "padding"):
                setattr(self, name, getattr(self, name).to(device))

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


def compute_packed(call: Call, q, k, v, g, beta, initial_state: State | None) -> tuple[torch.Tensor, State | None]:
    """A prepared packed call (``call.cu_seqlens`` set; see the module docstring): outputs ``[1, T, H, Dv]`` and,
    if asked, the N final states. The segments run as prepared calls of their own, never checked again."""
    cu, dtype, normalize = call.cu_seqlens, call.dtype, call.normalize
    lengths = cu[1:] - cu[:-1]
    N = lengths.numel()
    vv = v.to(dtype)
    if normalize:
        vv = with_ones_column(vv)
    if initial_state is None:
        S = zero_state(N, call.HV, call.r, call.Dv, normalize, dtype, q.device)
    else:
        S = state_tensor(initial_state, normalize, dtype)
    # A compiled backend runs the packed tokens directly, one state per sequence (no padding, no segments).
    fast = compiled(call, q, k, v, g, beta, S, cu_seqlens=cu)
    if fast is not None:
        return fast[0], (split_state(fast[1], normalize, call.rule, call.feature_map) if call.output_final_state
                         else None)
    seg = plan_segment(lengths.cpu(), call.chunk_size)
    # q and k in the state dtype, as v: the unpacked call maps features in that dtype too.
    qq, kk = q.to(dtype), k.to(dtype)
    sources, outputs = [], []
    for j in range(-(-int(lengths.max()) // seg)):  # segments, each one call over all running sequences
        part = _Segment(cu, lengths, j, seg, q.device)
        o, S_part = compute(segment_call(call, part.rows, part.width), part.pad(qq, False), part.pad(kk, False),
                        part.pad(vv, True), part.pad(g, True), part.pad(beta, True), S[part.active])
        S = S.index_copy(0, part.active, S_part.to(S.dtype))  # out of place: autograd keeps each segment's
        sources.append(part.src)
        outputs.append(part.unpad(o))
    o = torch.cat(outputs)
    o = o.new_empty(o.shape).index_copy_(0, torch.cat(sources), o).unsqueeze(0)  # back to packed order
    if normalize:
        o = normalized_read(o, call.eps, call.eps_mode)
    final = split_state(S, normalize, call.rule, call.feature_map) if call.output_final_state else None
    return o.to(v.dtype).contiguous(), final
