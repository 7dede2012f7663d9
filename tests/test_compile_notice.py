"""The one stderr line a first run prints while numba compiles the CPU kernels: once per process on a cold cache,
never when the cache is warm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parents[1]
# Two kernels compiled in one process (the small convolution kernels: seconds, not the token loops' minutes).
SCRIPT = """
import numpy as np
from linattn.backends import cpu
cpu_conv = cpu.kernel("cpu_conv")  # loaded as linattn loads every kernel: the notice is listening first
x, wT, b = np.ones((1, 4, 3), np.float32), np.ones((2, 3), np.float32), np.zeros(3, np.float32)
hist, offs = np.ones((1, 1, 3), np.float32), np.zeros(4, np.int64)
y, pre = np.empty((1, 4, 3), np.float32), np.empty((1, 4, 3), np.float32)
cpu_conv.forward(x.ctypes.data, 12, 3, 1, hist, True, wT, b, offs, False, True, 0, 4, y, pre, True)
xs, gy = np.ones((1, 5, 3), np.float32), np.full((1, 4, 3), 0.5, np.float32)
gxs, gwT, gb = np.empty_like(xs), np.empty_like(wT), np.empty(3, np.float32)
cpu_conv.backward(xs, wT, offs, False, True, pre, gy, gxs, gwT, gb)
print("ok")
"""


def run(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NUMBA_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)


def test_cold_cache_says_once_that_kernels_compile_and_a_warm_one_says_nothing(tmp_path):
    cold = run(tmp_path)
    assert cold.returncode == 0 and cold.stdout.strip() == "ok", cold.stderr[-2000:]
    lines = [line for line in cold.stderr.splitlines() if line.startswith("linattn: compiling")]
    assert len(lines) == 1, cold.stderr  # two kernels compiled, one line
    assert "cpu_conv.forward" in lines[0] and " s on 2 cores" in lines[0] and "once" in lines[0]
    warm = run(tmp_path)
    assert warm.returncode == 0 and warm.stdout.strip() == "ok", warm.stderr[-2000:]
    assert "linattn: compiling" not in warm.stderr


def test_other_numba_compiles_say_nothing(tmp_path):
    code = "import numba\nfrom linattn.backends import compile_notice as notice\nnotice.install()\n" \
           "print(numba.njit(lambda x: x + 1)(1))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NUMBA_CACHE_DIR": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0 and res.stdout.strip() == "2" and "linattn: compiling" not in res.stderr
