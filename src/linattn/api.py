"""The public torch API: :func:`linear_attention` for whole sequences, :func:`step` for one-token decode.

Both validate their inputs, apply the feature map and scale, pick the accumulation dtype and then hand
``[B, H, T, D]`` tensors to a rule module in :mod:`linattn.ops` (imported on first use, so ``import linattn``
loads no kernel). Every form of every rule shares this one signature and these defaults.
"""

from __future__ import annotations

import importlib
import math
import sys
import warnings

import torch

from linattn import kernels
from linattn.feature_maps import FeatureMap, check_features, feature_map_name, resolve_feature_map
from linattn.ops import DELTA_RULES, EPS_MODES, GATED_RULES, RULES
from linattn.ops.common import normalized_read
from linattn.state import State, is_joint, joint_view


def _rule_module(rule: str):
    if not isinstance(rule, str):
        raise TypeError(f"rule must be a str, one of {list(RULES)}; got {type(rule).__name__}")
    if rule not in RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; expected one of {list(RULES)}")
    return importlib.import_module(f"linattn.ops.{rule}")


def supported_forms(rule: str) -> tuple[str, ...]:
    """Names of the execution forms a rule has, e.g. ``supported_forms("delta") == ("recurrent", "chunk")``."""
    return tuple(_rule_module(rule).FORMS)


def _check_form(mod, rule: str, form: str) -> None:
    if not isinstance(form, str):
        raise TypeError(f"form must be a str, one of {list(mod.FORMS)}; got {type(form).__name__}")
    if form not in mod.FORMS:
        raise ValueError(f"form: rule {rule!r} has no form {form!r}; supported forms: {list(mod.FORMS)}")


def _check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__}")


LAYOUT_WARN_HEADS = 128  # more heads than published models use (DeepSeek-V3 has 128)


def _warn_layout(q: torch.Tensor) -> None:
    """Warn when q's shape suggests the head-first layout [B, H, T, D] was passed for [B, T, H, D].

    flash-linear-attention warned whenever seq_len < num_heads; that fired on every short chunk of chunked prefill
    (fla issue #675; vLLM removed it, fla 0.6 dropped it with ``head_first``). Here it also takes more "heads"
    than any model has, H > 128: a head-first input with T > 128 tokens is caught, a short prompt never warns.
    """
    T, H = q.shape[1], q.shape[2]
    if T < H and H > LAYOUT_WARN_HEADS:
        warnings.warn(
            f"q has shape {tuple(q.shape)}, read as [B, T, H, D] = T {T} tokens and H {H} heads; fewer tokens than "
            "heads, and more heads than models have, suggests [B, H, T, D] was passed: if so, pass "
            "q.transpose(1, 2) (and k, v, g, beta likewise)",
            UserWarning,
            stacklevel=3,
        )


def _check_tensor(name: str, x: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def _check_qkv(q, k, v, token_dims: int) -> None:
    """Shapes, dtypes and devices of q, k, v. ``token_dims`` is 4 for [B,T,H,D] and 3 for one token [B,H,D]."""
    layout = "[B, T, H, D]" if token_dims == 4 else "[B, H, D]"
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, x, token_dims, layout)
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape {layout}, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if v.shape[:-2] != q.shape[:-2] or v.shape[-2] % max(q.shape[-2], 1):
        raise ValueError(
            f"v must match q on {layout[:-7]}] and have a multiple of q's H heads (grouped value heads), "
            f"got q {tuple(q.shape)} and v {tuple(v.shape)}"
        )
    if token_dims == 4 and q.shape[1] == 0:
        raise ValueError(f"empty sequence: q, k, v have T = 0 (shape {tuple(q.shape)})")
    if min(q.shape) == 0 or min(v.shape) == 0:
        raise ValueError(f"q, k, v must have no empty dimension, got q {tuple(q.shape)} and v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_gate_and_beta(rule, g, beta, lead: tuple[int, ...], feature_dim: int, device) -> None:
    """``lead`` is (B, T, H) for sequences, (B, H) for one token."""
    lead_s = ", ".join(map(str, lead))
    if rule in GATED_RULES:
        if g is None:
            raise ValueError(f"g: rule {rule!r} needs a log-gate g (alpha = exp(g), g <= 0)")
        ok = (tuple(lead), (*lead, feature_dim))  # one gate per head, or per key channel (GLA, KDA)
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"g must be a torch.Tensor, got {type(g).__name__}")
        if tuple(g.shape) not in ok:
            want = " or ".join(f"[{', '.join(map(str, s))}]" for s in ok)
            raise ValueError(f"g must have shape {want} for rule {rule!r}, got {tuple(g.shape)}")
        if not g.is_floating_point():
            raise TypeError(f"g must be a floating-point tensor, got {g.dtype}")
        if g.device != device:
            raise ValueError(f"g is on {g.device} but q is on {device}")
        if g.is_meta:
            raise ValueError(
                f"g is on the meta device: rule {rule!r} reads the gate's values (to check g <= 0, and the chunk "
                "form to pick its decay path), which a meta tensor does not have; accumulate and delta run on meta"
            )
        # One pass that also catches NaN (NaN > 0 is False, NaN <= 0 too): a NaN gate is an error, not a state.
        if g.numel() and not bool((g <= 0).all()):
            bad = "NaN" if bool(g.isnan().any()) else f"largest value {g.max().item():.4g}"
            raise ValueError(f"g must be <= 0 (alpha = exp(g) <= 1); it holds {bad}")
    elif g is not None:
        raise ValueError(f"g: rule {rule!r} has no gate; use rule='gated' or 'gated_delta', or pass g=None")
    if rule in DELTA_RULES:
        if beta is None:
            raise ValueError(f"beta: rule {rule!r} needs a write strength beta of shape [{lead_s}]")
        if not isinstance(beta, torch.Tensor):
            raise TypeError(f"beta must be a torch.Tensor, got {type(beta).__name__}")
        if tuple(beta.shape) != tuple(lead):
            raise ValueError(f"beta must have shape [{lead_s}], got {tuple(beta.shape)}")
        if not beta.is_floating_point():
            raise TypeError(f"beta must be a floating-point tensor, got {beta.dtype}")
        if beta.device != device:
            raise ValueError(f"beta is on {beta.device} but q is on {device}")
    elif beta is not None:
        raise ValueError(f"beta: rule {rule!r} has no write strength; use rule='delta' or 'gated_delta'")


def _resolve_normalize(rule: str, normalize: bool | None) -> bool:
    if normalize is None:
        return rule not in DELTA_RULES
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool or None, got {type(normalize).__name__}")
    if normalize and rule in DELTA_RULES:
        raise ValueError(f"normalize=True: rule {rule!r} defines no normalizer z; pass normalize=False or None")
    return normalize


_NO_CHUNKS = object()  # step has no chunk_size


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def _check_scalars(eps, eps_mode, scale, chunk_size=_NO_CHUNKS) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps >= 0 and _finite(eps)):
        raise ValueError(f"eps must be a number >= 0 and finite, got {eps!r}")
    if not isinstance(eps_mode, str):
        raise TypeError(f"eps_mode must be a str, one of {list(EPS_MODES)}; got {type(eps_mode).__name__}")
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: unknown mode {eps_mode!r}; expected one of {list(EPS_MODES)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if scale is not None and not _finite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if chunk_size is _NO_CHUNKS:
        return
    # Any size from 1 up to the largest tensor size torch can index; larger than T means one chunk of T tokens.
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be a positive int, got {type(chunk_size).__name__} {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    if chunk_size > sys.maxsize:
        raise ValueError(f"chunk_size must be at most 2**63 - 1 (the largest size torch indexes), got {chunk_size}")


def _compute_dtype(x_dtype: torch.dtype, state_dtype: torch.dtype | None) -> torch.dtype:
    if state_dtype is not None:
        if not isinstance(state_dtype, torch.dtype) or not state_dtype.is_floating_point:
            raise TypeError(
                f"state_dtype must be a floating torch.dtype, got {state_dtype!r} (with state_dtype=None, step "
                "takes the state's dtype)"
            )
        return state_dtype
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def _features(q, k, fmap: FeatureMap | None, scale: float | None):
    """Feature-mapped (q, k) and the query scale (default: feature width ** -0.5), not yet applied."""
    if fmap is not None:
        qf, kf = fmap(q), fmap(k)
        check_features(q, qf, fmap)
        check_features(k, kf, fmap)
        q, k = qf, kf
        if q.shape != k.shape:
            raise ValueError(f"feature_map gave q features {tuple(q.shape)} but k features {tuple(k.shape)}")
    return q, k, (q.shape[-1] ** -0.5 if scale is None else float(scale))


_UNSET = object()


def _check_state(
    state, B, H, Dk, Dv, normalize: bool, device, name: str = "initial_state", *, rule: str | None = None,
    feature_map=_UNSET, d_in: int | None = None,
) -> None:
    """``state`` fits this call: its record (if any) names this rule and feature map, its shape the feature width.
    (``rule``, ``feature_map``: the call's, to compare with the record; ``d_in``: q's width, to explain widths.)"""
    if not isinstance(state, State):
        raise TypeError(f"{name} must be a linattn.State or None, got {type(state).__name__}")
    if state.rule is not None and rule is not None and state.rule != rule:
        raise ValueError(
            f"{name} was made by rule {state.rule!r} but this call uses rule={rule!r}; a state continues only the "
            "rule that made it (to carry it over on purpose, pass State(state.S, state.z))"
        )
    if state.feature_map is not None and feature_map is not _UNSET and state.feature_map != feature_map_name(
        feature_map
    ):
        raise ValueError(
            f"{name} was made with feature_map {state.feature_map!r} but this call uses "
            f"{feature_map_name(feature_map)!r}; its keys live in that map's feature space"
        )
    if not state.S.is_floating_point():  # State checks this when made; S may have been replaced since
        raise TypeError(f"{name}.S must be a real floating-point tensor, got {state.S.dtype}")
    if tuple(state.S.shape) != (B, H, Dk, Dv):
        why = ""
        if state.S.shape[2] != Dk and d_in is not None and Dk != d_in:
            why = (
                f": its key width {state.S.shape[2]} must be the feature width {Dk} that feature_map "
                f"{feature_map_name(feature_map)!r} gives for inputs of width {d_in}"
            )
        elif state.S.shape[2] != Dk:
            why = f": its key width {state.S.shape[2]} must be the width of q and k, {Dk}"
        elif state.S.shape[3] != Dv:
            why = f": its value width {state.S.shape[3]} must be v's width {Dv}"
        else:
            why = f": its batch and heads {tuple(state.S.shape[:2])} must be q's (B, H) = {(B, H)}"
        raise ValueError(f"{name}.S must be [B, H, Dk, Dv] = {(B, H, Dk, Dv)}, got {tuple(state.S.shape)}{why}")
    if normalize and state.z is None:
        by = f"rule {rule!r} normalizes" if rule is not None else "accumulate and gated normalize"
        raise ValueError(
            f"{name}.z is None but normalize=True needs the normalizer z: {by} by default (normalize=None means "
            "True for accumulate and gated); pass normalize=False to read this state without a normalizer, or a "
            "State with z"
        )
    if not normalize and state.z is not None:
        raise ValueError(f"{name}.z is set but normalize=False keeps no normalizer; pass State(S) alone")
    if state.S.device != device:
        raise ValueError(f"{name} is on {state.S.device} but q is on {device}")


def _overlapping(shape, stride) -> bool:
    """True when two elements may share memory (e.g. an ``expand``ed tensor); conservative for exotic strides."""
    extent = 1
    for st, n in sorted((st, n) for st, n in zip(stride, shape, strict=True) if n > 1):
        if st < extent:
            return True
        extent += st * (n - 1)
    return False


def _check_inplace(state: State, normalize: bool, dtype: torch.dtype) -> None:
    """``step(inplace=True)`` can update ``state``'s own tensors: the caller's S and z never go stale.

    A state from linattn (S and z one buffer, or S alone, contiguous) is updated where it lies; S and z as
    separate tensors are updated through one joint copy and written back; anything else is refused.
    """
    S, z = state.S, state.z
    if S.dtype != dtype:
        raise ValueError(f"inplace=True needs the state in {dtype}, got {S.dtype}")
    if S.requires_grad or (z is not None and z.requires_grad):
        raise ValueError(
            "inplace=True: the state requires grad, and an in-place update is not differentiable; pass "
            "inplace=False to keep the graph, or state.detach()"
        )
    if S.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError(
            "inplace=True: the state holds inference tensors (made under torch.inference_mode), which cannot be "
            "updated outside it; decode under torch.inference_mode too, or pass state.clone() or inplace=False"
        )
    B, H, Dk, Dv = S.shape
    width = Dv + 1 if normalize else Dv
    st = S.stride()
    if st == (H * Dk * width, Dk * width, width, 1) and (z is None or z.stride() == st[:-1]):
        return  # the usual case, the layout linattn makes: nothing overlaps, nothing more to look at
    if normalize and not is_joint(S, z):  # separate S and z: updated through a copy, then written back
        if z.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError("inplace=True: state.z is an inference tensor; decode under torch.inference_mode")
        bad = [n for n, x in (("S", S), ("z", z)) if _overlapping(x.shape, x.stride())]
    else:  # the kernels update it where it lies, as [B*H, Dk, width]
        viewable = B == 1 or H == 1 or st[0] == H * st[1]
        bad = [] if viewable and not _overlapping((B, H, Dk, width), st) else ["S"]
    if bad:
        raise ValueError(
            f"inplace=True: state.{bad[0]} has overlapping or unmergeable memory (shape {tuple(S.shape)}, strides "
            f"{st}), e.g. from expand(); pass state.clone() or inplace=False"
        )


def _augmented(state: State, dtype) -> torch.Tensor:
    """[S | z] as one [B, H, Dk, Dv+1] tensor: the normalizer is the memory of a constant value 1.

    When the state came out of this library, S and z are views of one such buffer; then that buffer is returned
    itself (see :func:`linattn.state.joint_view`), so decode can update it in place without copying the state
    each step.
    """
    S, z = state.S, state.z
    joint = None if S.dtype != dtype or S.requires_grad or z.requires_grad else joint_view(S, z)
    if joint is not None:
        return joint
    return torch.cat([S, z.unsqueeze(-1)], dim=-1).to(dtype)


def _with_ones_column(v: torch.Tensor) -> torch.Tensor:
    """[v | 1]: z is the memory of a constant value 1, carried as one more value column (a contiguous copy)."""
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def _split(
    S_aug: torch.Tensor, normalize: bool, rule: str | None = None, feature_map=_UNSET, into: State | None = None
) -> State:
    """The state to return, recording what made it (``rule``, ``feature_map``; left out: no record). ``into``: the
    caller's state that ``inplace=True`` updates; when the update ran on a joint copy of its separate S and z,
    the result is written back into them."""
    name = None if feature_map is _UNSET else feature_map_name(feature_map)
    if into is not None and S_aug.data_ptr() != into.S.data_ptr():
        into.S.copy_(S_aug[..., :-1])
        into.z.copy_(S_aug[..., -1])
        S, z = into.S, into.z
    else:
        S, z = (S_aug[..., :-1], S_aug[..., -1]) if normalize else (S_aug, None)
    return State(S, z, rule=rule, feature_map=name, normalized=None if rule is None else normalize)


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    rule: str = "accumulate",
    form: str = "chunk",
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
    """Causal linear attention over a whole sequence; every ``form`` computes the same function.

    Shapes: ``q, k [B, T, H, Dk_in]``, ``v [B, T, HV, Dv]``, output ``o [B, T, HV, Dv]`` in ``v.dtype``. ``HV`` is
    ``H`` or a multiple of it (grouped value heads, as in flash-linear-attention and Qwen3-Next): q/k head ``h``
    serves value heads ``h * HV/H`` to ``(h + 1) * HV/H - 1`` (``repeat_interleave``); ``g``, ``beta`` and the
    state have ``HV`` heads.

    Args:
        rule: ``"accumulate"`` S_t = S_{t-1} + k v^T; ``"gated"`` S_t = a_t S_{t-1} + k v^T (``a = exp(g)``, per head
            or per key channel); ``"delta"`` S_t = S_{t-1} + beta k (v - S^T k)^T; ``"gated_delta"``
            S_t = a_t (I - beta k k^T) S_{t-1} + beta k v^T (gate before the prediction, as in Gated DeltaNet).
            The output reads the state after the write: o_t = S_t^T q_t (divided by q_t^T z_t if normalized).
        form: ``"recurrent"`` (token loop, the semantics), ``"chunk"`` (default; matmuls inside chunks, state carried
            between them; the training path), ``"parallel"`` (dense masked T x T; accumulate, gated), ``"scan"``
            (log-depth associative scan; accumulate, gated). :func:`supported_forms` lists them per rule.
        feature_map: ``None`` (q, k are features already), ``"relu1"``, ``"elu1"``, ``"identity"``, ``"taylor2"``
            (Based, width 1 + D + D^2) or a callable ``[..., D] -> [..., r]``.
        normalize: divide by q^T z. ``None`` (default) means the rule's own definition: ``True`` for accumulate and
            gated, ``False`` for the delta rules (which define no z; ``True`` there is an error).
        scale: multiplies the query features; default ``r ** -0.5`` with r the feature width (as in
            flash-linear-attention). With ``normalize`` it cancels except against ``eps``.
        eps, eps_mode: the denominator is ``den + eps`` (``"add"``, default) or ``max(den, eps)`` (``"clamp"``);
            ``eps=0`` divides exactly. Used only when normalized, the same way in every form.
        g: log-gate (``g <= 0``), ``[B, T, HV]`` or per key channel ``[B, T, HV, r]`` (GLA; for ``"gated_delta"``
            Kimi Delta Attention, S_t = (I - beta k k^T) diag(a_t) S_{t-1} + beta k v^T). Gated rules only.
        beta: write strength ``[B, T, HV]`` for the delta rules. The write converges for ``0 < beta |k|^2 < 2``.
        initial_state: a :class:`State` with ``S [B, HV, r, Dv]`` (and ``z [B, HV, r]`` when normalized).
        output_final_state: return the state after the last token (else ``None``).
        chunk_size: tokens per chunk in the ``"chunk"`` form (any T works, the last chunk may be shorter).
        state_dtype: accumulation dtype; default float32, or float64 when the inputs are float64.
        cu_seqlens: packed sequences (as flash-linear-attention and FlashAttention): an int tensor ``[N + 1]``,
            0 ... T nondecreasing, with ``B = 1``; sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``. Nothing
            crosses a boundary; ``initial_state`` and the final state have N entries (a zero-length sequence passes
            its initial state through). See :mod:`linattn.packing`.
        backend: ``"auto"`` (default: a compiled kernel where it covers the call and was measured faster, else
            the torch form: numba on CPU; Triton only when forced), ``"torch"`` (always the torch forms), ``"cpu"``
            (the fused numba token loop: forward only, float32 state, CPU) or ``"triton"`` (the Triton kernels: CUDA,
            or CPU under ``TRITON_INTERPRET=1``). A forced backend that cannot run the call is a ``ValueError`` naming
            the reason. See :mod:`linattn.kernels`.

    A log-gate of ``-inf`` is an exact reset (the state before it is forgotten, in every form); NaN in ``g`` is an
    error. Any other NaN or Inf input is neither masked nor raised: it reaches the state and every later output, and in
    the matmul forms also the other outputs of its chunk (``"chunk"``) or of the whole sequence (``"parallel"``),
    since a masked product still computes 0 * NaN. Returns ``(o, final_state)``, ``o`` contiguous.
    """
    if cu_seqlens is not None:
        from linattn.packing import packed_linear_attention

        return packed_linear_attention(
            q, k, v, cu_seqlens, rule=rule, form=form, feature_map=feature_map, normalize=normalize, scale=scale,
            eps=eps, eps_mode=eps_mode, g=g, beta=beta, initial_state=initial_state,
            output_final_state=output_final_state, chunk_size=chunk_size, state_dtype=state_dtype, backend=backend,
        )
    mod = _rule_module(rule)
    _check_form(mod, rule, form)
    kernels.check_backend(backend)
    _check_qkv(q, k, v, 4)
    _warn_layout(q)
    _check_scalars(eps, eps_mode, scale, chunk_size)
    _check_flag("output_final_state", output_final_state)
    normalize = _resolve_normalize(rule, normalize)
    B, T, _, _ = q.shape
    H, Dv = v.shape[-2:]  # the state has one entry per value head
    dtype = _compute_dtype(q.dtype, state_dtype)
    fmap = resolve_feature_map(feature_map)
    # Features in the accumulation dtype: a bfloat16 feature map (Taylor's outer products) would add its own error.
    # The map acts token by token, so one token tells the feature width before any work is done.
    probe = _features(q[:, :1].to(dtype), k[:, :1].to(dtype), fmap, scale)[0]
    Dk = probe.shape[-1]  # the feature width
    _check_gate_and_beta(rule, g, beta, (B, T, H), Dk, q.device)
    if initial_state is not None:
        _check_state(initial_state, B, H, Dk, Dv, normalize, q.device, rule=rule, feature_map=feature_map,
                     d_in=q.shape[-1])
    if initial_state is None:
        S = torch.zeros(B, H, Dk, Dv + normalize, dtype=dtype, device=q.device)
    else:
        S = _augmented(initial_state, dtype) if normalize else initial_state.S.to(dtype)

    # The chunk form runs over slabs of whole chunks, carrying the state: the same arithmetic, but each slab's
    # temporaries stay in cache and peak memory stays bounded however long the sequence. Other forms take it whole.
    slab = _slab_tokens(B * H, Dk + Dv, chunk_size, torch.finfo(dtype).bits // 8) if form == "chunk" else T
    # Without autograd, each slab writes its share of the output in place (the division is that write).
    tracked = (q, k, v, g, beta) + (() if initial_state is None else (initial_state.S, initial_state.z))
    # A callable feature map may carry parameters: its output on one token tells whether autograd is needed.
    grad = torch.is_grad_enabled() and (probe.requires_grad or any(t is not None and t.requires_grad for t in tracked))
    fast = kernels.linear_attention(backend, rule=rule, form=form, q=q, k=k, v=v, g=g, beta=beta, state=S, fmap=fmap,
                                    scale=scale, normalize=normalize, eps=eps, eps_mode=eps_mode, grad=grad,
                                    chunk_size=chunk_size)
    if fast is not None:
        return fast[0], (_split(fast[1], normalize, rule, feature_map) if output_final_state else None)
    out = None if grad else torch.empty(B, T, H, Dv, dtype=v.dtype, device=v.device)
    pieces = []

    # torch.split, not slicing: autograd then joins the slabs' gradients in one concatenation, where each slice
    # would get a zero-filled gradient of the whole sequence (quadratic in the number of slabs).
    def slabs(x):
        return [None] * len(range(0, T, slab)) if x is None else x.split(slab, dim=1)

    t0 = 0
    for qs, ks, vs, gs, bs in zip(slabs(q), slabs(k), slabs(v), slabs(g), slabs(beta), strict=True):
        part = slice(t0, t0 + qs.shape[1])
        t0 = part.stop
        qf, kf, scale_ = _features(qs.to(dtype), ks.to(dtype), fmap, scale)
        qf, kf = _group(qf, H), _group(kf, H)
        if dtype == torch.float16:  # narrow range: scale before the products rather than after them
            qf, scale_ = qf * scale_, 1.0

        # Internal layout [B, H, T, D]: each (batch, head) pair is one sequence for the batched matmuls.
        def heads_first(x):
            return None if x is None else x.transpose(1, 2).to(dtype)

        vh = _with_ones_column(heads_first(vs)) if normalize else heads_first(vs)
        # The kernels apply the scale themselves (the chunk form folds it into its matmuls at no cost).
        o, S = mod.FORMS[form](
            qf.transpose(1, 2), kf.transpose(1, 2), vh, g=heads_first(gs), beta=heads_first(bs),
            initial_state=S, chunk_size=chunk_size, scale=scale_,
        )
        o = o.transpose(1, 2)
        if out is not None and normalize:
            normalized_read(o, eps, eps_mode, out=out[:, part])
        elif out is not None:
            out[:, part].copy_(o)
        else:
            pieces.append(normalized_read(o, eps, eps_mode) if normalize else o)
    if out is None:
        out = (torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0].contiguous()).to(v.dtype)
    # (The chunk form carries a half-precision state in float32 between slabs; it is stored as asked at the end.)
    return out, (_split(S.to(dtype), normalize, rule, feature_map) if output_final_state else None)


def _group(x: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k features ``[..., H, r]`` repeated to ``heads`` value heads (q/k head h serves value heads h*G ... h*G+G-1,
    ``repeat_interleave`` as flash-linear-attention and HF Qwen3-Next do). A copy of q and k only; the kernels then
    see one q/k per value head, which they need anyway: every value head has its own state."""
    return x if x.shape[-2] == heads else x.repeat_interleave(heads // x.shape[-2], dim=-2)


def _slab_tokens(heads: int, width: int, chunk_size: int, elem_bytes: int, budget: int = 4 << 20) -> int:
    """Tokens per slab of the chunk form: whole chunks whose ``width`` (Dk + Dv) columns over all heads take about
    ``budget`` bytes.

    4 MiB was the fastest of 1-16 MiB measured on a 2-core Xeon with 2 MiB of L2 per core (H=8, D=64, T=8192).
    """
    chunks = max(1, budget // (heads * width * elem_bytes * chunk_size))
    return chunks * chunk_size


_F32 = torch.float32
_Tensor = torch.Tensor


def _trusted_state(S: torch.Tensor, z: torch.Tensor | None, rule: str, feature_map: str, normalized: bool) -> State:
    """A State from tensors this module just made in the layout ``State`` checks for (decode's fast path: the
    checks of ``State.__post_init__`` would cost more than the step's kernel)."""
    state = object.__new__(State)
    state.__dict__.update(S=S, z=z, rule=rule, feature_map=feature_map, normalized=normalized)
    return state


def _fast_step(q, k, v, state, rule, feature_map, normalize, scale, eps, eps_mode, g, beta, state_dtype, inplace,
               backend) -> tuple[torch.Tensor, State] | None:
    """The decode step of :func:`step` in one compiled call, or None when the call is not the plain case.

    At batch 1 the checks and the torch ops around a step cost as much as the step itself. So this proves, with
    attribute reads only (each ~50 ns, where a torch op costs ~1 us), that the call is valid and needs nothing the
    compiled kernel lacks: float32 contiguous CPU tensors outside autograd, a built-in elementwise or L2 feature
    map, a state in linattn's own layout (made for this rule and map, or with no record, as State.zeros makes it).
    Anything else, and any bad gate value (the kernel checks them before writing), goes through the full path,
    which gives the result or the error that names the argument. Nothing is cached between calls: every fact is
    read again (a tensor's layout can change in place). The checks are written out inline because a helper
    function call costs as much as two of them.
    """
    kd = kernels.decode_kernel(backend)
    if kd is None or type(state) is not State or not (inplace is True or inplace is False):
        return None
    code = kd.FEATURE_CODES.get(feature_map) if feature_map is None or type(feature_map) is str else None
    if code is None:
        return None
    if normalize is None:
        normalize = rule not in DELTA_RULES
    elif not (normalize is False or (normalize is True and rule not in DELTA_RULES)):
        return None  # not a bool, or a delta rule asked to normalize: the full path says why
    # A state with no record (State.zeros, State(S, z)) is checked by its layout alone, as the full path does.
    fmap_name = feature_map or "identity"
    recorded = state.rule is not None
    if recorded and (state.rule != rule or state.normalized is not normalize or state.feature_map != fmap_name):
        return None
    if rule not in RULES or not (state_dtype is None or state_dtype is _F32):
        return None
    if not (type(eps) is float and 0.0 <= eps < math.inf and (eps_mode == "add" or eps_mode == "clamp")):
        return None
    # q, k [B, Hq, D], v [B, HV, Dv]: plain float32 contiguous CPU tensors outside autograd
    if not (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor):
        return None
    if not (q.dtype is _F32 and k.dtype is _F32 and v.dtype is _F32 and q.is_cpu and k.is_cpu and v.is_cpu):
        return None
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return None
    if q.requires_grad or k.requires_grad or v.requires_grad:
        return None
    q_shape, v_shape = q.shape, v.shape
    if len(q_shape) != 3 or len(v_shape) != 3 or k.shape != q_shape:
        return None
    (B, Hq, D), (B_v, HV, Dv) = q_shape, v_shape
    if B_v != B or not (B and Hq and D and HV and Dv) or HV % Hq:
        return None
    if scale is None:
        scale = D**-0.5
    elif not (type(scale) is float and math.isfinite(scale)):
        return None
    gated, delta = rule in GATED_RULES, rule in DELTA_RULES
    gate_width = 0
    if gated:  # g [B, HV] or, for gated, [B, HV, D] (per-channel gates on a delta rule, Kimi Delta: the torch form)
        if not (type(g) is _Tensor and g.dtype is _F32 and g.is_cpu and g.is_contiguous() and not g.requires_grad):
            return None
        g_shape = g.shape
        if g_shape == (B, HV):
            gate_width = 1
        elif g_shape == (B, HV, D) and not delta:
            gate_width = D
        else:
            return None
    elif g is not None:
        return None
    if delta:  # beta [B, HV]
        if not (type(beta) is _Tensor and beta.dtype is _F32 and beta.is_cpu and beta.is_contiguous()
                and not beta.requires_grad and beta.shape == (B, HV)):
            return None
    elif beta is not None:
        return None
    # The state: S [B, HV, D, Dv] as columns of one contiguous [B, HV, D, Dw] buffer, z (normalized) its last column.
    S, z = state.S, state.z
    Dw = Dv + 1 if normalize else Dv
    if type(S) is not _Tensor or S.dtype is not _F32 or not S.is_cpu or S.requires_grad or S.shape != (B, HV, D, Dv):
        return None
    if S.stride() != (HV * D * Dw, D * Dw, Dw, 1):
        return None
    S_at = S.data_ptr()
    if normalize:  # z must be that buffer's last column (and cover it: the kernel writes its last element)
        if (type(z) is not _Tensor or z.dtype is not _F32 or z.requires_grad or z.data_ptr() != S_at + 4 * Dv
                or z.stride() != (HV * D * Dw, D * Dw, Dw) or z.shape != (B, HV, D)):
            return None
    elif z is not None:
        return None
    if B * HV * D * Dw >= kd.PARALLEL_MIN_WORK and torch.get_num_threads() > 1:
        return None  # batch decode: the general path splits the heads over threads
    if inplace:
        if S.is_inference() and not torch.is_inference_mode_enabled():
            return None
        out = S_at
    else:  # the kernel reads the old state and writes the new one into a fresh buffer: no copy first
        buf = S.new_empty((B, HV, D, Dw))
        out = buf.data_ptr()
    o = torch.empty_like(v)  # v is [B, HV, Dv] float32 contiguous: so is o (whatever the default dtype or device)
    status = kd.decode(q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr() if gated else 0,
                       beta.data_ptr() if delta else 0, S_at, out, o.data_ptr(), B, Hq, HV, D, Dv, gate_width, code,
                       eps_mode == "clamp", normalize, delta, scale, eps)
    if status != kd.OK:
        return None  # nothing was written; the full path raises the error that names the gate
    if inplace:
        # The kernel wrote through a raw pointer: tell autograd, so a graph that saved this state refuses to use
        # the overwritten values instead of computing a wrong gradient from them.
        torch.autograd.graph.increment_version(S)
        return o, (state if recorded else _trusted_state(S, z, rule, fmap_name, normalize))
    if normalize:
        return o, _trusted_state(buf[..., :Dv], buf[..., Dv], rule, fmap_name, True)
    return o, _trusted_state(buf, None, rule, fmap_name, False)


def step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: State | None = None,
    *,
    rule: str = "accumulate",
    feature_map: str | FeatureMap | None = None,
    normalize: bool | None = None,
    scale: float | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    state_dtype: torch.dtype | None = None,
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, State]:
    """One-token decode: write token t into ``state``, then read it with the query.

    Shapes: ``q, k [B, H, Dk_in]``, ``v [B, HV, Dv]``, ``g [B, HV]`` (or ``[B, HV, r]`` per key channel),
    ``beta [B, HV]`` (HV a multiple of H: grouped value heads, see :func:`linear_attention`);
    returns ``o [B, HV, Dv]`` and the new :class:`State`. Arguments mean what they mean in
    :func:`linear_attention`, which this agrees with token by token (prefill there, decode here).
    ``state=None`` starts from zeros. ``inplace=True`` updates the state's memory instead of allocating a new
    one (no autograd through it); the state must then already be in the accumulation dtype.
    ``backend`` as in :func:`linear_attention` (``"auto"`` takes the fused compiled step on CPU when it can).
    """
    fast = _fast_step(q, k, v, state, rule, feature_map, normalize, scale, eps, eps_mode, g, beta, state_dtype,
                      inplace, backend)
    if fast is not None:
        return fast
    mod = _rule_module(rule)
    kernels.check_backend(backend)
    _check_qkv(q, k, v, 3)
    _check_scalars(eps, eps_mode, scale)
    _check_flag("inplace", inplace)
    normalize = _resolve_normalize(rule, normalize)
    B = q.shape[0]
    H, Dv = v.shape[-2:]
    if state is not None and not isinstance(state, State):
        raise TypeError(f"state must be a linattn.State or None, got {type(state).__name__}")
    dtype = _compute_dtype(q.dtype, state_dtype if state_dtype is not None or state is None else state.dtype)
    qf, kf, scale = _features(q.to(dtype), k.to(dtype), resolve_feature_map(feature_map), scale)
    qf, kf = _group(qf, H), _group(kf, H)
    # Decode is dominated by per-op overhead, so save one: with the normalizer, (s q)^T S / ((s q)^T z + eps)
    # equals q^T S / (q^T z + eps / s) for s > 0 (clamp alike), and the scale moves into eps.
    fold_scale = normalize and scale > 0
    if not fold_scale:
        qf = qf * scale
    Dk = qf.shape[-1]
    _check_gate_and_beta(rule, g, beta, (B, H), Dk, q.device)
    if state is None:
        state = State.zeros(B, H, Dk, Dv, normalizer=normalize, dtype=dtype, device=q.device)
    else:
        _check_state(state, B, H, Dk, Dv, normalize, q.device, name="state", rule=rule, feature_map=feature_map,
                     d_in=q.shape[-1])
        if inplace:
            _check_inplace(state, normalize, dtype)
    S = _augmented(state, dtype) if normalize else state.S.to(dtype)
    fast = kernels.step(backend, rule=rule, q=qf, k=kf, v=v, g=g, beta=beta, state=S, normalize=normalize,
                        eps=eps / scale if fold_scale else eps, eps_mode=eps_mode, inplace=inplace)
    if fast is not None:
        return fast[0], _split(fast[1], normalize, rule, feature_map, into=state if inplace else None)
    vv = _with_ones_column(v.to(dtype)) if normalize else v.to(dtype)
    o, S = mod.step(
        qf,
        kf,
        vv,
        g=None if g is None else g.to(dtype),
        beta=None if beta is None else beta.to(dtype),
        state=S,
        inplace=inplace,
    )
    if normalize:
        o = normalized_read(o, eps / scale if fold_scale else eps, eps_mode)
    return o.to(v.dtype), _split(S, normalize, rule, feature_map, into=state if inplace else None)
