"""The data layout every path shares: features of q and k, grouped value heads, and the state with its normalizer
as one more value column (``[S | z]``, the memory of a constant value 1)."""

from __future__ import annotations

import torch

from linattn.buffers import values
from linattn.feature_maps import FeatureMap, check_features, feature_map_name
from linattn.state import State, joint_view

UNSET = object()  # "no feature map to record" (None is a map: the identity)


def resolved(x):
    """``x`` as plain memory (`linattn.buffers.values`: a negative or conjugate view materialized with its values),
    anything else (None, non-tensors, which the checks then name) as it is. The compiled kernels read raw memory,
    where such a view holds other numbers."""
    return values(x) if isinstance(x, torch.Tensor) else x


def features(q: torch.Tensor, k: torch.Tensor, fmap: FeatureMap | None, scale: float | None):
    """Feature-mapped (q, k) and the query scale (default: feature width ** -0.5), not yet applied."""
    if fmap is not None:
        qf, kf = fmap(q), fmap(k)
        check_features(q, qf, fmap)
        check_features(k, kf, fmap)
        q, k = qf, kf
        if q.shape != k.shape:
            raise ValueError(f"feature_map gave q features {tuple(q.shape)} but k features {tuple(k.shape)}")
    return q, k, (q.shape[-1] ** -0.5 if scale is None else float(scale))


def group_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k features ``[..., H, r]`` repeated to ``heads`` value heads (q/k head h serves value heads h*G ... h*G+G-1,
    ``repeat_interleave`` as flash-linear-attention and HF Qwen3-Next do). A copy of q and k only; the kernels then
    see one q/k per value head, which they need anyway: every value head has its own state."""
    return x if x.shape[-2] == heads else x.repeat_interleave(heads // x.shape[-2], dim=-2)


def augmented(state: State, dtype: torch.dtype) -> torch.Tensor:
    """[S | z] as one [B, H, Dk, Dv+1] tensor: the normalizer is the memory of a constant value 1.

    When the state came out of this library, S and z are views of one such buffer; then that buffer is returned
    itself (see `linattn.state.joint_view`), so decode can update it in place without copying the state
    each step.
    """
    S, z = state.S, state.z
    # (A negative view shares the buffer's address but not its values: it is read through the concatenation.)
    plain = not (S.requires_grad or z.requires_grad or S.is_neg() or z.is_neg())
    joint = joint_view(S, z) if S.dtype == dtype and plain else None
    if joint is not None:
        return joint
    return torch.cat([S, z.unsqueeze(-1)], dim=-1).to(dtype)


def state_tensor(state: State, normalize: bool, dtype: torch.dtype) -> torch.Tensor:
    """The state as the paths take it: ``[S | z]`` when normalized, else S, in ``dtype`` (as plain memory: a
    negative view is copied, and `split_state` writes an in-place update back into it)."""
    return augmented(state, dtype) if normalize else resolved(state.S.to(dtype))


def with_ones_column(v: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[v | 1] (in ``dtype``, default v's): z is the memory of a constant value 1, carried as one more value column
    (a contiguous copy)."""
    if dtype is not None:
        v = v.to(dtype)
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def zero_state(B: int, H: int, Dk: int, Dv: int, normalize: bool, dtype: torch.dtype, device) -> torch.Tensor:
    """The empty state as the paths take it: ``[B, H, Dk, Dv + 1]`` zeros (``[S | z]``) when normalized, else
    ``[B, H, Dk, Dv]``."""
    return torch.zeros(B, H, Dk, Dv + 1 if normalize else Dv, dtype=dtype, device=device)


def to_kernel_layout(S: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[..., Dk, Dw]`` (``[S | z]`` or S) as the compiled token loops keep it: ``[..., Dw, Dk]``, one value
    column's keys contiguous; a contiguous copy in ``dtype`` outside autograd (the kernel writes it)."""
    ST = S.detach().to(dtype).transpose(-1, -2)
    if not ST.is_contiguous():
        return ST.contiguous()
    # Already in this layout (the transposed view of a contiguous [Dw, Dk] tensor, as HF's Mamba-2 cache is handed
    # on, or a width of 1), where .contiguous() would hand back the caller's own memory: a copy with its strides.
    return torch.empty_strided(ST.shape, ST.stride(), dtype=dtype, device=ST.device).copy_(ST)


def from_kernel_layout(ST: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_kernel_layout`: ``[..., Dw, Dk]`` back to ``[..., Dk, Dw]``, as a view (a caller
    that keeps it makes it contiguous)."""
    return ST.transpose(-1, -2)


def split_state(
    S_aug: torch.Tensor, normalize: bool, rule: str | None = None, feature_map=UNSET, into: State | None = None
) -> State:
    """The state to return, recording what made it (``rule``, ``feature_map``; left out: no record). ``into``: the
    caller's state that ``inplace=True`` updates; when the update ran on a copy (a joint copy of its separate S
    and z, a negative view's values), the result is written back into them."""
    name = None if feature_map is UNSET else feature_map_name(feature_map)
    if into is not None and S_aug.data_ptr() != into.S.data_ptr():
        if normalize:
            into.S.copy_(S_aug[..., :-1])
            into.z.copy_(S_aug[..., -1])
        else:
            into.S.copy_(S_aug)
        S, z = into.S, into.z
    else:
        S, z = (S_aug[..., :-1], S_aug[..., -1]) if normalize else (S_aug, None)
    return State(S, z, rule=rule, feature_map=name, normalized=None if rule is None else normalize)
