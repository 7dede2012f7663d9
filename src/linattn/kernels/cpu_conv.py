"""Compiled CPU kernels (numba) for the short causal convolution of the linear layers: one fused pass forward,
one backward, instead of the K shifted multiply-adds, the activation and their autograd graph (on CPU the
depthwise convolution is small, memory-bound work that torch spreads over many passes), and the one-token
update of a rolling input window (decode).

Layouts: ``xs [B, K-1+T, C]`` (the history, then the inputs; any strides), ``wT [K, C]`` (tap j reads token
t - (K-1-j)), ``bias [C]``, ``offs [T]`` each token's position inside its own sequence (packed inputs: a tap that
would reach into the previous sequence reads zero), ``pre``/``y``/``gy [B, T, C]``. Serial: one pass over memory,
no thread pool.
"""

from __future__ import annotations

import math

import numba
import numpy as np

_FLAGS = dict(cache=True, nogil=True, error_model="numpy", fastmath={"contract"})


@numba.njit(**_FLAGS)
def forward(xs, wT, bias, offs, packed, pre):
    """pre = bias + sum_j wT[j] * xs[t + j], masked across packed boundaries (the activation is torch's: its exp
    is vectorized)."""
    B, TK, C = xs.shape
    K = wT.shape[0]
    T = TK - K + 1
    for b in range(B):
        for t in range(T):
            for c in range(C):
                pre[b, t, c] = bias[c] + wT[K - 1, c] * xs[b, t + K - 1, c]
            for j in range(K - 1):
                if packed and offs[t] < K - 1 - j:
                    continue
                for c in range(C):
                    pre[b, t, c] += wT[j, c] * xs[b, t + j, c]


@numba.njit(**_FLAGS)
def backward(xs, wT, offs, packed, silu, pre, sig, gy, gxs, gwT, gb):
    """Gradients of silu(`forward`) given ``sig = sigmoid(pre)`` (of `forward` itself when ``silu`` is
    False; ``sig`` is then unread): ``gxs [B, K-1+T, C]`` (history rows first), ``gwT [K, C]`` and ``gb [C]``
    (both summed in float64)."""
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
                    p, s = pre[b, t, c], sig[b, t, c]
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
