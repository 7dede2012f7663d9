"""Compiled backends behind :func:`linattn.linear_attention` and :func:`linattn.step`, chosen by one dispatch.

``backend="torch"`` always runs the readable torch forms in :mod:`linattn.ops`. ``backend="cpu"`` runs the fused
numba token loop (:mod:`linattn.kernels.cpu_numba`) and raises a ``ValueError`` for inputs it does not cover.
``backend="auto"`` (the default) takes a compiled kernel only where one covers the call and was measured faster
(docs/perf.md), and the torch form otherwise: numba on CPU; Triton only when forced, until a GPU run measures it.
``backend="triton"`` forces the Triton kernels (:mod:`linattn.kernels.triton`; CUDA, or CPU tensors under
``TRITON_INTERPRET=1``) and raises a ``ValueError`` naming the reason where they cannot run.

The compiled CPU prefill runs from a float32 state on CPU tensors, with grouped value heads, per-channel gates on
every gated rule (Kimi Delta Attention on gated_delta) and packed sequences (``cu_seqlens``, one state per
sequence, no padding). It has a compiled backward (reverse-time token loop from state checkpoints): "cpu" takes it
whenever inputs require grad, "auto" only for the rules in ``AUTO_BACKWARD_RULES`` (measured faster). Another state
dtype, a device other than the CPU, or an argument the kernel does not know runs the torch form; so does
autograd through the decode step. If numba is missing or fails to load, "cpu" and "auto" run the torch form after
one warning.

Each entry point returns ``None`` when the torch form should run, so the caller keeps its own path unchanged.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

import numpy as np
import torch

BACKENDS = ("auto", "torch", "cpu", "triton")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # converted to float32 once, on the way in
# "auto" uses the compiled kernels for these forms ("step" is decode); the others (parallel, scan) are asked for
# by name to study them, so they keep their torch form. Tests of the torch forms empty this tuple.
AUTO_FORMS = ("chunk", "recurrent", "step")


def check_backend(backend: object) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: unknown backend {backend!r}; expected one of {list(BACKENDS)}")
    return backend


_cpu_module = None
_cpu_failed: str | None = None


def _load_cpu():
    """The numba module, or None (after one warning per process) when it cannot be imported."""
    global _cpu_module, _cpu_failed
    if _cpu_module is None and _cpu_failed is None:
        try:
            cpu_numba = importlib.import_module("linattn.kernels.cpu_numba")
        except Exception as exc:  # ImportError, or a numba/llvmlite that fails to initialize
            _cpu_failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"linattn: compiled CPU kernels unavailable ({_cpu_failed}); using the torch forms",
                          RuntimeWarning, stacklevel=4)
        else:
            _cpu_module = cpu_numba
    return _cpu_module


def _cpu_refusal(rule: str, tensors: tuple, state: torch.Tensor, grad: bool, extra: dict | None = None) -> str | None:
    """Why the CPU kernel cannot take this call, or None when it can. ``tensors`` is (q, k, v, g, beta); ``grad``:
    the call needs a backward the kernel lacks (the decode step has none; prefill has one).

    Inputs the kernel does not know (passed through ``extra``) go to the torch forms.
    """
    unknown = [name for name, x in (extra or {}).items() if x is not None]
    if unknown:
        return f"it does not take {', '.join(unknown)}"
    if grad:
        return "it has no backward (inputs require grad)"
    if state.device.type != "cpu" or any(t is not None and t.device.type != "cpu" for t in tensors):
        return "it runs on CPU tensors only"
    if state.dtype != torch.float32:
        return f"it keeps a float32 state, got state dtype {state.dtype}"
    if any(t is not None and t.dtype not in INPUT_DTYPES for t in tensors):
        return f"it takes {[str(d) for d in INPUT_DTYPES]} inputs"
    return None


def _triton_refusal(rule: str, tensors: tuple, state: torch.Tensor, grad: bool | None, extra: dict | None,
                    chunk_size: int | None = None):
    """(Triton module, None) when the Triton kernels can take this call, else (None, why). ``grad`` None: autograd
    is fine (the chunk kernels have a backward); True: refused (the decode step has none). ``chunk_size``: the
    whole-sequence call's (None for a decode step)."""
    q, _, v, g, _ = tensors
    unknown = [name for name, x in (extra or {}).items() if x is not None]
    if unknown:
        return None, f"it does not take {', '.join(unknown)}"
    if v.shape[-2] != q.shape[-2]:
        return None, "it needs as many value heads as query heads"
    if g is not None and rule in ("delta", "gated_delta") and g.dim() == q.dim():
        return None, "its delta rules take one gate per head"
    if grad:
        return None, "its decode step has no backward (inputs require grad)"
    try:
        kt = importlib.import_module("linattn.kernels.triton")
    except Exception as exc:  # triton missing or failing to load
        return None, f"triton is unavailable ({type(exc).__name__}: {exc})"
    why = kt.refusal(q, state, state.shape[-2], chunk_size)
    return (kt, None) if why is None else (None, why)


def _use_triton(backend: str, q: torch.Tensor, tensors: tuple, rule: str, state, grad, extra, chunk_size=None):
    """The Triton module when it should run this call, None for the other paths; a forced "triton" that cannot
    run is an error. "auto" asks Triton only for CUDA tensors."""
    if backend != "triton":  # opt-in until a GPU run has measured the kernels (scripts/gpu_check.sh)
        return None
    kt, why = _triton_refusal(rule, tensors, state, grad, extra, chunk_size)
    if kt is None and backend == "triton":
        raise ValueError(f"backend='triton' cannot run this call: {why}; use backend='auto' or 'torch'")
    return kt


_decode_module = None


def decode_kernel(backend: str):
    """:mod:`linattn.kernels.cpu_decode` when ``backend`` lets the decode step run compiled on the CPU, else None.

    ``linattn.step`` asks this first and proves the rest (shapes, layouts, the state's record) itself; any call
    that is not the plain case runs through :func:`step` below."""
    global _decode_module
    if backend == "cpu" or (backend == "auto" and "step" in AUTO_FORMS):
        if _decode_module is None and _load_cpu() is not None:
            _decode_module = importlib.import_module("linattn.kernels.cpu_decode")
        return _decode_module
    return None


def _functorch_active() -> bool:
    """Whether a torch.func transform is running (torch has no public query for it; False where it lacks one)."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else False


def _resolve(backend: str, refusal: str | None, form_ok: bool) -> bool:
    """True when the compiled kernel should run. A forced "cpu" that cannot take the call is an error."""
    if backend == "torch":
        return False
    if backend == "cpu" and refusal is not None:
        raise ValueError(f"backend='cpu' cannot run this call: {refusal}; use backend='auto' or 'torch'")
    if backend == "auto" and (refusal is not None or not form_ok):
        return False
    return _load_cpu() is not None


def _f32(x: torch.Tensor | None, shape: tuple[int, ...] | None = None):
    """float32, contiguous NumPy view (a copy only when the dtype or the layout differs), reshaped, or None.

    Written for decode, where each torch call costs about a microsecond: NumPy reshapes cost a tenth of that.
    """
    if x is None:
        return None
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    a = (x.detach() if x.requires_grad else x).numpy()
    return a if shape is None else a.reshape(shape)


# Rules whose compiled backward "auto" takes when inputs require grad (measured faster than the torch chunk form's
# backward, docs/perf.md); "cpu" takes it for every rule.
AUTO_BACKWARD_RULES: tuple[str, ...] = ("delta", "gated_delta")
# Tokens between the state checkpoints the compiled forward keeps for its backward: the backward recomputes one
# segment's states into a buffer of CHECKPOINT_EVERY x Dk x Dw per head (512 KiB at D = 64: it stays in L2).
CHECKPOINT_EVERY = 32


def linear_attention(
    backend: str, *, rule: str, form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g: torch.Tensor | None, beta: torch.Tensor | None, state: torch.Tensor, fmap: Callable | None,
    scale: float | None, normalize: bool, eps: float, eps_mode: str, grad: bool, chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None, **extra: object,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Whole sequence on a compiled backend, or None for the torch forms (``chunk_size``: the Triton chunk
    kernels take 16, 32 or 64; the CPU token loop has no chunks).

    Inputs as validated by :func:`linattn.linear_attention` (public layout ``[B, T, H, D]``, before the feature
    map; v may have a multiple of q's heads); ``state`` is the ``[B, H, Dk, Dv(+1)]`` starting state (the
    normalizer as last column), not modified. ``cu_seqlens`` (checked int64 ``[N + 1]``, B = 1): packed sequences,
    ``state`` then ``[N, H, ...]``. ``extra``: any further argument of the public call; a compiled kernel runs only
    when all of them are None. ``grad``: inputs require grad (the compiled prefill has a backward). Returns
    ``o [B, T, H, Dv]`` in ``v.dtype`` and the final state(s) in the augmented layout.
    """
    if cu_seqlens is not None and (backend == "triton" or q.is_cuda):
        return None  # packed on Triton: the caller runs padded segments, each one Triton call
    kt = _use_triton(backend, q, (q, k, v, g, beta), rule, state, None, extra, chunk_size)
    if kt is not None:
        return kt.linear_attention(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, fmap=fmap, scale=scale,
                                   normalize=normalize, eps=eps, eps_mode=eps_mode, chunk_size=chunk_size)
    if backend == "triton" or q.is_cuda:
        return None
    refusal = _cpu_refusal(rule, (q, k, v, g, beta), state, False, extra)
    # The compiled backward is first-order and has no functorch rule: under torch.func transforms (vmap, grad,
    # jacrev) "auto" keeps the torch forms. Double backward (create_graph) needs backend="torch".
    auto_ok = form in AUTO_FORMS and (not grad or (rule in AUTO_BACKWARD_RULES and not _functorch_active()))
    if not _resolve(backend, refusal, auto_ok):
        return None
    B, T, Hq, _ = q.shape
    H, Dv = v.shape[-2:]
    if backend == "auto" and not _cpu_module.prefers_compiled(rule, B, T, H, Dv, torch.get_num_threads()):
        return None  # measured: the torch chunk form is faster for this rule at this thread count
    cu = (np.arange(B + 1, dtype=np.int64) * T if cu_seqlens is None
          else cu_seqlens.detach().to("cpu", torch.int64).contiguous().numpy())
    qf, kf = q.to(torch.float32), k.to(torch.float32)
    if fmap is not None:
        qf, kf = fmap(qf), fmap(kf)
    Dk = qf.shape[-1]
    scale = Dk**-0.5 if scale is None else float(scale)
    if g is not None and g.dim() == 3:
        g = g.unsqueeze(-1)  # one gate per head: [B, T, H, 1]
    flat = (B * T, H)  # the kernels see the batch as packed rows: cu = [0, T, 2T, ...]
    if grad:
        return _with_backward(qf, kf, v, g, beta, state, cu, scale, normalize, eps, eps_mode, B, T, H, Hq)
    ST = state.detach().transpose(-1, -2).contiguous()  # the prefill kernel's layout (a copy: state is not ours)
    o = torch.empty(B * T, H, Dv, dtype=torch.float32)
    _cpu_module.prefill(_f32(qf, (B * T, Hq, Dk)), _f32(kf, (B * T, Hq, Dk)), _f32(v, (*flat, Dv)),
                        _f32(g, (*flat, -1)), _f32(beta, flat), cu, ST.numpy(), o.numpy(), scale=scale,
                        eps=float(eps), clamp=eps_mode == "clamp", normalize=normalize)
    return o.view(B, T, H, Dv).to(v.dtype), ST.transpose(-1, -2).contiguous()


def _with_backward(qf, kf, v, g, beta, state, cu, scale, normalize, eps, eps_mode, B, T, H, Hq):
    """The compiled prefill inside autograd. Around the kernel everything stays torch, so autograd differentiates
    it: the feature map (already applied), the grouping of value heads (q and k repeated to every value head, so
    their gradients sum over the group), the casts to float32, and the normalizer (the kernel reads [v | 1]
    unnormalized; the division happens here)."""
    if H != Hq:
        qf, kf = qf.repeat_interleave(H // Hq, dim=-2), kf.repeat_interleave(H // Hq, dim=-2)
    Dk, Dv = qf.shape[-1], v.shape[-1]
    vw = v.to(torch.float32)
    if normalize:
        vw = torch.cat([vw, torch.ones_like(vw[..., :1])], dim=-1)
    Dw = vw.shape[-1]
    flat = (B * T, H)
    o, S = _CompiledPrefill.apply(
        qf.reshape(*flat, Dk), kf.reshape(*flat, Dk), vw.reshape(*flat, Dw),
        None if g is None else g.to(torch.float32).reshape(*flat, -1),
        None if beta is None else beta.to(torch.float32).reshape(flat), state, cu, scale, CHECKPOINT_EVERY)
    if normalize:
        num, den = o[..., :Dv], o[..., Dv:]
        o = num / (den + eps if eps_mode == "add" else den.clamp_min(eps))
    return o.view(B, T, H, Dv).to(v.dtype), S


class _CompiledPrefill(torch.autograd.Function):
    """The compiled token loop with a compiled backward (:func:`linattn.kernels.cpu_numba.backward`).

    Inputs: float32 ``q, k [T, H, Dk]`` (already at the value heads), ``v [T, H, Dw]``, ``g [T, H, 1 or Dk]`` or
    None, ``beta [T, H]`` or None, ``S0 [N, H, Dk, Dw]``, then ``cu`` (int64 NumPy), the scale and the checkpoint
    spacing. Returns the unnormalized read ``[T, H, Dw]`` and the final states ``[N, H, Dk, Dw]``. Saved for the
    backward: the inputs and one state every ``every`` tokens (T / every states per head).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, S0, cu, scale, every):
        ST = S0.detach().to(torch.float32).transpose(-1, -2).contiguous()
        o = torch.empty(v.shape, dtype=torch.float32)
        ckpt = _cpu_module.prefill(_f32(q), _f32(k), _f32(v), _f32(g), _f32(beta), cu, ST.numpy(), o.numpy(),
                                   scale=scale, eps=0.0, clamp=False, normalize=False, every=every)
        ctx.save_for_backward(q, k, v, g, beta)
        ctx.ckpt, ctx.cu, ctx.scale, ctx.every, ctx.S0_dtype = ckpt, cu, scale, every, S0.dtype
        return o, ST.transpose(-1, -2).contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_o, grad_S):
        q, k, v, g, beta = ctx.saved_tensors
        N, H, Dk, Dw = len(ctx.cu) - 1, q.shape[1], q.shape[2], v.shape[2]
        dST = (torch.zeros(N, H, Dw, Dk) if grad_S is None
               else grad_S.to(torch.float32).transpose(-1, -2).contiguous())
        do = torch.zeros(v.shape) if grad_o is None else grad_o.to(torch.float32).contiguous()
        dq, dk, dv, dg, dbeta = _cpu_module.backward(
            _f32(q), _f32(k), _f32(v), _f32(g), _f32(beta), ctx.cu, ctx.ckpt, dST.numpy(), do.numpy(),
            scale=ctx.scale, every=ctx.every)
        t = torch.from_numpy
        return (t(dq), t(dk), t(dv), None if dg is None else t(dg), None if dbeta is None else t(dbeta),
                dST.transpose(-1, -2).to(ctx.S0_dtype), None, None, None)


def step(
    backend: str, *, rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
    beta: torch.Tensor | None, state: torch.Tensor, normalize: bool, eps: float, eps_mode: str, inplace: bool,
    **extra: object,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One decode token on a compiled backend, or None for the torch forms.

    ``q`` (already scaled), ``k`` features in the state's dtype ``[B, H, Dk]``, ``v [B, H, Dv]``; ``state``
    ``[B, H, Dk, Dv(+1)]``, updated in place when ``inplace`` (else copied first). Returns (o in v.dtype, state).
    """
    if backend == "torch":
        return None
    if backend == "triton" or q.is_cuda:
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, state))
        kt = _use_triton(backend, q, (q, k, v, g, beta), rule, state, grad, extra)
        if kt is None:
            return None
        return kt.step(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, normalize=normalize, eps=eps,
                       eps_mode=eps_mode, inplace=inplace)
    # Decode is all overhead at batch 1: the common case (CPU, float32, no autograd) is decided in a few checks.
    plain = (all(x is None for x in extra.values())
             and state.dtype == q.dtype == k.dtype == v.dtype == torch.float32 and state.is_cpu and q.is_cpu
             and v.shape[1] == q.shape[1] and (g is None or g.dim() == 2 or rule == "gated")
             and not (q.requires_grad or k.requires_grad or v.requires_grad or state.requires_grad)
             and (g is None or not g.requires_grad) and (beta is None or not beta.requires_grad))
    if not (plain and _cpu_module is not None and "step" in AUTO_FORMS):
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, state))
        refusal = _cpu_refusal(rule, (q, k, v, g, beta), state, grad, extra)
        if not _resolve(backend, refusal, "step" in AUTO_FORMS):
            return None
    if not state.is_contiguous():
        if inplace and backend == "cpu":
            raise ValueError("backend='cpu' cannot run this call: it updates a contiguous state in place, and "
                             "inplace=True was given a strided one; use backend='auto' or 'torch', or pass "
                             "state.clone()")
        if inplace:
            return None  # the torch form updates a strided state where it lies
        state = state.contiguous()
    if not inplace:
        state = state.detach().clone()
    B, H, Dk = q.shape
    Dv = v.shape[-1]
    o = torch.empty(B, H, Dv, dtype=torch.float32)
    # One token is a sequence of length 1: [B, H, ...] -> [B, 1, H, ...] views.
    _cpu_module.run(_f32(q, (B, 1, H, Dk)), _f32(k, (B, 1, H, Dk)), _f32(v, (B, 1, H, Dv)),
                    _f32(g, (B, 1, H, -1 if g is None or g.dim() == 3 else 1)), _f32(beta, (B, 1, H)),
                    state.detach().numpy(), o.numpy().reshape(B, 1, H, Dv), scale=1.0, eps=float(eps),
                    clamp=eps_mode == "clamp", normalize=normalize)
    if inplace:
        torch.autograd.graph.increment_version(state)  # written through NumPy: autograd must know (see api)
    return o.to(v.dtype), state
