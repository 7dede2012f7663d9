"""The compiled CPU backend (``backend="cpu"``, and ``"auto"`` where it was measured faster): the glue between
the dispatch (`linattn.backends`) and the numba kernels: `linattn.kernels.cpu_prefill` (the prefill),
`linattn.kernels.cpu_backward` (its backward), `linattn.kernels.cpu_loop` (the general step) and
`linattn.kernels.cpu_decode` (the one-call decode step).

It runs from a float32 state on CPU tensors (float32, bfloat16 or float16 inputs; the prefill reads bfloat16 in
place when no feature map runs in torch first, anything else is converted once), with grouped
value heads, per-channel gates on every gated rule and packed sequences (one state per sequence, no padding). The
prefill has a compiled backward (a reverse-time token loop from state checkpoints); a double backward
(``create_graph=True``) recomputes in the torch chunk forms instead, so second derivatives are exact. If numba is
missing or fails to load, the torch forms run after one warning.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch

from linattn import buffers, feature_maps
from linattn.backends import compile_notice, policy
from linattn.layout import from_kernel_layout, to_kernel_layout, with_ones_column
from linattn.ops import gated as ops_gated
from linattn.ops import gated_delta as ops_gated_delta

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # widened to float32 on the way in, or as loaded
# Tokens between the state checkpoints the compiled forward keeps for its backward: the backward recomputes one
# segment's states into a buffer of CHECKPOINT_EVERY x Dk x Dw per head (512 KiB at D = 64: it stays in L2).
CHECKPOINT_EVERY = 32

_failed: str | None = None
_modules: dict[str, object] = {}


def _prepare_numba() -> None:
    """What numba needs before a linattn kernel module loads: its own thread pool (the workqueue layer) unless the
    user chose a layer: the OpenMP layer loads a second OpenMP runtime next to torch's, whose idle threads spun
    against torch's and made the torch chunk form 5x slower on 2 cores after one numba call
    (benchmarks/results/omp_wait_ab_cpu.txt); and the one line on stderr when a kernel compiles on a cold cache."""
    import numba

    if not os.environ.get("NUMBA_THREADING_LAYER"):
        numba.config.THREADING_LAYER = "workqueue"
    compile_notice.install()


def kernel(name: str):
    """The compiled CPU kernel module ``linattn.kernels.<name>`` (``cpu_prefill``, ``cpu_backward``, ``cpu_loop``,
    ``cpu_decode``, ``cpu_conv``, ``cpu_ssm``), or None (after one warning per process) when numba cannot load;
    every kernel module is loaded here."""
    global _failed
    if name not in _modules and _failed is None:
        try:
            _prepare_numba()
            _modules[name] = importlib.import_module(f"linattn.kernels.{name}")
        except Exception as exc:  # ImportError, or a numba/llvmlite that fails to initialize
            _failed = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"linattn: compiled CPU kernels unavailable ({_failed}); using the torch forms",
                          RuntimeWarning, stacklevel=5)
    return _modules.get(name)


def available_threads() -> int:
    """Threads a compiled call may use: torch's count (what the user set), capped by numba's pool."""
    import numba

    return min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)


def loop_threads(tokens: int, seqs: int, H: int, Dk: int, Dw: int, value_rows: int | None = None) -> int:
    """Threads for a compiled prefill or backward over ``tokens`` tokens of ``seqs`` sequences with ``H`` heads of
    [Dk, Dw] state (the policy's rule): the work is the state entries swept, the units the (sequence, head) pairs,
    each cut into blocks of 32 of its ``value_rows`` (the prefill: its smallest units,
    `linattn.kernels.cpu_prefill.prefill_cols`; None: the backward, whose units are whole pairs)."""
    pairs = seqs * H * (1 if value_rows is None else max(1, value_rows // 32))
    return policy.loop_threads(tokens * H * Dk * Dw, pairs, available_threads())


def refusal(rule: str, tensors: tuple, state: torch.Tensor, grad: bool, extra: dict | None = None) -> str | None:
    """Why the CPU kernel cannot take this call, or None when it can. ``tensors`` is (q, k, v, g, beta); ``grad``:
    the call needs a backward the kernel lacks (the decode step has none; prefill has one).

    Inputs the kernel does not know (passed through ``extra``) go to the torch forms.
    """
    unknown = [name for name, x in (extra or {}).items() if x is not None]
    if unknown:
        return f"it does not take {', '.join(unknown)}"
    if grad:
        return "it has no backward (inputs require grad)"
    # (is_cpu, not device.type: building a torch.device costs a microsecond, six of them more than a decode step)
    if not state.is_cpu or any(t is not None and not t.is_cpu for t in tensors):
        return "it runs on CPU tensors only"
    if state.dtype != torch.float32:
        return f"it keeps a float32 state, got state dtype {state.dtype}"
    if any(t is not None and t.dtype not in INPUT_DTYPES for t in tensors):
        return f"it takes {', '.join(str(d).removeprefix('torch.') for d in INPUT_DTYPES)} inputs"
    return None


def ssm_step_refusal(tensors: tuple, state: torch.Tensor) -> str | None:
    """Why the compiled Mamba-2 decode step (`linattn.kernels.cpu_ssm`) cannot take this call, or None: CPU
    tensors outside autograd, float32 or bfloat16 inputs (``tensors``; None for an absent one), a float32 state
    ``[B, H, P, N]`` whose heads are contiguous ``[P, N]`` or ``[N, P]`` blocks, writable in place."""
    given = [t for t in tensors if t is not None]
    if torch.is_grad_enabled() and (state.requires_grad or any(t.requires_grad for t in given)):
        return "it has no backward (inputs require grad)"
    if not state.is_cpu or any(not t.is_cpu for t in given):
        return "it runs on CPU tensors only"
    if state.dtype != torch.float32:
        return f"it keeps a float32 state, got state dtype {state.dtype}"
    if any(t.dtype != torch.float32 and t.dtype != torch.bfloat16 for t in given):
        return "it takes float32 and bfloat16 inputs"
    if state.is_neg() or any(t.is_neg() for t in given):
        return "it reads memory, and a negative view's memory does not hold its values"
    if state.is_inference() and not torch.is_inference_mode_enabled():
        return "it updates the state in place, and an inference tensor is written only in inference mode"
    P, N = state.shape[-2:]
    st = state.stride()
    if not ((st[-1] == 1 or N == 1) and (st[-2] == N or P == 1)) and not (
            (st[-2] == 1 or P == 1) and (st[-1] == P or N == 1)):
        return "it updates in place a state whose heads are contiguous [P, N] or [N, P] blocks"
    return None


def conv_refusal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 window: torch.Tensor | None = None) -> str | None:
    """Why the compiled convolution cannot take this call, or None: CPU tensors of one dtype, float32. With
    ``window`` (one decode token ``x`` into that rolling window, in place; the update has no backward) float32 or
    float64, outside autograd."""
    update = window is not None
    tensors = [t for t in (x, weight, bias, window) if t is not None]
    if any(not t.is_cpu for t in tensors):
        return "it runs on CPU tensors only"
    dtypes = (torch.float32, torch.float64) if update else (torch.float32,)
    if any(t.dtype != x.dtype for t in tensors) or x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"it takes {names} inputs of one dtype"
    if update and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "its one-token update has no backward (inputs require grad)"
    if update and (window.is_neg() or window.is_conj()):
        return "it updates the window in place, and a negative or conjugate view's memory does not hold its values"
    return None


def f32(x: torch.Tensor | None, shape: tuple[int, ...] | None = None):
    """float32, contiguous NumPy view (a copy only when the dtype or the layout differs), reshaped, or None (the
    view leaves the tensor resizable: `linattn.buffers.array`).

    Written for decode, where each torch call costs about a microsecond: NumPy reshapes cost a tenth of that.
    """
    if x is None:
        return None
    if x.dtype != torch.float32 or not x.is_contiguous():
        # one pass into a fresh buffer: torch's contiguous() of a strided float32 view (q, k, v split from one
        # projection, as HF's layers pass them) took 2-3x as long at prefill sizes
        x = torch.empty(tuple(x.shape), dtype=torch.float32).copy_(x)
    a = buffers.readable(x)  # (a negative view's values copied: its memory holds them negated)
    return a if shape is None else a.reshape(shape)


def f32_joint(*pairs):
    """`f32` of several ``(tensor, shape)`` pairs, the tensors that need a copy (strided views such as q, k and v
    split from one projection, or another dtype) copied into one fresh buffer: large enough together to be advised
    onto huge pages (`linattn.buffers`), where each copy alone would fault in 4 KiB pages on every call."""
    copy = [x.is_neg() or x.dtype != torch.float32 or not x.is_contiguous() for x, _ in pairs]
    if sum(copy) < 2:
        return [f32(x, shape) for x, shape in pairs]
    sizes = [x.numel() if c else 0 for (x, _), c in zip(pairs, copy, strict=True)]
    joint, at, out = buffers.empty((sum(sizes),)), 0, []
    for (x, shape), n, c in zip(pairs, sizes, copy, strict=True):
        if c:
            x = joint[at:at + n].view(x.shape).copy_(x.resolve_neg())
            at += n
        out.append(f32(x, shape))
    return out


# The feature maps the compiled prefill applies itself, by the name it knows them by (matched by identity: a
# user's callable need not be hashable).
KERNEL_MAPS = ((feature_maps.relu1, "relu1"), (feature_maps.elu1, "elu1"), (feature_maps.l2, "l2"))


def bf16_bits(x: torch.Tensor, shape: tuple[int, ...]):
    """A bfloat16 tensor's bits as a contiguous int16 NumPy view (a copy only when not contiguous), reshaped."""
    return buffers.array(buffers.values(x.detach()).contiguous().view(torch.int16)).reshape(shape)


_NO_OFFSETS = np.zeros(1, dtype=np.int64)
_NO_PRE = np.zeros((1, 1, 1), dtype=np.float32)


def conv_forward(x: torch.Tensor, history: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
                 offs: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """The compiled convolution outside autograd (`linattn.nn.conv.causal_conv`'s arguments; ``offs``: each
    token's offset in its packed sequence): ``y [B, T, C]`` (contiguous) from ``x [B, T, C]`` read in place when
    its channels are adjacent (a transposed ``[B, C, T]`` tensor as HF passes it), else from one copy; the history
    read apart, the SiLU in the pass, the tokens split over threads (`policy.conv_threads`)."""
    B, T, C = x.shape
    K = weight.shape[-1]
    x = buffers.values(x.detach())
    if x.stride(2) != 1 and C > 1:
        x = x.contiguous()
    wT = buffers.values(weight.detach()).t().contiguous()
    b = buffers.values(bias.detach()).contiguous() if bias is not None else torch.zeros(C, dtype=x.dtype)
    with_history = history is not None and K > 1
    hist = (buffers.values(history.detach()).to(x.dtype).contiguous() if with_history
            else torch.zeros(1, 1, 1, dtype=x.dtype))
    y = buffers.empty((B, T, C), x.dtype)
    if T == 0 or C == 0 or B == 0:
        return y
    off = offs.numpy() if offs is not None else _NO_OFFSETS
    args = (x.data_ptr(), x.stride(0), x.stride(1), B, buffers.array(hist), with_history, buffers.array(wT),
            buffers.array(b), off, offs is not None, silu)
    out, conv = buffers.array(y), kernel("cpu_conv")
    kernel("cpu_threads").on_threads(lambda lo, hi: conv.forward(*args, lo, hi, out, _NO_PRE, False), T,
                                     policy.conv_threads(T, available_threads()))
    return y


def prefill(q, k, v, g, beta, state, fmap: Callable | None, scale, normalize, eps, eps_mode, grad,
            cu_seqlens: torch.Tensor | None):
    """Whole sequence(s) on the numba kernel; arguments as `linattn.backends.linear_attention` takes them.
    Returns ``o [B, T, H, Dv]`` in ``v.dtype`` and the final state(s) in the augmented layout."""
    B, T, Hq, _ = q.shape
    H, Dv = v.shape[-2:]
    cu = (np.arange(B + 1, dtype=np.int64) * T if cu_seqlens is None
          else np.array(cu_seqlens.detach().to("cpu", torch.int64).tolist(), dtype=np.int64))  # ours: kept for backward
    # A built-in map the kernel applies to each row as it loads it: no mapped copies of q and k (each a full pass
    # in torch, and a fresh tensor whose pages fault on first write).
    in_kernel = None if grad or fmap is None else next((n for f, n in KERNEL_MAPS if f is fmap), None)
    # bfloat16 q, k, v that the kernel reads as they are (no map left to apply in torch): no float32 copies
    raw = not grad and (fmap is None or in_kernel) and q.dtype == k.dtype == v.dtype == torch.bfloat16
    qf, kf = (q, k) if raw else (q.to(torch.float32), k.to(torch.float32))
    if fmap is not None and not in_kernel:
        qf, kf = fmap(qf), fmap(kf)
    Dk = qf.shape[-1]
    scale = Dk**-0.5 if scale is None else float(scale)
    if g is not None and g.dim() == 3:
        g = g.unsqueeze(-1)  # one gate per head: [B, T, H, 1]
    flat = (B * T, H)  # the kernels see the batch as packed rows: cu = [0, T, 2T, ...]
    if grad:
        return with_backward(qf, kf, v, g, beta, state, cu, scale, normalize, eps, eps_mode, B, T, H, Hq)
    ST = to_kernel_layout(state)  # the prefill kernel's layout (a copy: state is not ours)
    o = buffers.empty((B * T, H, Dv))
    if raw:
        qa, ka, va = bf16_bits(qf, (B * T, Hq, Dk)), bf16_bits(kf, (B * T, Hq, Dk)), bf16_bits(v, (*flat, Dv))
    else:
        qa, ka, va = f32_joint((qf, (B * T, Hq, Dk)), (kf, (B * T, Hq, Dk)), (v, (*flat, Dv)))
    threads = loop_threads(B * T, len(cu) - 1, H, Dk, ST.shape[-2], value_rows=Dv)
    kernel("cpu_prefill").prefill(qa, ka, va, f32(g, (*flat, -1)), f32(beta, flat), cu, buffers.array(ST),
                                  buffers.array(o), scale=scale, eps=float(eps), clamp=eps_mode == "clamp",
                                  normalize=normalize, fmap=in_kernel, threads=threads)
    o = o.view(B, T, H, Dv)
    if v.dtype != torch.float32:
        o = buffers.empty(tuple(o.shape), v.dtype).copy_(o)
    return o, from_kernel_layout(ST).contiguous()


def with_backward(qf, kf, v, g, beta, state, cu, scale, normalize, eps, eps_mode, B, T, H, Hq):
    """The compiled prefill inside autograd. Around the kernel everything stays torch, so autograd differentiates
    it: the feature map (already applied), the grouping of value heads (q and k repeated to every value head, so
    their gradients sum over the group), the casts to float32, and the normalizer (the kernel reads [v | 1]
    unnormalized; the division happens here)."""
    if H != Hq:
        qf, kf = qf.repeat_interleave(H // Hq, dim=-2), kf.repeat_interleave(H // Hq, dim=-2)
    Dk, Dv = qf.shape[-1], v.shape[-1]
    vw = v.to(torch.float32)
    if normalize:
        vw = with_ones_column(vw)
    Dw = vw.shape[-1]
    flat = (B * T, H)
    o, S = CompiledPrefill.apply(
        qf.reshape(*flat, Dk), kf.reshape(*flat, Dk), vw.reshape(*flat, Dw),
        None if g is None else g.to(torch.float32).reshape(*flat, -1),
        None if beta is None else beta.to(torch.float32).reshape(flat), state, cu, scale, CHECKPOINT_EVERY)
    if normalize:
        num, den = o[..., :Dv], o[..., Dv:]
        o = num / (den + eps if eps_mode == "add" else den.clamp_min(eps))
    return o.view(B, T, H, Dv).to(v.dtype), S


class CompiledPrefill(torch.autograd.Function):
    """The compiled prefill with a compiled backward (`linattn.kernels.cpu_backward`).

    Inputs: float32 ``q, k [T, H, Dk]`` (already at the value heads), ``v [T, H, Dw]``, ``g [T, H, 1 or Dk]`` or
    None, ``beta [T, H]`` or None, ``S0 [N, H, Dk, Dw]``, then ``cu`` (int64 NumPy), the scale and the checkpoint
    spacing. Returns the unnormalized read ``[T, H, Dw]`` and the final states ``[N, H, Dk, Dw]``. Saved for the
    backward: the inputs and one state every ``every`` tokens (T / every states per head).
    """

    @staticmethod
    def forward(ctx, q, k, v, g, beta, S0, cu, scale, every):
        ST = to_kernel_layout(S0)
        o = buffers.empty(tuple(v.shape))
        T, H, Dw = v.shape
        threads = loop_threads(T, len(cu) - 1, H, q.shape[-1], Dw, value_rows=Dw)
        ckpt = kernel("cpu_prefill").prefill(f32(q), f32(k), f32(v), f32(g), f32(beta), cu, buffers.array(ST),
                                             buffers.array(o), scale=scale, eps=0.0, clamp=False, normalize=False,
                                             every=every, threads=threads)
        ctx.save_for_backward(q, k, v, g, beta, S0)
        ctx.ckpt, ctx.cu, ctx.scale, ctx.every, ctx.S0_dtype = ckpt, cu, scale, every, S0.dtype
        return o, from_kernel_layout(ST).contiguous()

    @staticmethod
    def backward(ctx, grad_o, grad_S):
        if torch.is_grad_enabled():  # create_graph=True: the gradient itself will be differentiated
            return exact_backward(ctx, grad_o, grad_S)
        q, k, v, g, beta, _ = ctx.saved_tensors
        N, H, Dk, Dw = len(ctx.cu) - 1, q.shape[1], q.shape[2], v.shape[2]
        # (The incoming gradients may be negative views, which autograd makes: resolved before NumPy reads them.)
        dST = (torch.zeros(N, H, Dw, Dk) if grad_S is None
               else to_kernel_layout(grad_S.resolve_neg()))
        do = torch.zeros(v.shape) if grad_o is None else grad_o.resolve_neg().to(torch.float32).contiguous()
        threads = loop_threads(q.shape[0], N, H, Dk, Dw)
        # torch's own tensors, written through views: the gradients stay resizable (torch.from_numpy's are not)
        dq, dk, dv = (buffers.empty(tuple(x.shape)) for x in (q, k, v))
        dg = None if g is None else torch.empty(g.shape, dtype=torch.float32)
        dbeta = None if beta is None else torch.empty(beta.shape, dtype=torch.float32)
        view = buffers.array
        kernel("cpu_backward").backward(f32(q), f32(k), f32(v), f32(g), f32(beta), ctx.cu, ctx.ckpt, view(dST),
                                        view(do), view(dq), view(dk), view(dv), None if dg is None else view(dg),
                                        None if dbeta is None else view(dbeta), scale=ctx.scale, every=ctx.every,
                                        threads=threads)
        return dq, dk, dv, dg, dbeta, from_kernel_layout(dST).to(ctx.S0_dtype), None, None, None


def exact_backward(ctx, grad_o, grad_S):
    """The compiled prefill's gradient as a differentiable function of its inputs (for Hessian-vector products and
    gradient penalties): the forward recomputed in the torch chunk forms, differentiated with ``create_graph``."""
    inputs = ctx.saved_tensors
    wanted = [i for i, x in enumerate(inputs) if x is not None and ctx.needs_input_grad[i]]
    with torch.enable_grad():
        o, S = torch_prefill(*inputs, ctx.cu, ctx.scale)
    # An output that depends on no input requiring grad has no graph (the final state, when only q requires
    # grad: it holds keys and values alone); it contributes nothing.
    pairs = [(out, gr) for out, gr in ((o, grad_o), (S, grad_S)) if gr is not None and out.requires_grad]
    got = torch.autograd.grad([p[0] for p in pairs], [inputs[i] for i in wanted], [p[1] for p in pairs],
                              create_graph=True, allow_unused=True) if pairs else [None] * len(wanted)
    grads: list = [None] * 9
    for i, gr in zip(wanted, got, strict=True):
        grads[i] = torch.zeros_like(inputs[i]) if gr is None else gr
    return tuple(grads)


def torch_prefill(q, k, v, g, beta, S0, cu, scale):
    """What `CompiledPrefill` computes, in the torch chunk forms (differentiable to any order), one packed
    sequence at a time: ``q, k [T, H, Dk]``, ``v [T, H, Dw]``, ``g [T, H, 1 or Dk]``, ``beta [T, H]``, ``S0 [N, H,
    Dk, Dw]``; returns the unnormalized read ``[T, H, Dw]`` and the final states ``[N, H, Dk, Dw]``."""
    outs, finals = [], []
    for i in range(len(cu) - 1):
        a, b = int(cu[i]), int(cu[i + 1])
        if a == b:  # an empty sequence passes its state through
            finals.append(S0[i])
            continue

        def heads_first(x, a=a, b=b):  # [T, H, ...] -> [1, H, L, ...]
            return None if x is None else x[a:b].transpose(0, 1).unsqueeze(0)

        gi = heads_first(g)
        if gi is not None and gi.shape[-1] == 1:
            gi = gi[..., 0]  # one gate per head
        form = ops_gated.chunk if beta is None else ops_gated_delta.chunk
        o, S = form(heads_first(q), heads_first(k), heads_first(v), g=gi, beta=heads_first(beta),
                    initial_state=S0[i:i + 1], scale=scale)
        outs.append(o[0].transpose(0, 1))
        finals.append(S[0].to(S0.dtype))
    o = torch.cat(outs) if outs else v.new_zeros(v.shape)
    return o, torch.stack(finals)


def grouped_chunk_refusal(rule: str, q: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None,
                          plain: bool) -> str | None:
    """Why "auto" keeps the token loop for a CPU prefill the kernels take (no grad, no packing, form "chunk"),
    rather than the grouped chunk form (`grouped_prefill`), or None when the policy's rule picks the chunk form."""
    if rule != "gated" or g is None or g.dim() != 3:
        return "only the gated rule with one gate per head runs as grouped matmuls"
    if not plain:
        return "a feature map or a normalizer runs in the token loop"
    B, T, Hq, _ = q.shape
    if not policy.grouped_chunk(T, v.shape[-2] // Hq):
        return "too few tokens or value heads per q/k head for the grouped matmuls to win"
    return None


def grouped_prefill(q, k, v, g, state, scale, *, v_scale=None, skip=None):
    """The grouped chunk form (`linattn.ops.gated.chunk_grouped`) in float32, outside autograd: ``q, k [B, T, Hq,
    N]``, ``v [B, T, H, P]``, ``g [B, T, H]``, ``state [B, H, N, P]`` (float32, not written). Returns ``o [B, T, H,
    P]`` in ``v.dtype`` and the final state ``[B, H, N, P]``, as `prefill` does. ``v_scale [B, T, H]`` and ``skip
    [H]`` or ``[H, P]`` (default None): Mamba-2's dt on the values and D x on the output, folded into the chunk
    form's own passes (`linattn.ops.gated.chunk_grouped`).

    On more than one thread (`policy.grouped_chunk_threads`) the value heads are split into one share per thread,
    each run on the kernels' pool of Python threads with torch on one thread (torch's count is set to 1 for the
    call and then restored, so other torch work in the process meanwhile runs on one thread): the call then waits
    once, at its end, where torch's own threads would meet at a barrier in each of its hundreds of small
    operations.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    q, k, v32, g = [x.detach().to(torch.float32) for x in (q, k, v, g)]  # (no copy when float32 already)
    state = state.detach()
    out = buffers.empty(tuple(v.shape))  # advised onto huge pages: no 4 KiB page faults as it is written
    B, _, G, N = q.shape
    H, P = v.shape[-2:]
    torch_threads = torch.get_num_threads()
    threads = policy.grouped_chunk_threads(torch_threads, H)
    if threads == 1:
        _, S = ops_gated.chunk_grouped(q, k, v32, g, initial_state=state, chunk_size=policy.GROUPED_CHUNK_SIZE,
                                       scale=scale, out=out, v_scale=v_scale, skip=skip)
    else:
        S = torch.empty(B, H, N, P)

        def share(heads: tuple[int, int]) -> None:
            h0, h1 = heads
            g0, g1 = h0 * G // H, (h1 * G - 1) // H + 1  # the q/k groups those heads read
            S[:, h0:h1] = ops_gated.chunk_grouped(
                q[:, :, g0:g1], k[:, :, g0:g1], v32[:, :, h0:h1], g[:, :, h0:h1], initial_state=state[:, h0:h1],
                chunk_size=policy.GROUPED_CHUNK_SIZE, scale=scale, out=out[:, :, h0:h1],
                v_scale=None if v_scale is None else v_scale[:, :, h0:h1],
                skip=None if skip is None else skip[h0:h1])[1]

        shares = head_shares(G, H // G, threads)
        torch.set_num_threads(1)  # (a pool thread takes torch's count at its first torch operation: 1 from here)
        try:
            kernel("cpu_threads").on_threads(lambda lo, hi: [share(s) for s in shares[lo:hi]], len(shares),
                                             len(shares))
        finally:
            torch.set_num_threads(torch_threads)
    o = out if v.dtype == torch.float32 else buffers.empty(tuple(out.shape), v.dtype).copy_(out)
    return o, S.contiguous()


def head_shares(G: int, Hg: int, n: int) -> list[tuple[int, int]]:
    """The value heads ``[h0, h1)`` of ``n`` shares about equal, none across two q/k groups (each of G groups has
    Hg heads): whole groups when there are at least ``n``, else each group cut into parts."""
    if G >= n:
        cuts = [G * j // n * Hg for j in range(n + 1)]
    else:
        parts = -(-n // G)
        cuts = sorted({grp * Hg + Hg * j // parts for grp in range(G) for j in range(parts)} | {G * Hg})
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def step(rule, q, k, v, g, beta, state, normalize, eps, eps_mode, inplace, backend):
    """One decode token on the numba kernel (the general step: any batch, threads over heads); arguments as
    `linattn.backends.step` takes them. None when the torch form should run (a strided state in place)."""
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
    # One thread: the token loop's decode step runs serially (linattn.backends.policy.DECODE_SPLIT_MIN_ENTRIES).
    kernel("cpu_loop").run(f32(q, (B, 1, H, Dk)), f32(k, (B, 1, H, Dk)), f32(v, (B, 1, H, Dv)),
                           f32(g, (B, 1, H, -1 if g is None or g.dim() == 3 else 1)), f32(beta, (B, 1, H)),
                           buffers.array(state), buffers.array(o).reshape(B, 1, H, Dv), scale=1.0, eps=float(eps),
                           clamp=eps_mode == "clamp", normalize=normalize)
    if inplace:
        torch.autograd.graph.increment_version(state)  # written through NumPy: autograd must know
    return o.to(v.dtype), state
