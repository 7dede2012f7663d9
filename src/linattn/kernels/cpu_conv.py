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

from linattn.kernels.cpu_intrinsics import expf_jit, f32_pointer

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


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
