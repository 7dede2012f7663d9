"""One validated, immutable description of a call: what `prepare` (whole sequences, packed or not) and
`prepare_step` (one decode token) build from the public arguments, and what every path below takes.

Every entry point (``linear_attention``, ``step``, packed calls, ``linattn.distributed``, the nn layers through
them, the HF integration through them) checks its arguments here, once, through `linattn.checks`; the
paths (`linattn.prefill`, `linattn.packing`, `linattn.decode`, `linattn.backends`) trust
the description.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from linattn import checks
from linattn.feature_maps import FeatureMap, resolve_feature_map
from linattn.layout import features
from linattn.state import State


@dataclass(frozen=True)
class Call:
    """A prepared call. Sizes, named as in the public docs: ``B`` batch (1 when packed), ``T`` tokens (1 for a
    step), ``H`` q/k heads, ``HV`` value heads (a multiple of ``H``), ``D`` the width of q and k, ``r`` the feature
    width (after the feature map: the state's rows), ``Dv`` v's width. ``gate``: None, ``"head"`` or
    ``"channel"``. ``dtype``: the accumulation (state) dtype. ``scale``: as given (None: ``r ** -0.5``, applied by
    `linattn.prefill`). ``grad``: autograd is recording and some
    input (or a parametrized feature map) requires grad. ``cu_seqlens``: int64 ``[N + 1]`` or None."""

    rule: str
    form: str
    ops: ModuleType
    feature_map: str | FeatureMap | None
    fmap: FeatureMap | None
    normalize: bool
    scale: float | None
    eps: float
    eps_mode: str
    dtype: torch.dtype
    chunk_size: int
    backend: str
    B: int
    T: int
    H: int
    HV: int
    r: int
    Dv: int
    D: int
    gate: str | None
    grad: bool
    output_final_state: bool
    cu_seqlens: torch.Tensor | None = None

    @property
    def N(self) -> int:
        """Sequences: B, or the packed count."""
        return self.B if self.cu_seqlens is None else self.cu_seqlens.numel() - 1


def prepare(
    q, k, v, *, rule, form, feature_map, normalize, scale, eps, eps_mode, g, beta, initial_state,
    output_final_state, chunk_size, state_dtype, cu_seqlens, backend,
) -> Call:
    """Check every argument of `linattn.linear_attention` (in the order its errors are documented) and
    resolve the defaults; raises the first problem, naming the argument."""
    mod = checks.rule_module(rule)
    checks.check_form(mod, rule, form)
    checks.check_backend(backend)
    checks.check_qkv(q, k, v, 4)
    if cu_seqlens is None:
        checks.warn_layout(q)
    checks.check_scalars(eps, eps_mode, scale)
    checks.check_chunk_size(chunk_size)
    checks.check_flag("output_final_state", output_final_state)
    B, T, H, D = q.shape
    HV, Dv = v.shape[-2:]  # the state has one entry per value head
    cu = None if cu_seqlens is None else checks.check_cu_seqlens(cu_seqlens, T, B, q.device)
    normalize = checks.resolve_normalize(rule, normalize)
    dtype = checks.compute_dtype(q.dtype, state_dtype)
    fmap = resolve_feature_map(feature_map)
    # The map acts token by token, so one token tells the feature width before any work is done (in the
    # accumulation dtype, where the paths apply it).
    probe = features(q[:, :1].to(dtype), k[:, :1].to(dtype), fmap, scale)[0]
    r = probe.shape[-1]
    checks.check_gate_and_beta(rule, g, beta, (B, T, HV), r, q.device)
    N = B if cu is None else cu.numel() - 1
    if initial_state is not None:
        S_in = getattr(initial_state, "S", None)
        if cu is not None and isinstance(initial_state, State) and isinstance(S_in, torch.Tensor) and (
                S_in.dim() == 4 and S_in.shape[0] != N):
            raise ValueError(f"initial_state holds {S_in.shape[0]} states but cu_seqlens describes N = {N} sequences; "
                             "a packed call takes one initial state per sequence, [N, HV, r, Dv]")
        checks.check_state(initial_state, N, HV, r, Dv, normalize, q.device, rule=rule, feature_map=feature_map,
                           d_in=D)
    tracked = (q, k, v, g, beta) + (() if initial_state is None else (initial_state.S, initial_state.z))
    # A callable feature map may carry parameters: its output on one token tells whether autograd is needed.
    grad = torch.is_grad_enabled() and (probe.requires_grad or any(t is not None and t.requires_grad for t in tracked))
    return Call(rule=rule, form=form, ops=mod, feature_map=feature_map, fmap=fmap, normalize=normalize,
                scale=scale, eps=eps, eps_mode=eps_mode, dtype=dtype, chunk_size=chunk_size, backend=backend, B=B,
                T=T, H=H, HV=HV, r=r, Dv=Dv, D=D, gate=None if g is None else gate_kind(g, 4), grad=grad,
                output_final_state=output_final_state, cu_seqlens=cu)


def gate_kind(g: torch.Tensor, token_dims: int) -> str:
    """``"head"`` (one gate per head) or ``"channel"`` (one per key channel) for a checked gate."""
    return "channel" if g.dim() == token_dims else "head"


def prepare_step(
    q, k, v, state, *, rule, feature_map, normalize, scale, eps, eps_mode, g, beta, state_dtype, inplace, backend,
) -> Call:
    """Check every argument of [`linattn.step`][linattn.step] and resolve the defaults (``state=None``: zeros)."""
    mod = checks.rule_module(rule)
    checks.check_backend(backend)
    checks.check_qkv(q, k, v, 3)
    checks.check_scalars(eps, eps_mode, scale)
    checks.check_flag("inplace", inplace)
    normalize = checks.resolve_normalize(rule, normalize)
    B, H, D = q.shape
    HV, Dv = v.shape[-2:]
    if state is not None and not isinstance(state, State):
        raise TypeError(f"state must be a linattn.State or None, got {type(state).__name__}")
    dtype = checks.compute_dtype(q.dtype, state_dtype if state_dtype is not None or state is None else state.dtype)
    fmap = resolve_feature_map(feature_map)
    r = D if fmap is None else features(q[:1].to(dtype), k[:1].to(dtype), fmap, scale)[0].shape[-1]
    checks.check_gate_and_beta(rule, g, beta, (B, HV), r, q.device)
    if inplace:
        checks.check_inplace_inputs(q=q, k=k, v=v, g=g, beta=beta)
    if state is not None:
        checks.check_state(state, B, HV, r, Dv, normalize, q.device, name="state", rule=rule,
                           feature_map=feature_map, d_in=D)
        if inplace:
            checks.check_inplace(state, normalize, dtype)
            checks.check_inplace_batched(state, q=q, k=k, v=v, g=g, beta=beta)
    return Call(rule=rule, form="step", ops=mod, feature_map=feature_map, fmap=fmap, normalize=normalize,
                scale=scale, eps=eps, eps_mode=eps_mode, dtype=dtype, chunk_size=1, backend=backend, B=B, T=1,
                H=H, HV=HV, r=r, Dv=Dv, D=D, gate=None if g is None else gate_kind(g, 3), grad=False,
                output_final_state=True)
