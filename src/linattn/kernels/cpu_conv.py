"""Compiled CPU kernels (numba) for the short causal convolution of the linear layers: one fused pass forward
(taps, bias and SiLU), one backward, instead of the K shifted multiply-adds, the activation and their autograd
graph (on CPU the depthwise convolution is small, memory-bound work that torch spreads over many passes), and the
one-token update of a rolling input window (decode).

Layouts: `forward` reads ``x [B, T, C]`` where it lies (its address and its batch and token strides, in
elements; channels adjacent), ``hist [B, K-1, C]`` the K-1 inputs before it, ``wT [K, C]`` (tap j reads token
t - (K-1-j)), ``bias [C]``, ``offs [T]`` each token's position inside its own sequence (packed inputs: a tap that
would reach into the previous sequence reads zero), and writes ``y [B, T, C]``. `backward` takes the
history-prefixed ``xs [B, K-1+T, C]`` and ``pre``/``gy [B, T, C]``. Each call runs the tokens it is given: the
caller spreads token ranges over threads.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import types

from linattn.kernels.cpu_intrinsics import as_f32, bf16_round_jit, expf_jit, f32_pointer, i16_pointer

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})
_INLINE = dict(_FLAGS, inline="always")


@numba.njit(**_FLAGS)
def forward(x_at, sB, sT, B, hist, has_hist, wT, bias, offs, packed, silu, t0, t1, y, pre, keep_pre):
    """Tokens ``t0 ... t1 - 1``: ``pre = bias + sum_j wT[j] * x[t - (K-1-j)]`` (tokens before 0 from ``hist``, or
    zero without it; masked across packed boundaries), ``y = silu(pre)`` (``silu``) or ``pre``, and ``pre`` itself
    kept when ``keep_pre`` (for the backward). ``x_at``: the float32 address of x[0, 0, 0]."""
    K, C = wT.shape
    one = np.float32(1.0)
    for b in range(B):
        for t in range(t0, t1):
            out = y[b, t]
            xr = numba.carray(f32_pointer(x_at + (b * sB + t * sT) * 4), (C,))
            for c in range(C):
                out[c] = bias[c] + wT[K - 1, c] * xr[c]
            for j in range(K - 1):
                lag = K - 1 - j
                if packed and offs[t] < lag:
                    continue
                s = t - lag
                if s >= 0:
                    xr = numba.carray(f32_pointer(x_at + (b * sB + s * sT) * 4), (C,))
                    for c in range(C):
                        out[c] += wT[j, c] * xr[c]
                elif has_hist:
                    hr = hist[b, K - 1 + s]
                    for c in range(C):
                        out[c] += wT[j, c] * hr[c]
            if keep_pre:
                p = pre[b, t]
                for c in range(C):
                    p[c] = out[c]
            if silu:  # branch-free exp: the loop vectorizes
                for c in range(C):
                    v = out[c]
                    out[c] = v / (one + expf_jit(-v))


@numba.njit(**_FLAGS)
def backward(xs, wT, offs, packed, silu, pre, gy, gxs, gwT, gb):
    """Gradients of silu(`forward`) (of `forward` itself when ``silu`` is False) from its kept ``pre``:
    ``gxs [B, K-1+T, C]`` (history rows first), ``gwT [K, C]`` and ``gb [C]`` (both summed in float64)."""
    B, TK, C = xs.shape
    K = wT.shape[0]
    T = TK - K + 1
    one = pre.dtype.type(1.0)
    gw = np.zeros((K, C), dtype=np.float64)
    gbias = np.zeros(C, dtype=np.float64)
    gp = np.empty(C, dtype=pre.dtype)
    gxs[:] = 0
    for b in range(B):
        for t in range(T):
            if silu:
                for c in range(C):
                    p = pre[b, t, c]
                    s = one / (one + expf_jit(-p))
                    gp[c] = gy[b, t, c] * s * (one + p * (one - s))
            else:
                for c in range(C):
                    gp[c] = gy[b, t, c]
            for c in range(C):
                gbias[c] += gp[c]
            for j in range(K):
                if j < K - 1 and packed and offs[t] < K - 1 - j:
                    continue
                for c in range(C):
                    gxs[b, t + j, c] += wT[j, c] * gp[c]
                    gw[j, c] += gp[c] * xs[b, t + j, c]
    for j in range(K):
        for c in range(C):
            gwT[j, c] = gw[j, c]
    for c in range(C):
        gb[c] = gbias[c]


@numba.njit(**_FLAGS)
def update(x, window, w, bias, silu, out):
    """One token through the convolution: ``window [B, C, W]`` (W >= K, the last W inputs, oldest first) shifts
    left by one and takes ``x [B, C]`` as its last column, in place; ``out [B, C] = act(bias + sum_j w[:, j]
    window[:, W-K+j])`` with ``w [C, K]``."""
    B, C, W = window.shape
    K = w.shape[1]
    for b in range(B):
        for c in range(C):
            for i in range(W - 1):
                window[b, c, i] = window[b, c, i + 1]
            window[b, c, W - 1] = x[b, c]
            acc = bias[c]
            for j in range(K):
                acc += w[c, j] * window[b, c, W - K + j]
            if silu:
                acc = acc / (1.0 + math.exp(-acc))
            out[b, c] = acc


def _roll(x, sxC, win, w, bias, has_bias, C, W, K, pre):
    """One sequence of `update_hf`: each channel's window row (``win [C * W]``, oldest first) read for the taps,
    then shifted left by one with the token ``x[c * sxC]`` as its last entry; ``pre[c]`` the bias plus the taps in
    float32. Arrays are float32 or bfloat16 bits (int16), widened as read."""
    lo = W - K + 1  # the first window entry a tap reads: taps 0 .. K-2 on entries lo .. W-1, tap K-1 on x
    for c in range(C):
        xv = x[c * sxC]
        r, q = c * W, c * K
        acc = as_f32(bias[c]) if has_bias else np.float32(0.0)
        for j in range(K - 1):
            acc += as_f32(w[q + j]) * as_f32(win[r + lo + j])
        acc += as_f32(w[q + K - 1]) * as_f32(xv)
        for i in range(W - 1):
            win[r + i] = win[r + i + 1]
        win[r + W - 1] = xv
        pre[c] = acc


def _roll_fixed(K: int):
    """`_roll` for a window as long as the kernel (HF's cache: W = K) with K a compile-time constant, in three
    passes that each run straight through memory: the whole window moved left by one element (each row's oldest
    entry falls into the previous row's last, which x then overwrites), x into every row's last entry, then the taps
    over each new row. 1.4x (float32) to 3.5x (bfloat16) faster than one pass per channel, which is 3-4x faster
    than the loops of a runtime K."""

    def roll(x, sxC, win, w, bias, has_bias, C, W, K_, pre):
        for i in range(C * K - 1):
            win[i] = win[i + 1]
        for c in range(C):
            win[c * K + K - 1] = x[c * sxC]
        for c in range(C):
            r = c * K
            acc = as_f32(bias[c]) if has_bias else np.float32(0.0)
            for j in range(K):
                acc += as_f32(w[r + j]) * as_f32(win[r + j])
            pre[c] = acc

    return numba.njit(**_INLINE)(roll)


def _activate(pre, silu, out, C):
    """``out = silu(pre)`` (``silu``) or ``pre``, float32."""
    one = np.float32(1.0)
    for c in range(C):
        v = pre[c]
        if silu:  # branch-free exp: the loop vectorizes
            v = v / (one + expf_jit(-v))
        out[c] = v


def _activate_bf16(pre, silu, out, C):
    """`_activate` into bfloat16 bits (int16 ``out``) the way torch's bfloat16 convolution and SiLU round: ``pre``
    to bfloat16 first, the SiLU of that in float32, rounded again."""
    one = np.float32(1.0)
    for c in range(C):
        v = as_f32(bf16_round_jit(pre[c]))
        if silu:
            v = as_f32(bf16_round_jit(v / (one + expf_jit(-v))))
        out[c] = bf16_round_jit(v)


_roll_jit = numba.njit(**_INLINE)(_roll)
_roll3_jit, _roll4_jit = _roll_fixed(3), _roll_fixed(4)  # LFM2's kernel of 3, every other family's 4


def _roll_any(x, sxC, win, w, bias, has_bias, C, W, K, pre):
    """`_roll`, through its unrolled build where W = K = 3 or 4."""
    if W == K == 4:
        _roll4_jit(x, sxC, win, w, bias, has_bias, C, W, K, pre)
    elif W == K == 3:
        _roll3_jit(x, sxC, win, w, bias, has_bias, C, W, K, pre)
    else:
        _roll_jit(x, sxC, win, w, bias, has_bias, C, W, K, pre)


_roll_any_jit = numba.njit(**_INLINE)(_roll_any)
_activate_jit = numba.njit(**_INLINE)(_activate)
_activate_bf16_jit = numba.njit(**_INLINE)(_activate_bf16)


def _update_hf(x_at, sxB, sxC, win_at, B, C, W, w_at, K, b_at, out_at, silu, bf16):
    """HF's ``causal_conv1d_update`` for one token, in one pass over raw addresses: ``x [B, C]`` at ``x_at`` (its
    strides ``sxB``, ``sxC`` in elements), the window ``[B, C, W]`` contiguous at ``win_at`` (W >= K - 1: the taps
    read its last K - 1 entries and x, then it shifts left by one and takes x), ``w [C, K]`` contiguous, ``bias
    [C]`` at ``b_at`` (0: none), ``out [B, C]`` contiguous; SiLU when ``silu``. All float32, or all bfloat16
    (``bf16``: read as their bits, widened; the output rounded as torch rounds a bfloat16 convolution)."""
    pre = np.empty(C, dtype=np.float32)
    has_bias = b_at != 0
    b_at = b_at if has_bias else w_at  # (never read)
    for b in range(B):
        if bf16:
            x = numba.carray(i16_pointer(x_at + b * sxB * 2), ((C - 1) * sxC + 1,))
            win = numba.carray(i16_pointer(win_at + b * C * W * 2), (C * W,))
            w, bias = numba.carray(i16_pointer(w_at), (C * K,)), numba.carray(i16_pointer(b_at), (C,))
            out = numba.carray(i16_pointer(out_at + b * C * 2), (C,))
            _roll_any_jit(x, sxC, win, w, bias, has_bias, C, W, K, pre)
            _activate_bf16_jit(pre, silu, out, C)
        else:
            x = numba.carray(f32_pointer(x_at + b * sxB * 4), ((C - 1) * sxC + 1,))
            win = numba.carray(f32_pointer(win_at + b * C * W * 4), (C * W,))
            w, bias = numba.carray(f32_pointer(w_at), (C * K,)), numba.carray(f32_pointer(b_at), (C,))
            out = numba.carray(f32_pointer(out_at + b * C * 4), (C,))
            _roll_any_jit(x, sxC, win, w, bias, has_bias, C, W, K, pre)
            _activate_jit(pre, silu, out, C)
    return 0


_SIGNATURE_HF = types.int64(*([types.int64] * 13))
_dispatcher_hf = numba.njit(**_FLAGS)(_update_hf)
_ENTRIES: dict = {}


def update_hf(*args) -> int:
    """`_update_hf` through its compiled wrapper, called directly (numba's dispatcher would spend microseconds
    matching 13 arguments to the overload); compiled, or loaded from the cache, on the first call. The caller
    passes 13 Python ints."""
    entry = _ENTRIES.get("hf")
    if entry is None:
        _dispatcher_hf.compile(_SIGNATURE_HF.args)
        entry = getattr(_dispatcher_hf.overloads.get(_SIGNATURE_HF.args), "entry_point", None) or _dispatcher_hf
        _ENTRIES["hf"] = entry
    return entry(*args)
