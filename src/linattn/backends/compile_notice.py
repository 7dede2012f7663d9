"""One line on stderr, once per process, when numba starts compiling a linattn CPU kernel: on first use, or after
an upgrade, when numba's disk cache has no machine code for the kernel yet. A warm cache loads the kernels and
prints nothing.

The compile is the long silent part of a first run (``scripts/cold_start.py`` measures it; the figure below is
from ``benchmarks/results/cold_start_cpu.txt``). numba's event API reports each compile that misses the cache
("numba:compile"); loads from the cache send no such event.
"""

from __future__ import annotations

import sys
import threading

from numba.core import event

# What a first run typically waits on a 2-core AMD EPYC: 25-27 s quiet, up to 60 s under load
# (benchmarks/results/cold_start_quiet_cpu.txt, cold_start_cpu.txt).
TYPICAL = "about 25-60 s on 2 cores"
MESSAGE = ("linattn: compiling the CPU kernels for first use ({kernel}; {typical}, once: numba caches them on "
           "disk for later runs)")

_lock = threading.Lock()
_said = False


def _kernel_name(data: dict) -> str | None:
    """The compiled function's module-qualified name when it is one of linattn's kernels, else None."""
    fn = getattr(data.get("dispatcher"), "py_func", None)
    module = getattr(fn, "__module__", None) or ""
    if not module.startswith("linattn.kernels."):
        return None
    return f"{module.rsplit('.', 1)[1]}.{fn.__qualname__.lstrip('_')}"


class _Listener(event.Listener):
    def on_start(self, ev: event.Event) -> None:
        global _said
        if _said:
            return
        kernel = _kernel_name(ev.data or {})
        if kernel is None:
            return
        with _lock:
            if _said:
                return
            _said = True
        print(MESSAGE.format(kernel=kernel, typical=TYPICAL), file=sys.stderr, flush=True)

    def on_end(self, ev: event.Event) -> None:
        pass


_listener: _Listener | None = None


def install() -> None:
    """Listen for compiles (idempotent; the loader in linattn.backends.cpu calls it before a kernel module loads)."""
    global _listener
    with _lock:
        if _listener is None:
            _listener = _Listener()
            event.register("numba:compile", _listener)
