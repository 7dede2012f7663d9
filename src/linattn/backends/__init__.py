"""The backends behind :func:`linattn.linear_attention` and :func:`linattn.step`, as ``backend=`` names them,
chosen by one dispatch: ``"torch"`` (:mod:`linattn.ops`), ``"cpu"`` (:mod:`linattn.backends.cpu`) and ``"triton"``
(:mod:`linattn.backends.triton`).

``backend="torch"`` always runs the readable torch forms in :mod:`linattn.ops`. ``backend="cpu"`` runs the fused
numba token loop (:mod:`linattn.kernels.cpu_numba`, through :mod:`linattn.backends.cpu`) and raises a
``ValueError`` for inputs it does not cover.
``backend="auto"`` (the default) takes a compiled kernel only where one covers the call and was measured faster
(docs/perf.md), and the torch form otherwise: numba on CPU; Triton only when forced, until a GPU run measures it.
``backend="triton"`` forces the Triton kernels (:mod:`linattn.kernels.triton`; CUDA, or CPU tensors under
``TRITON_INTERPRET=1``) and raises a ``ValueError`` naming the reason where they cannot run.

The compiled CPU prefill runs from a float32 state on CPU tensors, with grouped value heads, per-channel gates on
every gated rule (Kimi Delta Attention on gated_delta) and packed sequences (``cu_seqlens``, one state per
sequence, no padding). It has a compiled backward (reverse-time token loop from state checkpoints): "cpu" takes it
whenever inputs require grad, "auto" for the rules in ``AUTO_BACKWARD_RULES`` and for per-channel gates where
``cpu_numba.prefers_compiled_backward`` says so (measured faster). Another state
dtype, a device other than the CPU, or an argument the kernel does not know runs the torch form; so does
autograd through the decode step. If numba is missing or fails to load, "cpu" and "auto" run the torch form after
one warning.

Each entry point returns ``None`` when the torch form should run, so the caller keeps its own path unchanged;
a forced backend that cannot take a call raises a ``ValueError`` that says why (each backend's ``refusal``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from linattn.backends import cpu, triton
from linattn.checks import BACKENDS, check_backend

__all__ = ["AUTO_BACKWARD_RULES", "AUTO_FORMS", "BACKENDS", "check_backend", "decode_kernel", "linear_attention",
           "step"]
# "auto" uses the compiled kernels for these forms ("step" is decode); the others (parallel, scan) are asked for
# by name to study them, so they keep their torch form. Tests of the torch forms empty this tuple.
AUTO_FORMS = ("chunk", "recurrent", "step")
# Rules whose compiled backward "auto" takes when inputs require grad (measured faster than the torch chunk form's
# backward, docs/perf.md); "cpu" takes it for every rule.
AUTO_BACKWARD_RULES: tuple[str, ...] = ("delta", "gated_delta")


def decode_kernel(backend: str):
    """:mod:`linattn.kernels.cpu_decode` when ``backend`` lets the decode step run compiled on the CPU, else None.

    ``linattn.step`` asks this first and proves the rest (shapes, layouts, the state's record) itself; any call
    that is not the plain case runs through :func:`step` below."""
    if (backend == "cpu" or (backend == "auto" and "step" in AUTO_FORMS)) and not functorch_active():
        return cpu.decode_module()
    return None


_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)  # looked up once: decode is hot
# Why a compiled CPU kernel cannot run under torch.func: it reads tensors' memory, which the transforms' wrappers lack.
TRANSFORM_REFUSAL = "it reads raw tensor memory, which torch.func transforms (vmap, grad, jacrev, ...) do not provide"


def functorch_active() -> bool:
    """Whether a torch.func transform is running (torch has no public query for it; False where it lacks one)."""
    return _TRANSFORMS_ACTIVE is not None and bool(_TRANSFORMS_ACTIVE())


def compiled_backward_pays(rule: str, g: torch.Tensor | None, B: int, T: int, H: int, threads: int) -> bool:
    """Whether "auto" should differentiate this CPU prefill through the compiled backward (measured faster): the
    rules in ``AUTO_BACKWARD_RULES`` always, per-channel gates where ``cpu_numba.prefers_compiled_backward`` says so."""
    if rule in AUTO_BACKWARD_RULES:
        return True
    kernels = cpu.load()
    per_channel = g is not None and g.dim() == 4 and g.shape[-1] > 1
    return kernels is not None and kernels.prefers_compiled_backward(rule, per_channel, B, T, H, threads)


def resolve(backend: str, refusal: str | None, form_ok: bool) -> bool:
    """True when the compiled CPU kernel should run. A forced "cpu" that cannot take the call is an error."""
    if backend == "torch":
        return False
    if backend == "cpu" and refusal is not None:
        raise ValueError(f"backend='cpu' cannot run this call: {refusal}; use backend='auto' or 'torch'")
    if backend == "auto" and (refusal is not None or not form_ok):
        return False
    return cpu.load() is not None


def linear_attention(
    backend: str, *, rule: str, form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g: torch.Tensor | None, beta: torch.Tensor | None, state: torch.Tensor, fmap: Callable | None,
    scale: float | None, normalize: bool, eps: float, eps_mode: str, grad: bool, chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None, **extra: object,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Whole sequence on a compiled backend, or None for the torch forms (``chunk_size``: the Triton chunk
    kernels take 16, 32 or 64; the CPU token loop has no chunks).

    Inputs as validated by :func:`linattn.call.prepare` (public layout ``[B, T, H, D]``, before the feature
    map; v may have a multiple of q's heads); ``state`` is the ``[B, H, Dk, Dv(+1)]`` starting state (the
    normalizer as last column), not modified. ``cu_seqlens`` (checked int64 ``[N + 1]``, B = 1): packed sequences,
    ``state`` then ``[N, H, ...]``. ``extra``: any further argument of the public call; a compiled kernel runs only
    when all of them are None. ``grad``: inputs require grad (the compiled prefill has a backward). Returns
    ``o [B, T, H, Dv]`` in ``v.dtype`` and the final state(s) in the augmented layout.
    """
    if cu_seqlens is not None and (backend == "triton" or q.is_cuda):
        return None  # packed on Triton: the caller runs padded segments, each one Triton call
    kt = triton.use(backend, (q, k, v, g, beta), rule, state, None, extra, chunk_size)
    if kt is not None:
        return kt.linear_attention(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, fmap=fmap, scale=scale,
                                   normalize=normalize, eps=eps, eps_mode=eps_mode, chunk_size=chunk_size)
    if backend in ("triton", "torch") or q.is_cuda:
        return None
    refusal = TRANSFORM_REFUSAL if functorch_active() else cpu.refusal(rule, (q, k, v, g, beta), state, False, extra)
    B, T = q.shape[:2]
    H, Dv = v.shape[-2:]
    threads = torch.get_num_threads()
    # The compiled backward has no functorch rule: under torch.func transforms (vmap, grad, jacrev) "auto" keeps
    # the torch forms. A double backward (create_graph) recomputes in the torch forms (cpu.exact_backward).
    auto_ok = backend != "auto" or (form in AUTO_FORMS and (not grad or (
        not functorch_active() and compiled_backward_pays(rule, g, B, T, H, threads))))
    if not resolve(backend, refusal, auto_ok):
        return None
    if backend == "auto" and not cpu.load().prefers_compiled(rule, B, T, H, Dv, threads):
        return None  # measured: the torch chunk form is faster for this rule at this thread count
    return cpu.prefill(q, k, v, g, beta, state, fmap, scale, normalize, eps, eps_mode, grad, cu_seqlens)


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
        kt = triton.use(backend, (q, k, v, g, beta), rule, state, grad, extra)
        if kt is None:
            return None
        return kt.step(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, normalize=normalize, eps=eps,
                       eps_mode=eps_mode, inplace=inplace)
    if functorch_active():
        if backend == "cpu":
            raise ValueError(f"backend='cpu' cannot run this call: {TRANSFORM_REFUSAL}; use backend='auto' or 'torch'")
        return None
    # Decode is all overhead at batch 1: the common case (CPU, float32, no autograd) is decided in a few checks.
    plain = (all(x is None for x in extra.values())
             and state.dtype == q.dtype == k.dtype == v.dtype == torch.float32 and state.is_cpu and q.is_cpu
             and v.shape[1] == q.shape[1] and (g is None or g.dim() == 2 or rule == "gated")
             and not (q.requires_grad or k.requires_grad or v.requires_grad or state.requires_grad)
             and (g is None or not g.requires_grad) and (beta is None or not beta.requires_grad))
    if not (plain and cpu.loaded() and "step" in AUTO_FORMS):
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, state))
        refusal = cpu.refusal(rule, (q, k, v, g, beta), state, grad, extra)
        if not resolve(backend, refusal, "step" in AUTO_FORMS):
            return None
    return cpu.step(rule, q, k, v, g, beta, state, normalize, eps, eps_mode, inplace, backend)
