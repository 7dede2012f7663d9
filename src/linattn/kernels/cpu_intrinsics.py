"""What the CPU kernels share, compiled into each of them (inlined): raw-pointer arrays and prefetch (LLVM
intrinsics), bfloat16 bits widened to float32, a float32 exp, and the feature maps applied inside the kernels; and
one Python helper: where the prefill's state checkpoints lie (`checkpoint_starts`: the prefill writes them there,
its backward reads them).

numba's disk cache checks only a cached function's own file: after editing this one, delete the kernels' caches
(``__pycache__/*.nbi`` beside them) or they keep the old inlined code.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types as nbtypes
from numba.core import cgutils
from numba.extending import intrinsic, overload

_INLINE = dict(nogil=True, error_model="numpy", fastmath={"contract", "reassoc", "nsz"}, inline="always")


@intrinsic
def f32_pointer(typingctx, address):
    """An integer address as a float32 pointer, for ``numba.carray``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return nbtypes.CPointer(nbtypes.float32)(address), codegen


@intrinsic
def i16_pointer(typingctx, address):
    """An integer address as an int16 pointer (bfloat16 bits), for ``numba.carray``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return nbtypes.CPointer(nbtypes.int16)(address), codegen


@intrinsic
def _float_bits(typingctx, x):
    """The IEEE bits of a float32 as an int32 (a bitcast)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return nbtypes.int32(nbtypes.float32), codegen


@intrinsic
def _prefetch(typingctx, address):
    """Ask for the cache line at an integer address (``llvm.prefetch``: a read, kept in all cache levels)."""

    def codegen(context, builder, signature, args):
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return nbtypes.void(nbtypes.int64), codegen


@intrinsic
def _bits_as_float(typingctx, bits):
    """The float whose IEEE bits are the integer ``bits`` (a bitcast): float32 from an int32, float64 from an int64
    (2**n from its exponent field, in `exp32`)."""
    wide = isinstance(bits, nbtypes.Integer) and bits.bitwidth == 64

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType() if wide else ir.FloatType())

    return (nbtypes.float64(nbtypes.int64) if wide else nbtypes.float32(nbtypes.int32)), codegen


def as_f32(x):
    """An input element as float32: a float32 as it is, an int16 as the bfloat16 whose bits it holds (the prefill
    reads bfloat16 q, k and v in place, with no float32 copy in memory)."""
    raise NotImplementedError("compiled only")


@overload(as_f32, inline="always")
def _f32_overload(x):
    if isinstance(x, nbtypes.Float):
        return lambda x: x
    if isinstance(x, nbtypes.Integer) and x.bitwidth == 16:  # bfloat16 is the top half of a float32
        return lambda x: _bits_as_float(np.int32(np.int64(np.uint16(x)) << 16))
    return None


def bf16_round(x):
    """A float32 rounded to the nearest bfloat16, ties to even, as its int16 bits: what torch's cast to bfloat16
    gives (a NaN becomes the quiet NaN 0x7FC0)."""
    u = np.int64(_float_bits(x)) & 0xFFFFFFFF
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return np.int16(np.uint16(0x7FC0 if x != x else r))


bf16_round_jit = numba.njit(**_INLINE)(bf16_round)


# Feature maps computed inside the kernels, by code (the same definitions as linattn.feature_maps); any other map
# runs in torch first. cpu_decode's cached kernels inline exp32 and features from here, and numba's disk cache
# checks only the cached function's own file: after editing them, delete cpu_decode's cache (__pycache__/*.nbi).
FEATURE_CODES = {None: 0, "identity": 0, "relu1": 1, "elu1": 2, "l2": 3}
L2_EPS = np.float32(1e-6)  # inside the root, as linattn.feature_maps.l2
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def exp32(x):
    """exp of a float32, rounded once to float32 (within 1e-9 relative before that rounding); NaN stays NaN.

    2**t with t = x log2(e) in float64: n = trunc(t), y = (t - n) ln 2 with |y| < ln 2, exp(y) by its Taylor series
    to degree 10 (error 4e-10), times 2**n built from the exponent bits. Inputs are clamped to [-110, 100]
    (exp(-110) rounds to 0 in float32, exp(100) to inf), which also maps -inf to an exact 0. Branch-free, so a
    loop of it vectorizes.
    """
    xc = x if x > np.float32(-110.0) else np.float32(-110.0)  # NaN -> -110 here, put back at the end
    xc = xc if xc < np.float32(100.0) else np.float32(100.0)
    t = np.float64(xc) * _LOG2E
    n = np.int64(t)
    y = (t - np.float64(n)) * _LN2
    p = 1.0 + y * (1.0 + y * (1 / 2 + y * (1 / 6 + y * (1 / 24 + y * (1 / 120 + y * (1 / 720 + y * (
        1 / 5040 + y * (1 / 40320 + y * (1 / 362880 + y * (1 / 3628800))))))))))
    e = np.float32(p * _bits_as_float(np.int64((n + 1023) << 52)))
    return e if x == x else x


def features(x, out, code):
    """``out = phi(x)`` for one head's vector, in float32 (the same definitions as linattn.feature_maps)."""
    n = x.shape[0]
    if code == 3:
        ss = np.float32(0.0)
        for i in range(n):
            ss += x[i] * x[i]
        inv = np.float32(1.0) / np.sqrt(ss + L2_EPS)
        for i in range(n):
            out[i] = x[i] * inv
    elif code == 2:  # elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise
        for i in range(n):
            xi = x[i]
            e = exp32_jit(xi)
            out[i] = xi + np.float32(1.0) if xi > np.float32(0.0) else e
    elif code == 1:  # relu(x) + 1; NaN stays NaN
        for i in range(n):
            xi = x[i]
            out[i] = np.float32(1.0) if xi <= np.float32(0.0) else xi + np.float32(1.0)
    else:
        for i in range(n):
            out[i] = x[i]


def _prefetch_span(at, nbytes):
    """Prefetch every 64-byte line of ``nbytes`` bytes from address ``at``."""
    for off in range(0, nbytes, 64):
        _prefetch(at + off)


prefetch_span_jit = numba.njit(nogil=True, inline="always")(_prefetch_span)
# Tokens ahead that a prefill unit prefetches its inputs: with H heads interleaved, a head's rows of q, k, v sit
# H * D * 4 bytes apart, two per 4 KiB page at H = 8, D = 64, where the hardware prefetchers (which stop at page
# boundaries) do not follow, and each token then waited on its loads from L3.
PREFETCH_AHEAD = 6


exp32_jit = numba.njit(**_INLINE)(exp32)
features_jit = numba.njit(**_INLINE)(features)


def checkpoint_starts(cu: np.ndarray, every: int) -> tuple[np.ndarray, int]:
    """Index of each sequence's first checkpoint (one every ``every`` tokens) and the number of checkpoints."""
    counts = (np.diff(cu) + every - 1) // every
    starts = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    return starts, int(counts.sum())


def expf(x):
    """exp of a float32 in float32 arithmetic (within 1 ulp for inputs in [-87, 88]), for loops where `exp32`'s
    float64 steps cost too much (the convolution's SiLU: twice the lanes per vector). Inputs are clamped to
    [-87, 88] (2**n stays a normal float32; exp(88) = 1.7e38), so it is exact only inside that range; NaN stays NaN.

    n = round(x log2(e)), r = x - n ln 2 in two parts (|r| <= ln 2 / 2), exp(r) by a degree-7 polynomial (the
    Cephes coefficients), times 2**n from the exponent bits. Branch-free, so a loop of it vectorizes."""
    xc = x if x > np.float32(-87.0) else np.float32(-87.0)
    xc = xc if xc < np.float32(88.0) else np.float32(88.0)
    n = np.floor(xc * np.float32(_LOG2E) + np.float32(0.5))
    r = xc - n * np.float32(0.693359375)
    r = r + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * (r * r) + r + np.float32(1.0)
    e = p * _bits_as_float(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
    return e if x == x else x


expf_jit = numba.njit(**_INLINE)(expf)
