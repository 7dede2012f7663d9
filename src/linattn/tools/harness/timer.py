"""The one timer of the tools: wall time of calls on the CPU (``perf_counter_ns``) or on a CUDA device (events),
as samples with their median and quantiles.

* `time_call`: one function, its first call timed apart (it compiles and warms caches) and used to size the
  samples (fast calls repeat inside a sample, slow calls get fewer samples);
* `time_turns`: several functions taking turns in blocks, so that a change of load on a shared machine hits
  each of them alike; optionally a hook before each call (a barrier) and process CPU time next to wall time;
* `time_batch`: the mean of one batch of calls between two marks (CUDA: no synchronization inside).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Observe = Callable[[int, Any], None]


@dataclass(frozen=True)
class Timing:
    """Seconds per call of every timed sample, in the order taken (a sample is ``calls_per_sample`` calls)."""

    samples_s: tuple[float, ...]
    calls_per_sample: int = 1
    first_call_s: float | None = None  # the first call, timed apart (compilation, cold caches); not a sample
    cpu_samples_s: tuple[float, ...] | None = None  # process CPU seconds per call, where asked for

    def quantile(self, q: float) -> float:
        """Linear interpolation between samples (numpy's default), ``q`` in [0, 1]."""
        return float(np.quantile(np.asarray(self.samples_s, dtype=np.float64), q))

    @property
    def median_s(self) -> float:
        return self.quantile(0.5)

    @property
    def mean_s(self) -> float:
        return float(np.mean(self.samples_s))

    @property
    def min_s(self) -> float:
        return min(self.samples_s)

    @property
    def max_s(self) -> float:
        return max(self.samples_s)


def synchronize(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _mark(device: str) -> Any:
    if device == "cuda":
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter_ns()


def _seconds(start: Any, end: Any, device: str) -> float:
    """Seconds between two marks (CUDA marks must be synchronized first)."""
    if device == "cuda":
        return start.elapsed_time(end) / 1e3
    return (end - start) / 1e9


def time_turns(fns: Sequence[Callable[[], Any]], *, repeats: int, warmup: int = 0, block: int = 1,
               device: str = "cpu", before: Callable[[], None] | None = None, observe: Observe | None = None,
               cpu_time: bool = False) -> list[Timing]:
    """Time every call of each function: each one's ``warmup`` calls first, then the timed calls in turns of
    ``block`` calls per function. Blocks keep a function's own data in cache; turns spread a change of load over
    all of them alike. ``before()`` runs untimed before every call (e.g. a barrier between processes);
    ``observe(j, output)`` sees every output, outside the timed window. ``cpu_time``: also the process CPU time
    of each call (all threads; CPU device only). On CUDA the marks are events, read after one final sync."""
    if repeats < 1 or warmup < 0 or block < 1:
        raise ValueError(f"repeats >= 1, warmup >= 0 and block >= 1 needed, got {repeats}, {warmup}, {block}")
    n = len(fns)
    marks: list[list[tuple[Any, Any]]] = [[] for _ in range(n)]
    cpu: list[list[float]] = [[] for _ in range(n)]

    def one(j: int, timed: bool) -> None:
        if before is not None:
            before()
        c0 = time.process_time() if cpu_time else 0.0
        start = _mark(device)
        out = fns[j]()
        end = _mark(device)
        if timed:
            marks[j].append((start, end))
            if cpu_time:
                cpu[j].append(time.process_time() - c0)
        if observe is not None:
            observe(j, out)

    for j in range(n):
        for _ in range(warmup):
            one(j, timed=False)
    for start in range(0, repeats, block):
        for j in range(n):
            for _ in range(min(block, repeats - start)):
                one(j, timed=True)
    synchronize(device)
    return [Timing(tuple(_seconds(a, b, device) for a, b in marks[j]),
                   cpu_samples_s=tuple(cpu[j]) if cpu_time else None) for j in range(n)]


def time_call(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, min_sample_s: float = 0.0,
              budget_s: float = math.inf, device: str = "cpu") -> Timing:
    """Median-ready samples of one function. The first call is timed apart (``first_call_s``) and sizes the
    samples: a fast call repeats inside a sample until the sample lasts ``min_sample_s`` (timer resolution), a
    slow one gets fewer than ``repeats`` samples (at least one) so that the samples fit in ``budget_s``. The other
    ``warmup - 1`` warm-up calls are untimed."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    inner = max(1, math.ceil(min_sample_s / max(first, 1e-7)))
    n = max(1, min(repeats, int(budget_s // max(first * inner, 1e-9)))) if math.isfinite(budget_s) else repeats
    marks = []
    for _ in range(n):
        start = _mark(device)
        for _ in range(inner):
            fn()
        marks.append((start, _mark(device)))
    synchronize(device)
    return Timing(tuple(_seconds(a, b, device) / inner for a, b in marks), calls_per_sample=inner,
                  first_call_s=first)


def time_batch(fn: Callable[[], Any], calls: int, *, device: str = "cpu") -> tuple[float, Any, Any]:
    """Mean seconds per call over ``calls`` back-to-back calls between two marks, with the first and the last
    output (nothing runs between the calls, so on CUDA the queue never drains inside the batch)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    synchronize(device)
    start = _mark(device)
    first = out = fn()
    for _ in range(calls - 1):
        out = fn()
    end = _mark(device)
    synchronize(device)
    return _seconds(start, end, device) / calls, first, out
