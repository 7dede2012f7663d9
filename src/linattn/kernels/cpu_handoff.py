"""Share a compiled call's chunks with worker threads that are already awake: the decode step split over two
(or more) cores, where waking a sleeping Python thread (100-450 us measured on a loaded 2-core machine) costs more
than the step.

Each worker is a thread that never returns to Python: it runs `serve`, a compiled loop without the GIL that waits
for work by reading a task word (an atomic load and a ``pause``) for at most ``spin_us`` after its last task, then
sleeps on a futex until a call wakes it (so an idle worker burns no core, and a worker preempted by the scheduler
never holds the GIL the caller needs). A call (`Handoff.run`) writes its arguments, posts a task
word (a sequence number and the next chunk's index), and takes chunks itself, one compare-and-swap each, as the
workers do: a worker that is late (asleep, or its core busy) leaves its chunks to the caller, and costs at most
the one chunk it holds, never a wait for the scheduler to wake it.

The chunks run the serial decode kernel (`cpu_decode.decode`'s compiled function) on slices of its work.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time

import numba
import numpy as np
from llvmlite import ir
from numba import types as nbtypes
from numba.core import cgutils
from numba.extending import intrinsic

# control words, each on its own cache line (int64 index): the task word (sequence << 24 | next chunk), chunks
# done, the first bad status; then one word per worker: 1 while it sleeps (a futex, its low 32 bits)
TASK, DONE, STATUS, ASLEEP = 0, 8, 16, 24
_SEQ_SHIFT = 24
_MAX_WORKERS = 64
_WORDS = ASLEEP + 8 * _MAX_WORKERS
# the call's arguments: the decode kernel's 18 integers, then the split: units, units per chunk, kind (0 batch,
# 1 query/key heads, 2 value heads of one group), value heads per query/key head, bytes per unit of q/k, v/o, g,
# beta, state; then how many workers may take chunks
_ARGS = 18 + 10
KIND_BATCH, KIND_QK_HEADS, KIND_VALUE_HEADS = 0, 1, 2
_SYS_FUTEX, _FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 202, 128, 129  # x86-64 Linux


def _i64_pointer(builder, address):
    return builder.inttoptr(address, ir.IntType(64).as_pointer())


@intrinsic
def load_acquire(typingctx, address):
    """The int64 at ``address``, an atomic load (acquire): read anew on every call, never hoisted from a loop."""

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_i64_pointer(builder, args[0]), "acquire", 8)

    return nbtypes.int64(nbtypes.int64), codegen


@intrinsic
def store_release(typingctx, address, value):
    """Store the int64 ``value`` at ``address`` (atomic, release): what was written before is seen first."""

    def codegen(context, builder, signature, args):
        builder.store_atomic(args[1], _i64_pointer(builder, args[0]), "release", 8)
        return context.get_dummy_value()

    return nbtypes.void(nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def exchange(typingctx, address, value):
    """Atomically store ``value`` at ``address`` (sequentially consistent: a full fence); the old value."""

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("xchg", _i64_pointer(builder, args[0]), args[1], "seq_cst")

    return nbtypes.int64(nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def futex(typingctx, address, op, value):
    """libc's ``syscall(SYS_futex, address, op, value, NULL)``: sleep while the 32-bit word at ``address`` is
    ``value`` (wait), or wake up to ``value`` sleepers (wake)."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [i64(_SYS_FUTEX), *args, i64(0)])

    return nbtypes.int64(nbtypes.int64, nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def compare_swap(typingctx, address, expected, value):
    """Atomically replace the int64 at ``address`` by ``value`` if it is ``expected``; whether it was."""

    def codegen(context, builder, signature, args):
        pair = builder.cmpxchg(_i64_pointer(builder, args[0]), args[1], args[2], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return nbtypes.boolean(nbtypes.int64, nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def spin_pause(typingctx):
    """The x86 ``pause`` hint in a wait loop (yields the core's pipeline to its sibling, saves power)."""

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
        builder.call(fn, [])
        return context.get_dummy_value()

    return nbtypes.void(), codegen


@intrinsic
def cycles(typingctx):
    """The processor's time-stamp counter (``llvm.readcyclecounter``; constant rate on current x86)."""

    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(64), []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])

    return nbtypes.int64(), codegen


@intrinsic
def fetch_add(typingctx, address, value):
    """Atomically add ``value`` to the int64 at ``address``; the old value."""

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _i64_pointer(builder, args[0]), args[1], "seq_cst")

    return nbtypes.int64(nbtypes.int64, nbtypes.int64), codegen


@intrinsic
def _as_i64(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return nbtypes.CPointer(nbtypes.int64)(address), codegen


@intrinsic
def _as_f64(typingctx, address):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return nbtypes.CPointer(nbtypes.float64)(address), codegen


@intrinsic
def call_decode(typingctx, address, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16,
                a17, scale, eps):
    """Call the C function at ``address`` with the decode kernel's signature (18 int64, 2 float64 -> int64)."""
    ints = [nbtypes.int64] * 18

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64)] * 18 + [ir.DoubleType()] * 2)
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])

    return nbtypes.int64(nbtypes.int64, *ints, nbtypes.float64, nbtypes.float64), codegen


i64 = nbtypes.int64
_FLAGS = dict(nogil=True, cache=True)


@numba.njit(i64(i64, i64, i64, i64), **_FLAGS)
def run_chunk(fn_at, args_at, fargs_at, c):
    a = numba.carray(_as_i64(args_at), (_ARGS,))
    f = numba.carray(_as_f64(fargs_at), (2,))
    units, per, kind, group = a[18], a[19], a[20], a[21]
    lo = c * per
    n = min(units, lo + per) - lo
    B, Hq, HV = a[8], a[9], a[10]
    if kind == KIND_BATCH:
        B = n
    elif kind == KIND_QK_HEADS:
        Hq, HV = n, n * group
    else:
        HV = n
    qk = lo * a[22]
    return call_decode(fn_at, a[0] + qk, a[1] + qk, a[2] + lo * a[23], a[3] + lo * a[24], a[4] + lo * a[25],
                       a[5] + lo * a[26], a[6] + lo * a[26], a[7] + lo * a[23], B, Hq, HV, a[11], a[12], a[13],
                       a[14], a[15], a[16], a[17], f[0], f[1])

@numba.njit(i64(i64, i64, i64, i64, i64), **_FLAGS)
def take_chunks(fn_at, ctl_at, args_at, fargs_at, seq):
    """Run chunks of task ``seq`` until none is left (or another task is posted); how many."""
    a = numba.carray(_as_i64(args_at), (_ARGS,))
    ran = 0
    while True:
        w = load_acquire(ctl_at + TASK * 8)
        if (w >> _SEQ_SHIFT) != seq:
            return ran
        c = w & ((1 << _SEQ_SHIFT) - 1)
        chunks = (a[18] + a[19] - 1) // a[19]
        if c >= chunks:
            return ran
        if compare_swap(ctl_at + TASK * 8, w, w + 1):
            status = run_chunk(fn_at, args_at, fargs_at, c)
            if status != 0:
                store_release(ctl_at + STATUS * 8, status)
            fetch_add(ctl_at + DONE * 8, 1)
            ran += 1

@numba.njit(i64(i64, i64, i64, i64, i64, i64), **_FLAGS)
def serve(fn_at, ctl_at, args_at, fargs_at, worker, spin_cycles):
    """Worker ``worker``'s loop, for ever: take chunks of every task posted while it may (``worker`` below the
    call's count), wait awake ``spin_cycles`` for the next, then sleep until a call wakes it."""
    a = numba.carray(_as_i64(args_at), (_ARGS,))
    sleep_at = ctl_at + (ASLEEP + 8 * worker) * 8
    last = load_acquire(ctl_at + TASK * 8) >> _SEQ_SHIFT
    while True:
        start = cycles()
        while True:
            seq = load_acquire(ctl_at + TASK * 8) >> _SEQ_SHIFT
            if seq != last:
                last = seq
                if worker < a[27]:
                    take_chunks(fn_at, ctl_at, args_at, fargs_at, seq)
                start = cycles()
            else:
                spin_pause()
                if cycles() - start > spin_cycles:
                    break
        exchange(sleep_at, 1)  # announce, then look once more (the caller posts, then looks at this word)
        if load_acquire(ctl_at + TASK * 8) >> _SEQ_SHIFT != last:
            exchange(sleep_at, 0)
            continue
        while load_acquire(sleep_at) == 1:
            futex(sleep_at, _FUTEX_WAIT_PRIVATE, 1)

@numba.njit(i64(i64, i64, i64, i64, i64, i64), **_FLAGS)
def lead(fn_at, ctl_at, args_at, fargs_at, seq, workers):
    """Post task ``seq`` (its arguments already written), wake the first ``workers`` workers that sleep, take
    its chunks, wait for the workers' last ones; the first non-zero status of a chunk (any one, if several),
    else 0."""
    a = numba.carray(_as_i64(args_at), (_ARGS,))
    chunks = (a[18] + a[19] - 1) // a[19]
    store_release(ctl_at + DONE * 8, 0)
    store_release(ctl_at + STATUS * 8, 0)
    exchange(ctl_at + TASK * 8, seq << _SEQ_SHIFT)
    for i in range(workers):
        sleep_at = ctl_at + (ASLEEP + 8 * i) * 8
        if load_acquire(sleep_at) == 1 and exchange(sleep_at, 0) == 1:
            futex(sleep_at, _FUTEX_WAKE_PRIVATE, 1)
    take_chunks(fn_at, ctl_at, args_at, fargs_at, seq)
    while load_acquire(ctl_at + DONE * 8) != chunks:
        spin_pause()
    return load_acquire(ctl_at + STATUS * 8)




def _cycles_per_us() -> float:
    """The time-stamp counter's rate, measured against ``perf_counter`` over 2 ms."""
    read = numba.njit(lambda: cycles())
    read()
    c0, t0 = read(), time.perf_counter()
    time.sleep(0.002)
    c1, t1 = read(), time.perf_counter()
    return max((c1 - c0) / ((t1 - t0) * 1e6), 1.0)


def supported() -> bool:
    """Whether this machine runs the handoff (its futex call and ``pause`` are x86-64 Linux's)."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


class Handoff:
    """``workers`` threads that take chunks of a call (see the module's docstring), made once per process (they
    live as long as it), each chunk a call of the C function at ``decode_at`` (the decode kernel's signature).
    ``run(args, split, workers)`` runs the decode kernel's arguments ``args`` in chunks as
    ``split`` (units, units per chunk, kind, value heads per query/key head, bytes per unit of q/k, v/o, g, beta,
    state) says, with up to ``workers`` of the threads, and returns the first non-zero status (else 0). One call at
    a time: ``run`` returns None, having run nothing, while another thread is inside it."""

    def __init__(self, decode_at: int, workers: int, spin_us: float):
        self.workers = min(workers, _MAX_WORKERS)
        self._fn = decode_at
        self._ctl = np.zeros(_WORDS, dtype=np.int64)
        self._args = np.zeros(_ARGS, dtype=np.int64)
        self._fargs = np.zeros(2, dtype=np.float64)
        self._seq = 0
        self._busy = threading.Lock()
        spin = int(spin_us * _cycles_per_us())
        self.pid = os.getpid()
        at, args_at, fargs_at = self._ctl.ctypes.data, self._args.ctypes.data, self._fargs.ctypes.data
        for i in range(self.workers):
            threading.Thread(target=serve, args=(decode_at, at, args_at, fargs_at, i, spin),
                             name=f"linattn-handoff-{i}", daemon=True).start()

    def run(self, args: tuple, split: tuple, workers: int) -> int | None:
        if not self._busy.acquire(blocking=False):
            return None
        try:
            a = self._args
            a[:18] = args[:18]
            a[18:27] = split
            a[27] = workers
            self._fargs[:] = args[18:]
            self._seq += 1
            return lead(self._fn, self._ctl.ctypes.data, a.ctypes.data, self._fargs.ctypes.data, self._seq,
                              min(workers, self.workers))
        finally:
            self._busy.release()
