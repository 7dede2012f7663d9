"""Every argument check of the public calls, in one place: each raises a ``TypeError``/``ValueError`` that names the
argument and says what was wrong, before any work is done.

`linattn.call` runs these checks in order to build one `linattn.call.Call`; the nn layers and the
HF integration run the ones that concern their own constructor arguments up front. Nothing here computes.
"""

from __future__ import annotations

import math
import sys
import warnings
from types import ModuleType

import torch

from linattn import buffers
from linattn.feature_maps import feature_map_name
from linattn.ops import DELTA_RULES, EPS_MODES, GATED_RULES, RULES, accumulate, delta, gated, gated_delta
from linattn.state import State, is_joint, record_mismatch

BACKENDS = ("auto", "torch", "cpu", "triton")
# The rule table: each rule's module holds its forms (``FORMS``) and its decode ``step``.
RULE_MODULES: dict[str, ModuleType] = {
    "accumulate": accumulate, "gated": gated, "delta": delta, "gated_delta": gated_delta,
}


def rule_module(rule: object) -> ModuleType:
    if not isinstance(rule, str):
        raise TypeError(f"rule must be a str, one of {', '.join(RULES)}; got {type(rule).__name__}")
    if rule not in RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; expected one of {', '.join(RULES)}")
    return RULE_MODULES[rule]


def check_form(mod: ModuleType, rule: str, form: object) -> None:
    if not isinstance(form, str):
        raise TypeError(f"form must be a str, one of {', '.join(mod.FORMS)}; got {type(form).__name__}")
    if form not in mod.FORMS:
        raise ValueError(f"form: rule {rule!r} has no form {form!r}; supported forms: {', '.join(mod.FORMS)}")


def check_backend(backend: object) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return backend


def check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__}")


LAYOUT_WARN_HEADS = 128  # more heads than published models use (DeepSeek-V3 has 128)


def warn_layout(q: torch.Tensor) -> None:
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
            stacklevel=4,
        )


def check_dense(name: str, x: torch.Tensor) -> None:
    """Sparse (COO, CSR, ...) and other non-strided tensors have no per-element memory the forms can index."""
    if x.layout != torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {x.layout}; pass {name}.to_dense()")


def check_tensor(name: str, x: object, ndim: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    check_dense(name, x)
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def check_qkv(q, k, v, token_dims: int) -> None:
    """Shapes, dtypes and devices of q, k, v. ``token_dims`` is 4 for [B,T,H,D] and 3 for one token [B,H,D]."""
    layout = "[B, T, H, D]" if token_dims == 4 else "[B, H, D]"
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, token_dims, layout)
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


_WRAPPED = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)  # no public query


def functorch_wrapped(x: torch.Tensor) -> bool:
    """Whether ``x`` is a torch.func transform's wrapper (vmap's batched tensor, grad's tracking tensor): it has no
    memory of its own, and under vmap its values cannot steer Python control flow."""
    return _WRAPPED is not None and bool(_WRAPPED(x))


def _all_nonpositive(g: torch.Tensor) -> bool:
    """Whether every entry of g is <= 0 (False where one is NaN); True for a gate that ``torch.func.vmap`` batches,
    whose values cannot be read into Python (vmap raises on data-dependent control flow), so the check is skipped
    there. A float32 or float64 CPU tensor is read through NumPy, on one thread: a torch reduction of a long
    sequence's gates wakes torch's OpenMP threads, which then spin on the cores that the compiled kernel's threads
    start on next (a gated-delta prefill at T = 8192, H = 8 took 0.76x-0.80x of its time at 2 threads;
    benchmarks/results/gate_check_ab_cpu.txt)."""
    if functorch_wrapped(g):  # a torch.func wrapper has no memory to view: torch reduces it, where vmap allows
        try:
            return bool((g <= 0).all())
        except RuntimeError:  # vmap's batched values (raised at bool())
            return True
    if type(g) is torch.Tensor and g.is_cpu and g.dtype in (torch.float32, torch.float64) and (
            g.layout == torch.strided):
        return bool(buffers.readable(g).max() <= 0)  # NaN is the max of an array that holds one: False
    return bool((g <= 0).all())  # a subclass (fake, meta-like), another dtype or device: torch's own


def check_gate_and_beta(rule, g, beta, lead: tuple[int, ...], feature_dim: int, device) -> None:
    """``lead`` is (B, T, H) for sequences, (B, H) for one token."""
    lead_s = ", ".join(map(str, lead))
    if rule in GATED_RULES:
        if g is None:
            raise ValueError(f"g: rule {rule!r} needs a log-gate g (alpha = exp(g), g <= 0)")
        ok = (tuple(lead), (*lead, feature_dim))  # one gate per head, or per key channel (GLA, KDA)
        if not isinstance(g, torch.Tensor):
            raise TypeError(f"g must be a torch.Tensor, got {type(g).__name__}")
        check_dense("g", g)
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
        if g.numel() and not _all_nonpositive(g):
            bad = "NaN" if bool(g.isnan().any()) else f"largest value {g.max().item():.4g}"
            raise ValueError(f"g must be <= 0 (alpha = exp(g) <= 1); it holds {bad}")
    elif g is not None:
        raise ValueError(f"g: rule {rule!r} has no gate; use rule='gated' or 'gated_delta', or pass g=None")
    if rule in DELTA_RULES:
        if beta is None:
            raise ValueError(f"beta: rule {rule!r} needs a write strength beta of shape [{lead_s}]")
        if not isinstance(beta, torch.Tensor):
            raise TypeError(f"beta must be a torch.Tensor, got {type(beta).__name__}")
        check_dense("beta", beta)
        if tuple(beta.shape) != tuple(lead):
            raise ValueError(f"beta must have shape [{lead_s}], got {tuple(beta.shape)}")
        if not beta.is_floating_point():
            raise TypeError(f"beta must be a floating-point tensor, got {beta.dtype}")
        if beta.device != device:
            raise ValueError(f"beta is on {beta.device} but q is on {device}")
    elif beta is not None:
        raise ValueError(f"beta: rule {rule!r} has no write strength; use rule='delta' or 'gated_delta'")


def resolve_normalize(rule: str, normalize: object) -> bool:
    if normalize is None:
        return rule not in DELTA_RULES
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool or None, got {type(normalize).__name__}")
    if normalize and rule in DELTA_RULES:
        raise ValueError(f"normalize=True: rule {rule!r} defines no normalizer z; pass normalize=False or None")
    return normalize


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int too large for a float
        return False


def check_scalars(eps: object, eps_mode: object, scale: object) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps >= 0 and _finite(eps)):
        raise ValueError(f"eps must be a number >= 0 and finite, got {eps!r}")
    if not isinstance(eps_mode, str):
        raise TypeError(f"eps_mode must be a str, one of {', '.join(EPS_MODES)}; got {type(eps_mode).__name__}")
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: unknown mode {eps_mode!r}; expected one of {', '.join(EPS_MODES)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if scale is not None and not _finite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")


def check_chunk_size(chunk_size: object) -> int:
    # Any size from 1 up to the largest tensor size torch can index; larger than T means one chunk of T tokens.
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be a positive int, got {type(chunk_size).__name__} {chunk_size!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size}")
    if chunk_size > sys.maxsize:
        raise ValueError(f"chunk_size must be at most 2**63 - 1 (the largest size torch indexes), got {chunk_size}")
    return chunk_size


def compute_dtype(x_dtype: torch.dtype, state_dtype: object) -> torch.dtype:
    """The accumulation dtype: ``state_dtype`` if given, else float32 (float64 for float64 inputs)."""
    if state_dtype is not None:
        if not isinstance(state_dtype, torch.dtype) or not state_dtype.is_floating_point:
            raise TypeError(
                f"state_dtype must be a floating torch.dtype, got {state_dtype!r} (with state_dtype=None, step "
                "takes the state's dtype)"
            )
        return state_dtype
    return torch.float64 if x_dtype == torch.float64 else torch.float32


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
    cu = cu_seqlens.to(device=device if device.type != "meta" else "cpu", dtype=torch.int64)
    ends = cu[[0, -1]].tolist()
    if ends != [0, T]:
        raise ValueError(f"cu_seqlens must start at 0 and end at T = {T}, got {ends[0]} ... {ends[1]}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must be nondecreasing, got {cu.tolist()}")
    return cu  # on q's device; on the CPU for meta tensors (shapes only), where the boundaries are still read


_UNSET = object()


def check_state(
    state, B, H, Dk, Dv, normalize: bool, device, name: str = "initial_state", *, rule: str | None = None,
    feature_map=_UNSET, d_in: int | None = None,
) -> None:
    """``state`` fits this call: its record (if any) names this rule and feature map, its shape the feature width.
    (``rule``, ``feature_map``: the call's, to compare with the record; ``d_in``: q's width, to explain widths.)"""
    if not isinstance(state, State):
        raise TypeError(f"{name} must be a linattn.State or None, got {type(state).__name__}")
    fmap_name = None if feature_map is _UNSET else feature_map_name(feature_map)
    mismatch = record_mismatch(state, rule, fmap_name)
    if mismatch == "rule":
        raise ValueError(
            f"{name} was made by rule {state.rule!r} but this call uses rule={rule!r}; a state continues only the "
            "rule that made it (to carry it over on purpose, pass State(state.S, state.z))"
        )
    if mismatch == "feature_map":
        raise ValueError(
            f"{name} was made with feature_map {state.feature_map!r} but this call uses {fmap_name!r}; its keys "
            "live in that map's feature space"
        )
    if not state.S.is_floating_point():  # State checks this when made; S may have been replaced since
        raise TypeError(f"{name}.S must be a real floating-point tensor, got {state.S.dtype}")
    check_dense(f"{name}.S", state.S)
    if state.z is not None:
        check_dense(f"{name}.z", state.z)
    if 0 in state.S.shape:  # as q, k, v: an empty batch, head or width holds nothing to decode
        raise ValueError(f"{name}.S must have no empty dimension, got shape {tuple(state.S.shape)}")
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


def check_inplace_inputs(**tensors) -> None:
    """``step(inplace=True)`` (and every `linattn.Decoder` call) records no autograd graph: an input that
    requires grad while grad mode is on is refused, before anything is written. (Left to run, the update would
    overwrite a state the delta rules' backward needs, and a k or v requiring grad would make the caller's state
    require grad, which the next in-place step refuses.)"""
    if not torch.is_grad_enabled():
        return
    for name, x in tensors.items():
        if x is not None and x.requires_grad:
            raise ValueError(
                f"inplace=True: {name} requires grad, but an in-place decode step records no gradient; decode "
                f"under torch.no_grad() (or pass {name}.detach()), or pass inplace=False to keep the graph"
            )


def check_inplace_batched(state: State, **tensors) -> None:
    """Under ``torch.func.vmap``, ``step(inplace=True)`` can write only into a state vmap batches too: a batched
    input with an unbatched state is refused, by name, instead of torch's in-place error."""
    if functorch_wrapped(state.S):
        return
    for name, x in tensors.items():
        if x is not None and functorch_wrapped(x):
            raise ValueError(
                f"inplace=True: {name} is batched by torch.func.vmap but the state is not, so one state cannot take "
                "the batch's updates; pass inplace=False inside vmap"
            )


def check_inplace(state: State, normalize: bool, dtype: torch.dtype) -> None:
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
