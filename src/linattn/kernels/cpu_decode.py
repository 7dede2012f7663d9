"""The compiled decode step for batch-1 latency: feature map, gate check, write and read in one numba call.

At batch 1 the work of a step (H=8, D=64: one pass over 128 KiB of state) takes a few microseconds, so what
matters is everything around it: each torch op costs about a microsecond to dispatch, and turning a tensor into
a NumPy array another half. This entry takes raw addresses of contiguous float32 CPU tensors (a tenth of that)
and does the rest inside the compiled function: the built-in feature maps, the grouping of value heads, the
check that every gate is <= 0 (before anything is written, so a bad gate leaves the state as it was), and the
fused token loop of :mod:`linattn.kernels.cpu_numba` for one token.

The caller (``linattn.step``) has already proved that shapes, dtypes, layouts and the state's record fit: this
module trusts its arguments. Only the gate values are checked here, because reading them costs a torch
reduction in Python.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from linattn.kernels import cpu_numba

# Feature maps computed inside the kernel, by code; any other map runs in torch first (``linattn.step``).
FEATURE_CODES = {None: 0, "identity": 0, "relu1": 1, "elu1": 2, "l2": 3}
L2_EPS = np.float32(1e-6)  # inside the root, as linattn.feature_maps.l2
OK, BAD_GATE = 0, 1
PARALLEL_MIN_WORK = cpu_numba.PARALLEL_MIN_WORK


@intrinsic
def _f32_pointer(typingctx, address):
    """An integer address (``Tensor.data_ptr()``) as a float32 pointer, for ``numba.carray``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return types.CPointer(types.float32)(address), codegen


def _features(x, out, code):
    """``out = phi(x)`` for one head's vector, in float32 (the same definitions as linattn.feature_maps)."""
    n = x.shape[0]
    if code == 3:
        ss = np.float32(0.0)
        for i in range(n):
            ss += x[i] * x[i]
        inv = np.float32(1.0) / np.sqrt(ss + L2_EPS)
        for i in range(n):
            out[i] = x[i] * inv
    else:
        for i in range(n):
            xi = x[i]
            if code == 1:
                out[i] = max(xi, np.float32(0.0)) + np.float32(1.0)
            elif code == 2:
                out[i] = xi + np.float32(1.0) if xi > 0 else np.float32(np.exp(xi))
            else:
                out[i] = xi


def _decode(q_at, k_at, v_at, g_at, beta_at, S_at, o_at, B, Hq, HV, D, Dv, Dw, gate_width, code, scale, eps,
            clamp, normalize, delta):
    """One token: q, k [B, Hq, D]; v, o [B, HV, Dv]; g [B, HV, gate_width] (gate_width 0: no gate); beta [B, HV]
    (read when ``delta``); S [B, HV, D, Dw] updated in place. Returns OK, or BAD_GATE with nothing written."""
    q = numba.carray(_f32_pointer(q_at), (B, Hq, D))
    k = numba.carray(_f32_pointer(k_at), (B, Hq, D))
    v = numba.carray(_f32_pointer(v_at), (B, 1, HV, Dv))
    S = numba.carray(_f32_pointer(S_at), (B, HV, D, Dw))
    o = numba.carray(_f32_pointer(o_at), (B, 1, HV, Dv))
    if gate_width:
        g = numba.carray(_f32_pointer(g_at), (B, 1, HV, gate_width))
        for b in range(B):
            for h in range(HV):
                for i in range(gate_width):
                    if not g[b, 0, h, i] <= 0:  # NaN too
                        return BAD_GATE
    else:
        g = np.zeros((1, 1, 1, 1), dtype=np.float32)
    beta = numba.carray(_f32_pointer(beta_at), (B, 1, HV)) if delta else np.zeros((1, 1, 1), dtype=np.float32)
    # Features once per query/key head, then one row per value head (head h serves value heads h*G ... h*G+G-1).
    group = HV // Hq
    qf = np.empty((B, 1, HV, D), dtype=np.float32)
    kf = np.empty((B, 1, HV, D), dtype=np.float32)
    for b in range(B):
        for h in range(Hq):
            _features_jit(q[b, h], qf[b, 0, h * group], code)
            _features_jit(k[b, h], kf[b, 0, h * group], code)
            for j in range(1, group):
                qf[b, 0, h * group + j] = qf[b, 0, h * group]
                kf[b, 0, h * group + j] = kf[b, 0, h * group]
    cpu_numba.token_loop_serial(qf, kf, v, g, beta, S, o, scale, eps, clamp, normalize, gate_width > 0, delta,
                                gate_width > 1)
    return OK


_features_jit = numba.njit(inline="always", **cpu_numba._FLAGS)(_features)
decode = numba.njit(**cpu_numba._FLAGS)(_decode)
