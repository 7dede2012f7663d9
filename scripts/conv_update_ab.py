"""HF's one-token ``causal_conv1d_update`` (the short convolution's decode step) on a CPU: HF's own torch function,
linattn's adapter as it was before its one-call path (``--base``, a git commit: its ``conv.py`` adapter loaded
from git, over this tree's `linattn.nn.conv`), and this tree's adapter, side by side.

Geometries (B = 1, kernel 4, HF's cache window of 4): Mamba-2-2.7B's (5376 channels, a bias) and Qwen3.5's
Gated DeltaNet (q, k and v: 2 x 16 x 128 + 32 x 128 = 8192 channels, no bias), SiLU, float32 and bfloat16, at
each of ``--threads``. Per case the three paths run interleaved (the order rotating each round, so that a shared
machine's changing load falls on all alike), each on its own window updated in place, ``--repeats`` rounds;
medians in microseconds, their ratios, and the 1-minute load average before and after each case.

    PYTHONPATH=src python scripts/conv_update_ab.py --out benchmarks/results/conv_update_ab_cpu.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from linattn.integrations import transformers as lt
from linattn.tools.harness.machine import processor_name as processor
from linattn.tools.harness.results import atomic_write

GEOMETRIES = [("Mamba-2-2.7B", 5376, True), ("Qwen3.5 GDN q,k,v", 2 * 16 * 128 + 32 * 128, False)]
K = 4


def base_adapter(commit: str):
    """The ``causal_conv1d_update`` of ``linattn/integrations/transformers/conv.py`` at ``commit``, loaded as a
    module of its own (it imports this tree's `linattn.nn.conv`, whose ``conv_update`` it called)."""
    root = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "-C", str(root), "show", f"{commit}:src/linattn/integrations/transformers/conv.py"],
                         check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("linattn_conv_base", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(src, f"{commit}:conv.py", "exec"), module.__dict__)  # noqa: S102 (the project's own file)
    return module.causal_conv1d_update


def case(C: int, bias: bool, dtype: torch.dtype, repeats: int, base) -> dict:
    gen = torch.Generator().manual_seed(C)
    x = torch.randn(1, 8, C, generator=gen).transpose(1, 2).to(dtype)  # HF passes a projection's slice transposed
    w = torch.randn(C, K, generator=gen).to(dtype)
    b = torch.randn(C, generator=gen).to(dtype) if bias else None
    hf = inspect.unwrap(lt.original(lt.modeling("mamba2"), "causal_conv1d_update"))
    windows = {name: torch.randn(1, C, K, generator=gen).to(dtype) for name in ("HF", "base", "this")}
    paths = {"HF": lambda t: hf(x[..., t:t + 1], windows["HF"], w, b, "silu"),
             "base": lambda t: base(x[..., t:t + 1], windows["base"], w, b, "silu"),
             "this": lambda t: lt.causal_conv1d_update(x[..., t:t + 1], windows["this"], w, b, "silu")}
    names = list(paths)
    times = {n: [] for n in names}
    with torch.no_grad():
        for t in range(20):  # warm: first calls, compiled kernels loaded
            for n in names:
                paths[n](t % 8)
        load0 = os.getloadavg()[0]
        for r in range(repeats):
            order = names[r % 3:] + names[:r % 3]
            for n in order:
                start = time.perf_counter()
                paths[n](r % 8)
                times[n].append(time.perf_counter() - start)
        load1 = os.getloadavg()[0]
    med = {n: statistics.median(v) * 1e6 for n, v in times.items()}
    return dict(med=med, load=(load0, load1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=2000)
    parser.add_argument("--base", default="ba785c1", help="the commit whose adapter is 'base'")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    base = base_adapter(args.base)
    lines = [f"HF's causal_conv1d_update (torch) vs linattn's adapter at {args.base} (base) and this tree (this); "
             f"{processor()}, {os.cpu_count()} logical CPUs, B = 1, kernel 4, window 4, SiLU, "
             f"medians of {args.repeats} interleaved calls (us); load: 1-min load average before-after.",
             f"torch {torch.__version__}, python {sys.version.split()[0]}",
             "",
             f"{'threads':>7}  {'geometry':<26} {'dtype':<9} {'HF us':>8} {'base us':>8} {'this us':>8} "
             f"{'HF/base':>8} {'HF/this':>8} {'base/this':>9}  load"]
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, C, bias in GEOMETRIES:
            for dtype in (torch.float32, torch.bfloat16):
                r = case(C, bias, dtype, args.repeats, base)
                m = r["med"]
                lines.append(f"{threads:>7}  {name + f' ({C})':<26} {str(dtype).removeprefix('torch.'):<9} "
                             f"{m['HF']:8.1f} {m['base']:8.1f} {m['this']:8.1f} {m['HF'] / m['base']:7.2f}x "
                             f"{m['HF'] / m['this']:7.2f}x {m['base'] / m['this']:8.2f}x  "
                             f"{r['load'][0]:.2f}-{r['load'][1]:.2f}")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)
    else:
        print(text)


if __name__ == "__main__":
    main()
