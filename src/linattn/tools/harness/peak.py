"""Peak memory of one call on the CPU: torch's allocator events, read through torch.profiler."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable


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
