"""Packed sequences (``cu_seqlens``) for :func:`linattn.linear_attention`, as in flash-linear-attention/FlashAttention.

``q, k [1, T, H, D]`` hold N sequences back to back; sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``.

Layout chosen: **rows of a padded batch**. The features of sequence i go to row i of a zero-filled
``[N, T_max, ...]`` batch (one ``index_copy`` per input, no Python loop over sequences or chunks), one ordinary call
runs all rows at once with the N initial states as its batch of states, and one gather takes the outputs back to
their packed positions. It is exact in every rule and form, with no kernel change: the padding sits after each
sequence's last token and has k = v = 0 (after the feature map), beta = 0 and log-gate 0, which leave the state
unchanged (S <- 1 * S + 0), so row i's final state is sequence i's; a zero-length sequence is a row of padding and
passes its initial state through. Nothing crosses a boundary because sequences never share a row.

Cost: the rows hold ``N * T_max`` token slots for T real tokens. With similar lengths that is about T (the
chunk form pays at most one partial chunk per sequence anyway); with one long sequence among many short ones it
approaches ``N * T``. The alternative, chunk-aligned packing in one row (each sequence padded to a multiple of the
chunk) costs at most ``T + N * C`` but needs the chunk carry to restart at each sequence start, a change in every
kernel; that is left for a fused backend. Sort or bucket sequences by length upstream when lengths vary widely.

The normalizer z is handled here rather than by the inner call: the inner call runs unnormalized on [v | 1] (the
ones column is 0 in the padding), and the division happens only at real tokens after the gather, so padding
never divides 0 by 0 (which with ``eps=0`` would put NaN into the gradients through the discarded outputs).
"""

from __future__ import annotations

import torch

from linattn import api
from linattn.feature_maps import resolve_feature_map
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
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    if int(cu[0]) != 0 or int(cu[-1]) != T:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {int(cu[0])} ... {int(cu[-1])}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be nondecreasing, got {cu.tolist()}")
    return cu


class _Layout:
    """Where each packed token goes in the padded batch: flat index ``row * T_max + offset``."""

    def __init__(self, cu: torch.Tensor):
        lengths = cu[1:] - cu[:-1]
        self.N = lengths.numel()
        self.T_max = int(lengths.max())
        rows = torch.repeat_interleave(torch.arange(self.N, device=cu.device), lengths)
        offsets = torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][rows]
        self.flat = rows * self.T_max + offsets

    def pad(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """``[1, T, ...]`` -> ``[N, T_max, ...]``, zeros in the padding."""
        if x is None:
            return None
        rest = x.shape[2:]
        out = x.new_zeros(self.N * self.T_max, *rest)
        return out.index_copy(0, self.flat, x[0]).view(self.N, self.T_max, *rest)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, T_max, ...]`` -> ``[1, T, ...]``."""
        return x.reshape(self.N * self.T_max, *x.shape[2:])[self.flat].unsqueeze(0)


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
) -> tuple[torch.Tensor, State | None]:
    """:func:`linattn.linear_attention` with ``cu_seqlens`` (same arguments; see the module docstring)."""
    mod = api._rule_module(rule)
    if form not in mod.FORMS:
        raise ValueError(f"form: rule {rule!r} has no form {form!r}; supported forms: {list(mod.FORMS)}")
    api._check_qkv(q, k, v, 4)
    api._check_scalars(eps, eps_mode, scale, chunk_size)
    B, T = q.shape[:2]
    HV, Dv = v.shape[-2:]
    cu = check_cu_seqlens(cu_seqlens, T, B, q.device)
    normalize = api._resolve_normalize(rule, normalize)
    dtype = api._compute_dtype(q.dtype, state_dtype)
    # The feature map goes first (token by token, so the same features as per sequence): padding must be zero
    # *features*, and e.g. elu1(0) = 1 is not.
    qf, kf, scale_ = api._features(q.to(dtype), k.to(dtype), resolve_feature_map(feature_map), scale)
    Dk = qf.shape[-1]
    api._check_gate_and_beta(rule, g, beta, (B, T, HV), Dk, q.device)
    layout = _Layout(cu)
    N = layout.N
    S0 = None
    if initial_state is not None:
        api._check_state(initial_state, N, HV, Dk, Dv, normalize, q.device, rule=rule, feature_map=feature_map,
                         d_in=q.shape[-1])
        S0 = State(api._augmented(initial_state, dtype) if normalize else initial_state.S.to(dtype))
    vv = v.to(dtype)
    if normalize:
        vv = api._with_ones_column(vv)
    o, S = api.linear_attention(
        layout.pad(qf), layout.pad(kf), layout.pad(vv), rule=rule, form=form, feature_map=None, normalize=False,
        scale=scale_, g=layout.pad(g), beta=layout.pad(beta), initial_state=S0,
        output_final_state=output_final_state, chunk_size=chunk_size, state_dtype=dtype,
    )
    o = layout.unpad(o)
    if normalize:
        o = api._read(o, eps, eps_mode)
    final = None if S is None else api._split(S.S, normalize, rule, feature_map)  # recorded as made by this call
    return o.to(v.dtype).contiguous(), final
