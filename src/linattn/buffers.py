"""Fresh CPU buffers for outputs and large temporaries (the large ones advised onto transparent huge pages), and
NumPy views of tensors for the compiled kernels that leave the tensors ordinary.

A fresh tensor costs a page fault per 4 KiB page on its first write, and glibc maps allocations of 32 MiB and more
anew every time, so for a prefill's output (64 MiB at T = 4096, 32 heads of width 128) the faults recurred on every
call and cost several times the writing itself. Memory advised ``MADV_HUGEPAGE`` before its first write faults once
per 2 MiB instead (``scripts/buffers_cost.py`` times both). The buffer stays torch's own allocation (resizable,
freed by torch); only the 2 MiB-aligned part inside it is advised. Where the kernel refuses huge pages
(``transparent_hugepage`` set to ``never``) or ``madvise`` is missing (off Linux), it is plain ``torch.empty``. Set
``MIN_BYTES`` higher (``float("inf")``: never) to skip the advice.
"""

from __future__ import annotations

import ctypes
import math
import mmap

import numpy as np
import torch

HUGE_PAGE = 2 << 20
# Smaller buffers are left as torch's allocator gives them: glibc serves them from its heap after the first one is
# freed (its mmap threshold rises up to 32 MiB), where a freed buffer's pages are reused without new faults.
MIN_BYTES = 32 << 20
_ADVISE = getattr(mmap, "MADV_HUGEPAGE", None)


def _libc_madvise():
    """libc's ``madvise(addr, length, advice)``, or None where there is none to be had."""
    if _ADVISE is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


_madvise = _libc_madvise()


def hugepage_capable() -> bool:
    """Whether large buffers can be advised onto huge pages here (Linux ``madvise``; huge pages are then the
    kernel's choice)."""
    return _ADVISE is not None and _madvise is not None


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, ``torch.empty(shape, dtype=dtype)``; from ``MIN_BYTES`` on, the
    2 MiB-aligned pages inside it advised ``MADV_HUGEPAGE`` before anything touches them. An ordinary tensor in
    every way (its storage resizes and is freed by torch)."""
    x = torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= MIN_BYTES and hugepage_capable():
        at = x.data_ptr()
        start, end = -(-at // HUGE_PAGE) * HUGE_PAGE, (at + nbytes) // HUGE_PAGE * HUGE_PAGE
        if end > start:
            _madvise(start, end - start, _ADVISE)  # a refusal (-1) leaves plain pages, as torch.empty gives
    return x


class _Memory:
    """What `array` hands NumPy: the tensor's memory described by address, and the tensor kept alive."""

    __slots__ = ("__array_interface__", "tensor")


_TYPESTR = {torch.float32: "<f4", torch.float64: "<f8", torch.float16: "<f2", torch.int16: "<i2",
            torch.int32: "<i4", torch.int64: "<i8", torch.uint8: "|u1", torch.bool: "|b1"}


def values(x: torch.Tensor) -> torch.Tensor:
    """``x`` as memory that holds its values: a negative or conjugate view (``torch._neg_view``, ``x.conj()``;
    autograd makes negative views inside some graphs), whose memory holds the negated or conjugated numbers,
    resolved into a copy; any other tensor is ``x`` itself."""
    return x.resolve_conj().resolve_neg() if x.is_neg() or x.is_conj() else x


def readable(x: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor's values, for a kernel to read: `array` of ``values(x)`` (a copy only for a
    negative or conjugate view; autograd is not involved: NumPy reads memory, and ``x.detach()`` under a torch.func
    transform would be a wrapper without any)."""
    return array(values(x))


def array(x: torch.Tensor) -> np.ndarray:
    """A writable NumPy view of a CPU tensor's memory (any strides), for a kernel to write (an output, a state
    updated in place) or read.

    ``x.numpy()`` would mark the tensor's storage as never resizable, for good: the caller's inputs and every
    output would then refuse ``resize_`` and ``torch.cat(..., out=...)``. The view holds ``x`` alive; it must not
    outlive a resize of ``x``, so it is used within one call. A negative or conjugate view is refused (its memory
    does not hold its values: a kernel would read and write them negated); inputs go through `readable`."""
    if x.is_neg() or x.is_conj():
        raise ValueError("a negative or conjugate view's memory does not hold its values: resolve it first "
                         "(linattn.buffers.values)")
    if x.numel() == 0:
        return np.empty(tuple(x.shape), dtype=_TYPESTR[x.dtype])
    mem = _Memory()
    mem.tensor = x
    size = x.element_size()
    mem.__array_interface__ = {"version": 3, "data": (x.data_ptr(), False), "shape": tuple(x.shape),
                               "typestr": _TYPESTR[x.dtype], "strides": tuple(s * size for s in x.stride())}
    return np.asarray(mem)
