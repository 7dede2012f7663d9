"""Fresh CPU buffers for outputs and large temporaries, the large ones on transparent huge pages.

A fresh tensor costs a page fault per 4 KiB page on its first write, and glibc maps allocations of 32 MiB and more
anew every time, so for a prefill's output (64 MiB at T = 4096, 32 heads of width 128) the faults recurred on every
call and cost several times the writing itself. A private anonymous mapping advised ``MADV_HUGEPAGE`` faults once
per 2 MiB instead (``scripts/buffers_cost.py`` times both). Where the kernel refuses huge pages
(``transparent_hugepage`` set to ``never``) or ``madvise`` is missing, the mapping behaves like plain memory; off
Linux this is ``torch.empty``. Set ``MIN_BYTES`` higher (``float("inf")``: never) to keep torch's allocator.
"""

from __future__ import annotations

import math
import mmap

import numpy as np
import torch

HUGE_PAGE = 2 << 20
# Smaller buffers come from torch's allocator: glibc serves them from its heap after the first one is freed (its
# mmap threshold rises up to 32 MiB), where a freed buffer's pages are reused without new faults.
MIN_BYTES = 32 << 20
_ADVISE = getattr(mmap, "MADV_HUGEPAGE", None)
_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)


def hugepage_capable() -> bool:
    """Whether large buffers get their own mapping here (Linux-like ``mmap``; huge pages are then the kernel's
    choice)."""
    return _ADVISE is not None and bool(_FLAGS)


def empty(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor, as ``torch.empty(shape, dtype=dtype)``; from ``MIN_BYTES`` on,
    backed by its own mapping on 2 MiB-aligned huge pages (released with the tensor; its storage cannot be
    resized)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES or not hugepage_capable():
        return torch.empty(shape, dtype=dtype)
    try:
        region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=_FLAGS)
    except OSError:  # no mapping to be had: torch's allocator, and its own out-of-memory error
        return torch.empty(shape, dtype=dtype)
    try:
        region.madvise(_ADVISE)
    except OSError:  # huge pages not offered: plain pages, as torch.empty would give
        pass
    raw = np.frombuffer(region, dtype=np.uint8)  # holds the mapping for as long as the tensor lives
    start = -raw.ctypes.data % HUGE_PAGE
    return torch.from_numpy(raw[start:start + nbytes]).view(dtype).view(shape)
