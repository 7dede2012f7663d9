"""The backends behind `linattn.linear_attention` and `linattn.step`, as ``backend=`` names them, and the one
place that decides which of them runs a call: ``"torch"`` (`linattn.ops`), ``"cpu"`` (`linattn.backends.cpu`, the
numba kernels) and ``"triton"`` (`linattn.backends.triton`).

Every call is planned here once: `plan_prefill` and `plan_step` return a `Plan`, the compiled path to run (or
None for the torch forms) and why; a step's plan is made before its arguments are checked and is settled on the
checked tensors (`settle`) when its full path runs. `linattn.plan` shows a call's plan to the user. The rules
behind ``"auto"`` (which forms, which backward, how many threads) are in `linattn.backends.policy`, each with its
measurement; what each backend can take is its ``refusal``.

``backend="torch"`` always runs the readable torch forms. ``backend="cpu"`` runs the numba kernels and raises a
``ValueError`` saying why for inputs they do not cover. ``backend="triton"`` forces the Triton kernels (CUDA, or
CPU tensors under ``TRITON_INTERPRET=1``) and raises likewise. ``backend="auto"`` (the default) takes the numba
kernels where they cover the call and the policy says they are faster, else the torch forms; on CUDA the torch
forms, until a GPU run measures the Triton kernels. If numba is missing or fails to load, "cpu" and "auto" run
the torch forms after one warning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from linattn.backends import cpu, policy, triton
from linattn.checks import BACKENDS, check_backend

__all__ = ["BACKENDS", "Plan", "check_backend", "decode_threads", "functorch_active", "linear_attention",
           "plan_conv", "plan_prefill", "plan_ssm_step", "plan_step", "settle", "step"]


@dataclass(frozen=True)
class Plan:
    """How one call runs: ``kernel`` is ``"cpu"`` or ``"triton"`` (a compiled backend) or None (the torch forms);
    ``why`` says what decided it, in words (a refusal's reason, or the policy's rule); ``module``: the kernels'
    module the plan runs (the Triton kernels, found once by the refusal check; for a decode step on ``"cpu"``, the
    one-call decode kernel). A step's plan is made before its arguments are checked, so it also keeps the
    ``backend`` asked for and, where a forced backend refuses whatever the tensors are, the ``error`` that running
    the plan raises (after the checks, so a bad argument is named first). ``grouped_chunk``: a CPU prefill that
    runs as grouped matrix products (`linattn.ops.gated.chunk_grouped`, Mamba-2's scan) rather than the token loop
    (`linattn.backends.policy.grouped_chunk`)."""

    kernel: str | None
    why: str
    module: object = field(default=None, repr=False, compare=False)
    backend: str = "auto"
    error: str | None = None
    grouped_chunk: bool = False

    @property
    def runs(self) -> str:
        """What runs, by the name ``backend=`` gives it: ``"cpu"``, ``"triton"`` or ``"torch"``."""
        return self.kernel or "torch"

    def __str__(self) -> str:
        return f"{self.runs}: {self.why}"


TORCH = Plan(None, "backend='torch'", backend="torch")
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)  # looked up once: decode is hot
# Why a compiled CPU kernel cannot run under torch.func: it reads tensors' memory, which the transforms' wrappers lack.
TRANSFORM_REFUSAL = "it reads raw tensor memory, which torch.func transforms (vmap, grad, jacrev, ...) do not provide"
CUDA_AUTO = "on CUDA 'auto' runs the torch forms until the Triton kernels are measured on a GPU"


def functorch_active() -> bool:
    """Whether a torch.func transform is running (torch has no public query for it; False where it lacks one)."""
    return _TRANSFORMS_ACTIVE is not None and bool(_TRANSFORMS_ACTIVE())


def decode_threads(entries: int) -> int:
    """Threads for one step of the one-call decode kernel over ``entries`` state values (the policy's rule)."""
    return policy.decode_threads(entries, cpu.available_threads())


def _forced(backend: str, why: str) -> ValueError:
    return ValueError(f"backend={backend!r} cannot run this call: {why}; use backend='auto' or 'torch'")


def _cpu_plan(backend: str, refusal: str | None, auto_why: str | None, modules: tuple[str, ...]) -> Plan:
    """The numba kernel modules ``modules`` (each one the call runs), or the torch forms and why. ``refusal``:
    what the kernel cannot take (an error when forced); ``auto_why``: the policy's reason to keep the torch forms
    under "auto" (None: no objection)."""
    if backend == "cpu" and refusal is not None:
        raise _forced(backend, refusal)
    if backend == "auto" and (refusal is not None or auto_why is not None):
        return Plan(None, refusal or auto_why)
    if any(cpu.kernel(m) is None for m in modules):
        return Plan(None, "numba is unavailable", backend=backend)
    return Plan("cpu", "the numba kernels take the call", backend=backend)


def _device_plan(backend: str, rule: str, tensors: tuple, state: torch.Tensor, grad: bool | None,
                 extra: dict | None, chunk_size: int | None) -> Plan | None:
    """The plan where the device or a transform decides (Triton, CUDA under "auto", torch.func), else None: the
    CPU's turn (a CUDA tensor under a forced ``"cpu"`` meets its refusal there).
    ``grad``: as `triton.refusal` takes it (None for a whole sequence, whose kernels have a backward)."""
    auto_cuda = backend == "auto" and tensors[0].is_cuda
    if backend == "triton" or (auto_cuda and policy.TRITON_UNDER_AUTO):
        kt, why = triton.refusal(rule, tensors, state, grad, extra, chunk_size)
        if kt is None:
            raise _forced("triton", why)
        return Plan("triton", f"backend={backend!r}", kt, backend)
    if auto_cuda:
        return Plan(None, CUDA_AUTO)
    if functorch_active():
        return _cpu_plan(backend, TRANSFORM_REFUSAL, None, ())  # refused: no kernel to load
    return None


def plan_prefill(backend: str, *, rule: str, form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 g: torch.Tensor | None, beta: torch.Tensor | None, state: torch.Tensor, grad: bool,
                 chunk_size: int = 64, cu_seqlens: torch.Tensor | None = None, extra: dict | None = None,
                 plain: bool = False) -> Plan:
    """Which path runs a whole-sequence call (arguments as `linear_attention` takes them; ``plain``: no feature
    map and no normalizer); a forced backend that cannot take it raises a ``ValueError`` naming the reason."""
    if backend == "torch":
        return TORCH
    if cu_seqlens is not None and (backend == "triton" or q.is_cuda):
        return Plan(None, "packed sequences on Triton run as padded segments", backend=backend)
    plan = _device_plan(backend, rule, (q, k, v, g, beta), state, None, extra, chunk_size)
    if plan is not None:
        return plan
    refusal = cpu.refusal(rule, (q, k, v, g, beta), state, False, extra)
    auto_why = None
    if form not in policy.AUTO_FORMS:
        auto_why = f"form={form!r} is asked for by name, so it runs as written"
    elif grad:
        B, T = q.shape[:2]
        per_channel = g is not None and g.dim() == 4 and g.shape[-1] > 1
        if not policy.compiled_backward(rule, per_channel, B, T, v.shape[-2], cpu.available_threads()):
            auto_why = "the torch form's backward was measured faster for this rule and size"
    plan = _cpu_plan(backend, refusal, auto_why, ("cpu_prefill", "cpu_backward") if grad else ("cpu_prefill",))
    if plan.kernel == "cpu" and backend == "auto" and not grad and cu_seqlens is None and form == "chunk":
        why = cpu.grouped_chunk_refusal(rule, q, v, g, plain)
        if why is None:
            return Plan("cpu", GROUPED_CHUNK_WHY, backend=backend, grouped_chunk=True)
    return plan


GROUPED_CHUNK_WHY = ("one gate per head over groups of value heads sharing q/k, long enough: the grouped chunk form "
                     "(one matrix product per group and chunk) was measured as fast as the numba token loop or faster")


def linear_attention(
    backend: str, *, rule: str, form: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g: torch.Tensor | None, beta: torch.Tensor | None, state: torch.Tensor, fmap: Callable | None,
    scale: float | None, normalize: bool, eps: float, eps_mode: str, grad: bool, chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None, **extra: object,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Whole sequence on a compiled backend, or None for the torch forms (``chunk_size``: the Triton chunk
    kernels take 16, 32 or 64; the CPU token loop has no chunks).

    Inputs as validated by `linattn.call.prepare` (public layout ``[B, T, H, D]``, before the feature map; v may
    have a multiple of q's heads); ``state`` is the ``[B, H, Dk, Dv(+1)]`` starting state (the normalizer as last
    column), not modified. ``cu_seqlens`` (checked int64 ``[N + 1]``, B = 1): packed sequences, ``state`` then
    ``[N, H, ...]``. ``extra``: any further argument of the public call; a compiled kernel runs only when all of
    them are None. ``grad``: inputs require grad. Returns ``o [B, T, H, Dv]`` in ``v.dtype`` and the final
    state(s) in the augmented layout.
    """
    plan = plan_prefill(backend, rule=rule, form=form, q=q, k=k, v=v, g=g, beta=beta, state=state, grad=grad,
                        chunk_size=chunk_size, cu_seqlens=cu_seqlens, extra=extra,
                        plain=fmap is None and not normalize)
    if plan.kernel == "triton":
        return plan.module.linear_attention(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, fmap=fmap,
                                            scale=scale, normalize=normalize, eps=eps, eps_mode=eps_mode,
                                            chunk_size=chunk_size)
    if plan.grouped_chunk:
        return cpu.grouped_prefill(q, k, v, g, state, scale)
    if plan.kernel == "cpu":
        return cpu.prefill(q, k, v, g, beta, state, fmap, scale, normalize, eps, eps_mode, grad, cu_seqlens)
    return None


_CPU_STEP: dict[str, Plan] = {}  # "auto", "cpu" -> the compiled step's plan, made once numba has loaded


def plan_step(backend: str, q: object = None) -> Plan:
    """Which path runs one decode step (`linattn.step`, a `linattn.Decoder` call), decided once per call before its
    arguments are checked, from what needs no checked tensor: ``backend``, the policy, a running torch.func
    transform and the device of ``q`` (any object: a non-tensor is the checks' to name; a Decoder passes its state).

    The step follows the plan: ``kernel="cpu"``: ``module`` (`linattn.kernels.cpu_decode`, the one-call kernel)
    where the inputs prove the plain case (`linattn.decode.fast_decode`), else `step` with the checked tensors:
    the numba token loop's step where `linattn.backends.cpu.refusal` passes them, else the torch step (a
    ``ValueError`` with the reason under ``backend="cpu"``); `settle` gives that final plan."""
    plan = _CPU_STEP.get(backend) if type(backend) is str else None
    if plan is not None and not functorch_active() and (
            backend == "cpu" or ("step" in policy.AUTO_FORMS and not (isinstance(q, torch.Tensor) and q.is_cuda))):
        return plan  # the usual case, read in a few hundred nanoseconds: decode at batch 1 is all overhead
    if type(backend) is not str or backend not in BACKENDS:
        return Plan(None, f"unknown backend {backend!r}", backend=repr(backend))  # the checks name it
    if backend == "torch":
        return TORCH
    if backend == "triton":
        return Plan("triton", "backend='triton'", backend=backend)
    if backend == "auto" and isinstance(q, torch.Tensor) and q.is_cuda:
        return Plan("triton", "backend='auto'", backend=backend) if policy.TRITON_UNDER_AUTO else Plan(None, CUDA_AUTO)
    if functorch_active():
        return Plan(None, TRANSFORM_REFUSAL, backend=backend, error=TRANSFORM_REFUSAL if backend == "cpu" else None)
    if backend == "auto" and "step" not in policy.AUTO_FORMS:
        return Plan(None, "the step's torch form is asked for")
    kd = cpu.kernel("cpu_decode")
    if kd is None:
        return Plan(None, "numba is unavailable", backend=backend)
    plan = _CPU_STEP[backend] = Plan("cpu", "the numba kernels take the call", kd, backend)
    return plan


def settle(plan: Plan, *, rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
           beta: torch.Tensor | None, state: torch.Tensor) -> Plan:
    """The plan of `plan_step` for the checked tensors of the step (as `step` takes them): a compiled backend that
    cannot take them gives the torch step and why under ``"auto"``, and a ``ValueError`` naming the reason when
    forced."""
    if plan.error is not None:
        raise _forced(plan.backend, plan.error)
    if plan.kernel is None:
        return plan
    tensors = (q, k, v, g, beta)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (*tensors, state))
    if plan.kernel == "triton":
        kt, why = triton.refusal(rule, tensors, state, grad, None)
        if kt is None:
            raise _forced("triton", why)
        return Plan("triton", plan.why, kt, plan.backend)
    refusal = cpu.refusal(rule, tensors, state, grad)
    if refusal is None:
        return plan
    if plan.backend == "cpu":
        raise _forced("cpu", refusal)
    return Plan(None, refusal)


def step(
    plan: Plan, *, rule: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
    beta: torch.Tensor | None, state: torch.Tensor, normalize: bool, eps: float, eps_mode: str, inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One decode token as ``plan`` (from `plan_step`) says: on a compiled backend, or None for the torch step.

    ``q`` (already scaled), ``k`` features in the state's dtype ``[B, H, Dk]``, ``v [B, H, Dv]``; ``state``
    ``[B, H, Dk, Dv(+1)]``, updated in place when ``inplace`` (else copied first). Returns (o in v.dtype, state).
    """
    plan = settle(plan, rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state)
    if plan.kernel == "triton":
        return plan.module.step(rule=rule, q=q, k=k, v=v, g=g, beta=beta, state=state, normalize=normalize,
                                eps=eps, eps_mode=eps_mode, inplace=inplace)
    if plan.kernel == "cpu":
        return cpu.step(rule, q, k, v, g, beta, state, normalize, eps, eps_mode, inplace, plan.backend)
    return None


def plan_conv(backend: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
              window: torch.Tensor | None = None) -> Plan:
    """Which path runs the short causal convolution of ``x`` (with ``window``: one decode token ``x`` into that
    rolling window, in place, outside autograd). The Triton backend has no convolution: under ``"triton"`` the torch
    form runs (on CUDA too); a forced ``"cpu"`` that cannot take the call raises a ``ValueError`` naming the
    reason."""
    if backend in ("torch", "triton"):
        return Plan(None, f"backend={backend!r} runs the torch form of the convolution", backend=backend)
    refusal = TRANSFORM_REFUSAL if functorch_active() else cpu.conv_refusal(x, weight, bias, window)
    return _cpu_plan(backend, refusal, None, ("cpu_conv",))


def plan_ssm_step(backend: str, tensors: tuple, state: torch.Tensor) -> Plan:
    """Which path runs one Mamba-2 decode step (HF's ``mamba2_selective_state_update`` with one value of dt, A and
    dt_bias per head): ``kernel="cpu"`` with ``module`` `linattn.kernels.cpu_ssm` (the whole step in one compiled
    call) where `linattn.backends.cpu.ssm_step_refusal` passes ``tensors`` (the step's inputs, None for an absent
    one) and ``state``; else None and why, and the caller runs the step as `linattn.step` (on ``backend``'s own
    path: the forced backends keep their errors there)."""
    if backend == "torch" or backend == "triton":
        return Plan(None, f"backend={backend!r} runs the step as linattn.step", backend=backend)
    if backend == "auto" and "step" not in policy.AUTO_FORMS:
        return Plan(None, "the step's torch form is asked for", backend=backend)
    refusal = TRANSFORM_REFUSAL if functorch_active() else cpu.ssm_step_refusal(tensors, state)
    if refusal is not None:
        return Plan(None, refusal, backend=backend)
    module = cpu.kernel("cpu_ssm")
    if module is None:
        return Plan(None, "numba is unavailable", backend=backend)
    return Plan("cpu", "the numba kernels take the call", module, backend)
