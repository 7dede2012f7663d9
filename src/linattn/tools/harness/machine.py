"""Shared by the benchmarks: CPU peak memory (torch's allocator events, via torch.profiler) and how busy the rest
of the machine kept the CPU while a run measured (``/proc/stat`` minus this process's own CPU time)."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def quiet_fd2():
    """Silence file descriptor 2: torch's profiler backend prints start/stop lines there from C++, which would
    break the progress bars."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_peak_bytes(fn: Callable[[], object], calls: int = 1) -> int | None:
    """Peak bytes held by torch's CPU allocator over ``calls`` calls of ``fn``, above what was live before
    (inputs excluded; outputs, temporaries and autograd buffers included): the highest running sum of the
    profiler's allocation and free events in time order. ``None`` if this torch exposes no such events."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_fd2(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(calls):
            out = fn()
            del out
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:
        return None
    live = peak = 0
    # sorted() is stable: events with equal timestamps keep their recorded order
    for _, nbytes in sorted(((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"), key=lambda d: d[0]):
        live += nbytes
        peak = max(peak, live)
    return peak


# ------------------------------------------------------------------------------------------------ contention
# A run is "disturbed" when other processes kept more than this share of the cores busy on average while it
# measured (the threshold `linattn perf` has used since it was written).
BUSY_SHARE = 0.2


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds busy on the whole machine, CPU seconds used by this process) so far; None without /proc."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    ticks = os.sysconf("SC_CLK_TCK")
    me = resource.getrusage(resource.RUSAGE_SELF)
    return (user + nice + system + irq + softirq + steal) / ticks, me.ru_utime + me.ru_stime


class BusyMeter:
    """Average number of cores that *other* processes kept busy between :meth:`start` and :meth:`stop`:
    (machine busy CPU seconds - this process's CPU seconds) / wall seconds. ``None`` where /proc is missing."""

    def start(self) -> BusyMeter:
        self.t0, self.cpu0 = time.perf_counter(), cpu_seconds()
        return self

    def stop(self) -> float | None:
        wall, cpu1 = time.perf_counter() - self.t0, cpu_seconds()
        if self.cpu0 is None or cpu1 is None or wall <= 0:
            return None
        return max(0.0, ((cpu1[0] - self.cpu0[0]) - (cpu1[1] - self.cpu0[1])) / wall)


def others_busy_now(seconds: float = 0.3) -> float | None:
    """Cores other processes keep busy, sampled over ``seconds`` (a quick look before a run starts)."""
    meter = BusyMeter().start()
    time.sleep(seconds)
    return meter.stop()


def busy_reason(others: float | None, cores: int | None, threads: int) -> str | None:
    """Why the CPU was contended, or None: other processes above :data:`BUSY_SHARE` of the cores, or together
    with this run's threads more runnable threads than cores."""
    if others is None or not cores:
        return None
    if others > BUSY_SHARE * cores:
        over = " (with this run's threads, more than there are cores)" if others + threads > cores else ""
        return f"other processes kept {others:.2f} of {cores} cores busy on average{over}"
    return None


def load_info() -> dict[str, Any]:
    """Load average (1, 5, 15 min) and core count, for the record."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = None
    return {"loadavg": load, "cores": os.cpu_count()}
