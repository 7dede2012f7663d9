"""How the CPU kernels run on several threads: the parallel and the serial build of a ``prange`` kernel, one launch
of a parallel build at a time, and the per-process pool of Python threads that splits a serial kernel's work
(the prefill's units, the decode step's sequences).

numba's thread pool is the workqueue layer, chosen by `linattn.backends.cpu` before any kernel module loads.
"""

from __future__ import annotations

import os
import threading
import types
from concurrent.futures import ThreadPoolExecutor

import numba


def builds(fn, flags: dict):
    """The parallel and the serial build of ``fn``, each under a name of its own.

    numba's disk cache names an entry by the function's qualified name and first line, not by its options: two
    builds of one function share one entry, and whichever compiled first is loaded for both (the parallel build
    then ran on one thread, or the serial one woke the pool). A copy of the function per build keeps them apart;
    each copy keeps ``fn``'s module, so its cache lies beside that module's file.
    """
    out = []
    for parallel in (True, False):
        name = f"{fn.__name__}_{'parallel' if parallel else 'serial'}"
        clone = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        clone.__qualname__, clone.__doc__ = name, fn.__doc__
        out.append(numba.njit(parallel=parallel, **flags)(clone))
    return tuple(out)


# One launch of a prange build at a time: numba's workqueue threading layer (chosen by linattn.backends.cpu before
# a kernel module loads) allows no other.
_LOCK = threading.Lock()

_POOL: dict[int, ThreadPoolExecutor] = {}  # per process id: a forked child has none of its parent's threads
_POOL_LOCK = threading.Lock()


def on_threads(fn, count: int, threads: int) -> None:
    """``fn(lo, hi)`` over ``threads`` contiguous parts of ``range(count)`` at once, on a pool of Python threads
    (the kernels release the GIL; this thread takes the first part); the first error of any part is raised once
    all have ended."""
    bounds = [count * i // threads for i in range(threads + 1)]
    parts = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
    with _POOL_LOCK:
        pool = _POOL.get(os.getpid())
        if pool is None:
            _POOL.clear()
            pool = _POOL[os.getpid()] = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS - 1),
                                                           thread_name_prefix="linattn-cpu")
    futures = [pool.submit(fn, lo, hi) for lo, hi in parts[1:]]
    error = None
    try:
        for lo, hi in parts[:1]:
            fn(lo, hi)
    except Exception as exc:  # re-raised once the other parts have ended
        error = exc
    for f in futures:
        error = error or f.exception()
    if error is not None:
        raise error


def launch(parallel, serial, args, threads: int):
    """``parallel(*args)`` on ``threads`` threads (one launch at a time: the workqueue layer allows no other), or
    ``serial(*args)`` when ``threads`` is 1; returns what it returns."""
    if threads > 1:
        with _LOCK:
            numba.set_num_threads(threads)
            return parallel(*args)
    return serial(*args)
