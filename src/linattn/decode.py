"""The one decode route of `linattn.step` and `Decoder`, following one plan from `linattn.backends.plan_step`
(made once per step, once per Decoder): `fast_step` (the plan's one compiled call for the plain CPU case, proven
from attribute reads before any check), else `full_step` on a prepared call: the plan's compiled step
(`linattn.backends.step`: numba or Triton) where its backend takes the checked tensors, else the rule's torch
``step``."""

from __future__ import annotations

import math

import torch
from torch.autograd.graph import increment_version
from torch.utils.weak import WeakIdKeyDictionary

from linattn import backends, checks
from linattn.backends import policy
from linattn.call import Call, prepare_step
from linattn.feature_maps import resolve_feature_map
from linattn.layout import features, group_heads, resolved, split_state, state_tensor, with_ones_column
from linattn.ops import DELTA_RULES, GATED_RULES, RULES
from linattn.ops.common import normalized_read
from linattn.state import State, record_mismatch

_F32, _BF16 = torch.float32, torch.bfloat16
_Tensor = torch.Tensor
_empty_like, _inference_mode = torch.empty_like, torch.is_inference_mode_enabled  # bound once: decode is hot


def trusted_state(S: torch.Tensor, z: torch.Tensor | None, rule: str, feature_map: str, normalized: bool) -> State:
    """A State from tensors this module just made in the layout ``State`` checks for (decode's fast path: the
    checks of ``State.__post_init__`` would cost more than the step's kernel)."""
    state = object.__new__(State)
    state.__dict__.update(S=S, z=z, rule=rule, feature_map=feature_map, normalized=normalized)
    return state


def plain_args(plan: backends.Plan, rule, feature_map, normalize, scale, eps, eps_mode) -> tuple | None:
    """The fixed arguments of a step as `fast_decode` takes them (the kernel module, the rule, the feature
    code and name, normalize, gated, delta, scale or None for the default, eps, clamp), or None when they are not the
    plain case: a plan that runs the CPU kernels, a rule, a built-in elementwise or L2 feature map, normalize a
    bool the rule allows (or None), a finite scale and eps as floats. Bad values are the full path's to name."""
    if plan.kernel != "cpu" or rule not in RULES:
        return None
    kd = plan.module
    code = kd.FEATURE_CODES.get(feature_map) if feature_map is None or type(feature_map) is str else None
    if code is None:
        return None
    delta = rule in DELTA_RULES
    if normalize is None:
        normalize = not delta
    elif not (normalize is False or (normalize is True and not delta)):
        return None  # not a bool, or a delta rule asked to normalize: the full path says why
    if not (type(eps) is float and 0.0 <= eps < math.inf and (eps_mode == "add" or eps_mode == "clamp")):
        return None
    if not (scale is None or (type(scale) is float and math.isfinite(scale))):
        return None
    return (kd, rule, code, feature_map or "identity", normalize, rule in GATED_RULES, delta, scale, eps,
            eps_mode == "clamp")


def fast_decode(fixed: tuple, q, k, v, g, beta, state, inplace: bool) -> tuple | None:
    """One decode step in one compiled call: ``(o, None)`` after updating ``state`` in place, ``(o, buf)`` with the
    new ``[B, HV, D, Dw]`` state buffer otherwise; or None (nothing written) when the call is not the plain case.

    The one proof of the plain case, shared by `step` and `Decoder`. At batch 1 the checks and the
    torch ops around a step cost as much as the step itself, so it proves with attribute reads only (each ~50 ns,
    where a torch op costs ~1 us, a function call ~100 ns: hence written out inline) that the call needs nothing
    the kernel lacks: q, k ``[B, Hq, D]``, v ``[B, HV, Dv]``, g and beta as the kernel reads them, all float32
    or bfloat16 (any mix: the kernel widens bfloat16 as it reads it) contiguous CPU tensors outside autograd with
    no negative views; a state whose record (if any) agrees with ``fixed`` (from `plain_args`) and whose S and z
    are the columns of one contiguous float32 buffer. o comes in v's dtype. Nothing is cached between calls:
    every fact is read again (a tensor's layout can change in place). A bad gate value is the kernel's to find
    (before it writes): then None, and the full path raises the error that names it."""
    kd, rule, code, fmap_name, normalize, gated, delta, scale, eps, clamp = fixed
    if not (type(q) is _Tensor and type(k) is _Tensor and type(v) is _Tensor and q.is_cpu and k.is_cpu and v.is_cpu
            and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
            and not (q.requires_grad or k.requires_grad or v.requires_grad or q.is_neg() or k.is_neg() or v.is_neg())):
        return None
    dtypes = 0  # the kernel's BF16_* bits: which inputs it widens from bfloat16 (float32 the fast test)
    if not (q.dtype is _F32 and k.dtype is _F32 and v.dtype is _F32):
        q_dtype, k_dtype, v_dtype = q.dtype, k.dtype, v.dtype
        if not ((q_dtype is _F32 or q_dtype is _BF16) and (k_dtype is _F32 or k_dtype is _BF16)
                and (v_dtype is _F32 or v_dtype is _BF16)):
            return None
        dtypes = (q_dtype is _BF16) | (k_dtype is _BF16) << 1 | (v_dtype is _BF16) << 2
    q_shape, v_shape = q.shape, v.shape
    if len(q_shape) != 3 or len(v_shape) != 3 or k.shape != q_shape:
        return None
    (B, Hq, D), (B_v, HV, Dv) = q_shape, v_shape
    if B_v != B or not (B and Hq and D and HV and Dv) or HV % Hq:
        return None
    # The gate width the kernel reads: 0 none, 1 one per head ([B, HV]), D one per key channel ([B, HV, D], Kimi
    # Delta's on the delta rule); beta [B, HV] for the delta rules.
    width = 0
    if gated:
        if not (type(g) is _Tensor and g.is_cpu and g.is_contiguous() and not g.requires_grad and not g.is_neg()):
            return None
        if g.dtype is not _F32:
            if g.dtype is not _BF16:
                return None
            dtypes |= 8  # BF16_G
        g_shape = g.shape
        if g_shape == (B, HV):
            width = 1
        elif g_shape == (B, HV, D):
            width = D
        else:
            return None
    elif g is not None:
        return None
    if delta:
        if not (type(beta) is _Tensor and beta.is_cpu and beta.is_contiguous()
                and not beta.requires_grad and beta.shape == (B, HV) and not beta.is_neg()):
            return None
        if beta.dtype is not _F32:
            if beta.dtype is not _BF16:
                return None
            dtypes |= 16  # BF16_BETA
    elif beta is not None:
        return None
    # The state: its record agrees, S [B, HV, D, Dv] the columns of one contiguous [B, HV, D, Dw] buffer, z
    # (normalized) its last column (and covering it: the kernel writes its last element).
    if type(state) is not State or record_mismatch(state, rule, fmap_name, normalize) is not None:
        return None
    S, z = state.S, state.z
    Dw = Dv + 1 if normalize else Dv
    if (type(S) is not _Tensor or S.dtype is not _F32 or not S.is_cpu or S.requires_grad or S.shape != (B, HV, D, Dv)
            or S.is_neg() or S.stride() != (HV * D * Dw, D * Dw, Dw, 1)):
        return None
    S_at = S.data_ptr()
    if normalize:
        if (type(z) is not _Tensor or z.dtype is not _F32 or z.requires_grad or z.data_ptr() != S_at + 4 * Dv
                or z.stride() != (HV * D * Dw, D * Dw, Dw) or z.shape != (B, HV, D) or z.is_neg()):
            return None
    elif z is not None:
        return None
    buf = None
    if inplace:
        if S.is_inference() and not _inference_mode():
            return None
        out = S_at
    else:  # the kernel reads the old state and writes the new one into a fresh buffer: no copy first
        buf = S.new_empty((B, HV, D, Dw))
        out = buf.data_ptr()
    o = _empty_like(v)  # v is [B, HV, Dv] contiguous: so is o, in v's dtype (whatever the default dtype or device)
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr() if gated else 0, beta.data_ptr() if delta else 0,
            S_at, out, o.data_ptr(), B, Hq, HV, D, Dv, width, code, clamp, normalize, delta,
            D**-0.5 if scale is None else scale, eps)
    entries = B * HV * D * Dw  # the policy's split threshold, read inline: decode is all overhead at batch 1
    if entries >= policy.DECODE_SPLIT_MIN_ENTRIES and (threads := backends.decode_threads(entries)) > 1:
        status = kd.decode_split(threads, *args, dtypes=dtypes)  # past the measured threshold: split over threads
    elif dtypes:
        status = kd.decode_bf16(*args[:18], dtypes, *args[18:])
    else:
        status = kd.decode(*args)
    if status != kd.OK:
        return None  # nothing was written; the full path raises the error that names the gate
    if inplace:
        # The kernel wrote through a raw pointer: tell autograd, so a graph that saved this state refuses to use
        # the overwritten values instead of computing a wrong gradient from them.
        increment_version(S)
    return o, buf


def fast_step(plan: backends.Plan, q, k, v, state, rule, feature_map, normalize, scale, eps, eps_mode, g, beta,
              state_dtype, inplace) -> tuple[torch.Tensor, State] | None:
    """The decode step of [`step`][linattn.step] in one compiled call (`fast_decode`) as ``plan`` allows, or None
    when the call is not the plain case (then the full path gives the result, or the error that names the
    argument)."""
    if not (inplace is True or inplace is False) or not (state_dtype is None or state_dtype is _F32):
        return None
    fixed = plain_args(plan, rule, feature_map, normalize, scale, eps, eps_mode)
    if fixed is None:
        return None
    done = fast_decode(fixed, q, k, v, g, beta, state, inplace)
    if done is None:
        return None
    o, buf = done
    fmap_name, normalize = fixed[3], fixed[4]
    if buf is None:  # in place: the caller's state, given the record it lacked (State.zeros, State(S, z))
        return o, (state if state.rule is not None else trusted_state(state.S, state.z, rule, fmap_name, normalize))
    if normalize:
        Dv = v.shape[-1]
        return o, trusted_state(buf[..., :Dv], buf[..., Dv], rule, fmap_name, True)
    return o, trusted_state(buf, None, rule, fmap_name, False)


def full_step(call: Call, plan: backends.Plan, q, k, v, g, beta, state: State | None,
             inplace: bool) -> tuple[torch.Tensor, State]:
    """A prepared decode step off the fast path, as ``plan`` (the step's, from `linattn.backends.plan_step`) says:
    its compiled step where the backend takes the checked tensors, else the rule's torch step."""
    dtype, normalize, H = call.dtype, call.normalize, call.HV
    qf, kf, scale = features(q.to(dtype), k.to(dtype), call.fmap, call.scale)
    qf, kf = group_heads(qf, H), group_heads(kf, H)
    # Decode is dominated by per-op overhead, so save one: with the normalizer, (s q)^T S / ((s q)^T z + eps)
    # equals q^T S / (q^T z + eps / s) for s > 0 (clamp alike), and the scale moves into eps.
    fold_scale = normalize and scale > 0
    if not fold_scale:
        qf = qf * scale
    eps = call.eps / scale if fold_scale else call.eps
    if state is None:
        state = State.zeros(call.B, H, call.r, call.Dv, normalizer=normalize, dtype=dtype, device=q.device)
    S = state_tensor(state, normalize, dtype)
    into = state if inplace else None
    fast = backends.step(plan, rule=call.rule, q=qf, k=kf, v=v, g=g, beta=beta, state=S, normalize=normalize,
                         eps=eps, eps_mode=call.eps_mode, inplace=inplace)
    if fast is not None:
        return fast[0], split_state(fast[1], normalize, call.rule, call.feature_map, into=into)
    vv = with_ones_column(v.to(dtype)) if normalize else v.to(dtype)
    o, S = call.ops.step(qf, kf, vv, g=None if g is None else g.to(dtype),
                         beta=None if beta is None else beta.to(dtype), state=S, inplace=inplace)
    if normalize:
        o = normalized_read(o, eps, call.eps_mode)
    return o.to(v.dtype), split_state(S, normalize, call.rule, call.feature_map, into=into)


class Decoder:
    """A prepared decode loop: the arguments that stay fixed over a generation are checked once, here; each call
    checks only what can change (shapes, dtypes, devices and layouts of q, k, v, g, beta and the state; the gate
    and beta values) and updates `state` in place.

    ``dec = linattn.Decoder(state, rule=..., feature_map=None, scale=None, normalize=None, eps=1e-6,
    eps_mode="add", backend="auto")``; ``o = dec(q, k, v, g=None, beta=None)`` with the shapes of
    [`linattn.step`][linattn.step] returns ``o [B, HV, Dv]``, as ``linattn.step(q, k, v, dec.state, ..., inplace=True)``
    would, and raises the same errors for bad input. ``state`` must be a [`State`][linattn.State] that an in-place
    step can update (e.g. from ``State.zeros`` or a prefill); its dtype is the accumulation dtype. The plain case
    (float32 or bfloat16 CPU tensors in any mix, a built-in elementwise or L2 feature map, the state float32 in
    linattn's own layout) runs one compiled call, which widens bfloat16 as it reads it and writes ``o`` in
    ``v.dtype`` (rounded once from float32, as torch's cast); anything else runs [`linattn.step`][linattn.step]'s
    full path. Which backend runs is planned once, here (`linattn.backends.plan_step`); a Decoder is made and
    called outside ``torch.func`` transforms (a ``ValueError`` says so: it updates its state in place).
    """

    def __init__(self, state: State, *, rule: str = "accumulate", feature_map=None, scale: float | None = None,
                 normalize: bool | None = None, eps: float = 1e-6, eps_mode: str = "add", backend: str = "auto"):
        checks.rule_module(rule)
        checks.check_backend(backend)
        checks.check_scalars(eps, eps_mode, scale)
        normalize = checks.resolve_normalize(rule, normalize)
        resolve_feature_map(feature_map)
        if not isinstance(state, State):
            raise TypeError(f"state must be a linattn.State, got {type(state).__name__} (State.zeros(...) makes one)")
        B, H, Dk, Dv = state.S.shape
        checks.check_state(state, B, H, Dk, Dv, normalize, state.device, name="state", rule=rule,
                           feature_map=feature_map)
        checks.check_inplace(state, normalize, state.dtype)
        if backends.functorch_active():
            raise _transform_error("made")
        self.state = state
        self.rule, self.feature_map, self.normalize, self.backend = rule, feature_map, normalize, backend
        self.scale, self.eps, self.eps_mode = scale, eps, eps_mode
        # The one plan of every call (its backend, the policy, the state's device: all fixed here), and the fixed
        # arguments of its one compiled call (None: every call takes the full path).
        self._plan = backends.plan_step(backend, state.S)
        self._fixed = plain_args(self._plan, rule, feature_map, normalize,
                                 Dk**-0.5 if scale is None else float(scale),
                                 float(eps), eps_mode)  # the default scale resolved here: D is the state's Dk

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None,
                 beta: torch.Tensor | None = None) -> torch.Tensor:
        """One token: write it into `state` (in place), then read it with the query.

        Args:
            q: query ``[B, H, D]``, before the feature map.
            k: key, the shape of ``q``.
            v: value ``[B, HV, Dv]`` (HV a multiple of H: grouped value heads).
            g: log-gate ``[B, HV]`` (or ``[B, HV, r]`` per key channel) for the gated rules, else None.
            beta: write strength ``[B, HV]`` for the delta rules, else None.

        Returns:
            o: ``[B, HV, Dv]`` in ``v.dtype``, as ``linattn.step(q, k, v, dec.state, ..., inplace=True)`` returns.
        """
        if backends.functorch_active():  # (the plan was made outside transforms: it holds while none runs)
            raise _transform_error("called")
        fixed = self._fixed
        if fixed is not None:
            done = fast_decode(fixed, q, k, v, g, beta, self.state, True)  # the state is read each call
            if done is not None:
                return done[0]
        q, k, v, g, beta = map(resolved, (q, k, v, g, beta))  # negative views as their values
        call = prepare_step(q, k, v, self.state, rule=self.rule, feature_map=self.feature_map,
                            normalize=self.normalize, scale=self.scale, eps=self.eps, eps_mode=self.eps_mode, g=g,
                            beta=beta, state_dtype=None, inplace=True, backend=self.backend)
        o, self.state = full_step(call, self._plan, q, k, v, g, beta, self.state, True)
        return o


def _transform_error(what: str) -> ValueError:
    return ValueError(
        f"Decoder: {what} under a torch.func transform (vmap, grad, ...); a Decoder updates its state in place, "
        "which a transform can neither batch nor differentiate: inside the transform call "
        "linattn.step(q, k, v, state, ..., inplace=False)"
    )


# The prepared decode loop kept for each object that holds a state across steps (HF's state tensor, nn's cache):
# (the Decoder's fixed arguments, the Decoder). Weak: an entry goes with its holder, which the Decoder never holds.
DECODERS = WeakIdKeyDictionary()


def decoder_for(holder, state: State | torch.Tensor, **fixed) -> Decoder:
    """The [`Decoder`][linattn.Decoder] kept for ``holder`` when it was made with these ``fixed`` keyword arguments and
    updates ``state``: the same `State` object, or, for a bare tensor S (a state with no normalizer and no
    record), the same memory (address, shape, strides: not re-pointed by ``set_``, ``resize_``), writable now (not
    an inference tensor outside inference mode). Else a new ``Decoder(state, **fixed)`` (for a tensor, of
    ``State(S.detach())``: an alias that does not keep ``holder`` alive), kept for ``holder`` (any object a weak
    reference holds, compared by identity). Raises what `Decoder` raises (a ValueError where an in-place
    step refuses the state's memory)."""
    held = DECODERS.get(holder)
    if held is not None and held[0] == fixed:
        dec = held[1]
        mine = dec.state
        if mine is state or (type(state) is _Tensor and type(mine) is State and mine.S.data_ptr() == state.data_ptr()
                             and mine.S.shape == state.shape and mine.S.stride() == state.stride()):
            S = mine.S
            if not S.is_inference() or torch.is_inference_mode_enabled():
                return dec
    dec = Decoder(State(state.detach()) if isinstance(state, torch.Tensor) else state, **fixed)
    DECODERS[holder] = (fixed, dec)
    return dec
