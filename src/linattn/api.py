"""The public torch API: `linear_attention` for whole sequences, `step` for one-token decode, `plan` for which
backend would run either and why.

Both turn their arguments into one validated `linattn.call.Call` (`linattn.call`, through
`linattn.checks`), then hand it on: to `linattn.prefill` for a sequence, `linattn.packing`
for packed sequences, the decode route below for a step. Every form of every rule shares this one signature and
these defaults. ``import linattn`` loads no compiled kernel (numba and Triton load on first use).
"""

from __future__ import annotations

import inspect

import torch

from linattn import backends, decode
from linattn.call import prepare, prepare_step
from linattn.checks import rule_module
from linattn.feature_maps import FeatureMap
from linattn.layout import features, group_heads, resolved, split_state, state_tensor, zero_state
from linattn.ops import DELTA_RULES, EPS_MODES, GATED_RULES, RULES
from linattn.packing import compute_packed
from linattn.prefill import compute
from linattn.state import State

__all__ = ["DELTA_RULES", "EPS_MODES", "GATED_RULES", "RULES", "linear_attention", "plan", "step",
           "supported_forms"]


def supported_forms(rule: str) -> tuple[str, ...]:
    """Names of the execution forms a rule has, e.g. ``supported_forms("delta") == ("recurrent", "chunk")``."""
    return tuple(rule_module(rule).FORMS)


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

    Shapes: ``q, k [B, T, H, D]``, ``v [B, T, HV, Dv]``, output ``o [B, T, HV, Dv]`` in ``v.dtype``. ``HV`` is
    ``H`` or a multiple of it (grouped value heads, as in flash-linear-attention and Qwen3-Next): q/k head ``h``
    serves value heads ``h * HV/H`` to ``(h + 1) * HV/H - 1`` (``repeat_interleave``); ``g``, ``beta`` and the
    state have ``HV`` heads.

    Args:
        q: queries ``[B, T, H, D]``, before the feature map.
        k: keys, the shape of ``q``.
        v: values ``[B, T, HV, Dv]``.
        rule: ``"accumulate"`` S_t = S_{t-1} + k v^T; ``"gated"`` S_t = a_t S_{t-1} + k v^T (``a = exp(g)``, per head
            or per key channel); ``"delta"`` S_t = S_{t-1} + beta k (v - S^T k)^T; ``"gated_delta"``
            S_t = a_t (I - beta k k^T) S_{t-1} + beta k v^T (gate before the prediction, as in Gated DeltaNet).
            The output reads the state after the write: o_t = S_t^T q_t (divided by q_t^T z_t if normalized).
        form: ``"recurrent"`` (token loop, the semantics), ``"chunk"`` (default; matmuls inside chunks, state carried
            between them; the training path), ``"parallel"`` (dense masked T x T; accumulate, gated), ``"scan"``
            (log-depth associative scan; accumulate, gated). `supported_forms` lists them per rule.
        feature_map: ``None`` (q, k are features already), ``"relu1"``, ``"elu1"``, ``"identity"``, ``"l2"``
            (x / |x|, as fla and Qwen3-Next normalize q and k), ``"taylor2"`` (Based, width 1 + D + D^2) or a
            callable ``[..., D] -> [..., r]``.
        normalize: divide by q^T z. ``None`` (default) means the rule's own definition: ``True`` for accumulate and
            gated, ``False`` for the delta rules (which define no z; ``True`` there is an error).
        scale: multiplies the query features; default ``r ** -0.5`` with r the feature width (as in
            flash-linear-attention). With ``normalize`` it cancels except against ``eps``.
        eps: the denominator's guard, ``den + eps`` or ``max(den, eps)`` (see ``eps_mode``); ``eps=0`` divides
            exactly. Used only when normalized, the same way in every form.
        eps_mode: ``"add"`` (default) divides by ``den + eps``, ``"clamp"`` by ``max(den, eps)``.
        g: log-gate (``g <= 0``), ``[B, T, HV]`` or per key channel ``[B, T, HV, r]`` (GLA; for ``"gated_delta"``
            Kimi Delta Attention, S_t = (I - beta k k^T) diag(a_t) S_{t-1} + beta k v^T). Gated rules only.
        beta: write strength ``[B, T, HV]`` for the delta rules. The write converges for ``0 < beta |k|^2 < 2``.
        initial_state: a [`State`][linattn.State] with ``S [B, HV, r, Dv]`` (and ``z [B, HV, r]`` when normalized).
        output_final_state: return the state after the last token (else ``None``).
        chunk_size: tokens per chunk in the ``"chunk"`` form (any T works, the last chunk may be shorter).
        state_dtype: accumulation dtype; default float32, or float64 when the inputs are float64.
        cu_seqlens: packed sequences (as flash-linear-attention and FlashAttention): an int tensor ``[N + 1]``,
            0 ... T nondecreasing, with ``B = 1``; sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``. Nothing
            crosses a boundary; ``initial_state`` and the final state have N entries (a zero-length sequence passes
            its initial state through). See `linattn.packing`.
        backend: ``"auto"`` (default: the compiled CPU kernel where it covers the call and was measured faster,
            else the torch forms; on CUDA the torch forms, the Triton kernels only when forced), ``"torch"``
            (PyTorch operations, any device: every rule in every form, forward, backward and double backward),
            ``"cpu"`` (the compiled numba token loops, float32 state on CPU tensors: every rule's forward, decode
            step and backward; a double backward recomputes in the torch forms) or ``"triton"`` (the Triton
            kernels: every rule's chunk forward and backward and the decode step; CUDA, or CPU under
            ``TRITON_INTERPRET=1``). A forced backend that cannot run the call is a ``ValueError`` naming the
            reason. See `linattn.backends`.

    A log-gate of ``-inf`` is an exact reset (the state before it is forgotten, in every form); NaN in ``g`` is an
    error. Any other NaN or Inf input is neither masked nor raised: it reaches the state and every later output, and in
    the matmul forms also the other outputs of its chunk (``"chunk"``) or of the whole sequence (``"parallel"``),
    since a masked product still computes 0 * NaN. Returns ``(o, final_state)``, ``o`` contiguous.
    """
    q, k, v, g, beta = map(resolved, (q, k, v, g, beta))  # negative views as their values (kernels read memory)
    call = prepare(q, k, v, rule=rule, form=form, feature_map=feature_map, normalize=normalize, scale=scale,
                   eps=eps, eps_mode=eps_mode, g=g, beta=beta, initial_state=initial_state,
                   output_final_state=output_final_state, chunk_size=chunk_size, state_dtype=state_dtype,
                   cu_seqlens=cu_seqlens, backend=backend)
    if call.cu_seqlens is not None:
        return compute_packed(call, q, k, v, g, beta, initial_state)
    if initial_state is None:
        S = zero_state(call.B, call.HV, call.r, call.Dv, call.normalize, call.dtype, q.device)
    else:
        S = state_tensor(initial_state, call.normalize, call.dtype)
    o, S = compute(call, q, k, v, g, beta, S)
    return o, (split_state(S, call.normalize, rule, feature_map) if output_final_state else None)


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

    Shapes: ``q, k [B, H, D]``, ``v [B, HV, Dv]``, ``g [B, HV]`` (or ``[B, HV, r]`` per key channel),
    ``beta [B, HV]`` (HV a multiple of H: grouped value heads, see [`linear_attention`][linattn.linear_attention]);
    returns ``o [B, HV, Dv]`` and the new [`State`][linattn.State]. Arguments mean what they mean in
    [`linear_attention`][linattn.linear_attention], which this agrees with token by token (prefill there, decode here).
    ``state=None`` starts from zeros. ``inplace=True`` updates the state's memory instead of allocating a new
    one (no autograd through it: an input that requires grad is refused while grad is on); the state must then
    already be in the accumulation dtype.
    ``backend`` as in `linear_attention` (``"auto"`` takes the fused compiled step on CPU when it can: a float32
    state and float32 or bfloat16 tokens in any mix, bfloat16 widened as the kernel reads it; ``o`` is in
    ``v.dtype`` either way, the float32 result rounded once as torch's cast rounds it).
    Under ``torch.func.vmap`` the torch step runs and the gate's values are not checked (``g <= 0``: a batched
    tensor's values cannot be read into Python); ``inplace=True`` there needs a state that vmap batches too.
    """
    plan = backends.plan_step(backend, q)  # decided once: the fast path and the full path both follow it
    fast = decode.fast_step(plan, q, k, v, state, rule, feature_map, normalize, scale, eps, eps_mode, g, beta,
                            state_dtype, inplace)
    if fast is not None:
        return fast
    q, k, v, g, beta = map(resolved, (q, k, v, g, beta))  # negative views as their values (kernels read memory)
    call = prepare_step(q, k, v, state, rule=rule, feature_map=feature_map, normalize=normalize, scale=scale, eps=eps,
                        eps_mode=eps_mode, g=g, beta=beta, state_dtype=state_dtype, inplace=inplace, backend=backend)
    return decode.full_step(call, plan, q, k, v, g, beta, state, inplace)


def plan(fn, /, *args, **kwargs) -> backends.Plan:
    """Which backend would run ``fn(*args, **kwargs)``, and why, without running it.

    ``fn`` is [`linear_attention`][linattn.linear_attention] or [`step`][linattn.step]; ``args`` and ``kwargs`` are
    that function's own arguments, with its defaults and shape contract (``q, k [B, T, H, D]`` for a whole sequence,
    ``[B, H, D]`` for one token, and so on). They are checked as the call would check them; nothing is computed
    and no state is written (only the feature map runs, on one token, as the call's checks run it).

    Example: ``linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g)`` gives
    ``Plan(kernel='cpu', why='the numba kernels take the call', ...)`` for float32 CPU tensors.

    Returns:
        A [`Plan`][linattn.backends.Plan]: ``plan.runs`` is ``"cpu"`` (the numba kernels), ``"triton"`` or
        ``"torch"`` (the readable torch forms); ``plan.why`` says what decided it, in words (the policy's rule
        under ``backend="auto"``, or what the compiled kernels cannot take); ``str(plan)`` gives both. A step on
        ``"cpu"`` runs its one-call kernel where the inputs are the plain case (float32 contiguous tensors, a
        built-in feature map, the state in linattn's layout), else the numba token loop's step.

    Raises:
        ValueError: what ``fn`` raises for a bad value, and a forced ``backend`` that cannot take the call (naming
            the reason).
        TypeError: what ``fn`` raises for a bad type, and ``fn`` neither function.
    """
    if fn is not linear_attention and fn is not step:
        raise TypeError(f"fn must be linattn.linear_attention or linattn.step, got {fn!r}")
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    q, k, v, g, beta = (resolved(a.pop(name)) for name in ("q", "k", "v", "g", "beta"))
    if fn is linear_attention:
        call = prepare(q, k, v, g=g, beta=beta, **a)
        kw = dict(rule=call.rule, form=call.form, q=q, k=k, v=v, g=g, beta=beta, state=_state_like(call.N, call,
                  q.device), grad=call.grad, chunk_size=call.chunk_size,
                  plain=call.fmap is None and not call.normalize)
        plan = backends.plan_prefill(call.backend, cu_seqlens=call.cu_seqlens, **kw)
        if call.cu_seqlens is None or plan.kernel is not None:
            return plan
        # Packed tokens no kernel takes as they lie run as padded segments (`linattn.packing`), each planned alone.
        seg = backends.plan_prefill(call.backend, **kw)
        return seg if seg.kernel is None else backends.Plan(seg.kernel, f"{plan.why} ({seg.why})", seg.module,
                                                            seg.backend)
    plan = backends.plan_step(a["backend"], q)
    state = a.pop("state")
    call = prepare_step(q, k, v, state, g=g, beta=beta, **a)
    qf, kf, _ = features(q.to(call.dtype), k.to(call.dtype), call.fmap, call.scale)  # what the step hands on
    return backends.settle(plan, rule=call.rule, q=group_heads(qf, call.HV), k=group_heads(kf, call.HV), v=v, g=g,
                           beta=beta, state=_state_like(call.B, call, q.device))


def _state_like(N: int, call, device: torch.device) -> torch.Tensor:
    """A stand-in for the call's augmented state ``[N, HV, r, Dv(+1)]`` (its dtype, device and shape, no memory
    of its own): what the plans read of a state."""
    return torch.zeros((), dtype=call.dtype, device=device).expand(N, call.HV, call.r, call.Dv + call.normalize)
