"""The machine a run measured on, described once for every tool: processor name, cores and threads, load
average, versions, the float32 matmul rate and copy bandwidth measured in the same run, and how busy the rest of
the machine kept the CPU while the run measured (``/proc/stat`` minus this process's own CPU time)."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from linattn.tools.harness.timer import time_call

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
    """Average number of cores that *other* processes kept busy between `start` and `stop`:
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
    """Why the CPU was contended, or None: other processes kept more than `BUSY_SHARE` of the cores busy
    (the reason adds when, with this run's threads, that is more than there are cores)."""
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


# ------------------------------------------------------------------------------------------------ identity
DISTRIBUTIONS = ("torch", "linattn", "numpy", "numba", "flash-linear-attention", "fla-core", "transformers", "triton")


def processor_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what ``platform`` knows, else "unknown"."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def device_name(device: str) -> str:
    """The CUDA device's name on "cuda" (when present), else the processor's."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
    return processor_name()


def versions(dists: tuple[str, ...] = DISTRIBUTIONS) -> dict[str, str | None]:
    """Installed version of each distribution, None where absent."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def describe() -> dict[str, Any]:
    """Processor, cores, torch threads, load average (1, 5, 15 min), Python, platform and versions."""
    import torch

    return {"processor": processor_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "loadavg": load_info()["loadavg"], "python": platform.python_version(), "platform": platform.platform(),
            "versions": versions()}


# ------------------------------------------------------------------------------------------------ rates
def matmul_rate(n: int = 2048, *, dtype: str = "float32", device: str = "cpu", repeats: int = 5,
                min_sample_s: float = 0.02, budget_s: float = 10.0) -> dict[str, Any]:
    """The machine's n x n x n matmul rate right now (median of the samples): ``{"n", "dtype", "median_ms",
    "gflops"}``. The yardstick for compute-bound kernels measured in the same run."""
    import torch

    dt = getattr(torch, dtype)
    a, b = torch.randn(n, n, device=device).to(dt), torch.randn(n, n, device=device).to(dt)
    c = torch.empty(n, n, device=device, dtype=dt)
    t = time_call(lambda: torch.mm(a, b, out=c), repeats=repeats, min_sample_s=min_sample_s, budget_s=budget_s,
                  device=device)
    return {"n": n, "dtype": dtype, "median_ms": t.median_s * 1e3, "gflops": 2 * n**3 / t.median_s / 1e9}


def copy_bandwidth(numel: int = 1 << 26, *, dtype: str = "float32", device: str = "cpu", repeats: int = 5,
                   min_sample_s: float = 0.02, budget_s: float = 10.0) -> dict[str, Any]:
    """Bytes read plus bytes written per second by ``dst.copy_(src)`` of ``numel`` elements (median):
    ``{"bytes_per_side", "median_ms", "gbps"}``. The yardstick for memory-bound kernels (a small size may sit in
    cache and read far above the memory's rate)."""
    import torch

    src = torch.ones(numel, device=device, dtype=getattr(torch, dtype))
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), repeats=repeats, min_sample_s=min_sample_s, budget_s=budget_s,
                  device=device)
    side = src.numel() * src.element_size()
    return {"bytes_per_side": side, "median_ms": t.median_s * 1e3, "gbps": 2 * side / t.median_s / 1e9}
