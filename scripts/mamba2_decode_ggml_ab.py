"""HF's Mamba-2 decode step (``mamba2_selective_state_update``) on linattn, before and after the compiled step,
against ggml's ``ggml_ssm_scan`` (llama.cpp's op), side by side in one process: Mamba-2-2.7B's layer (80 heads of
dim 64, state 128, 1 group) and Nemotron-H-8B's (128 heads, 8 groups), B = 1, at each of ``--threads``.

Columns, each one decode token, timed as scripts/ggml_bench.py times a decode step (each call after an idle
``--gap-ms``, so the state is as cold as between two layers of a model; medians of ``--repeats`` calls, the
columns interleaved):

* ``ggml``: ``ggml_ssm_scan`` plus the copy of its new state back into the state tensor (llama.cpp's graph);
  ``ggml op``: the op alone. ggml is given dt with dt_bias already added and does not apply D (llama.cpp does
  both in separate ops), so its columns do less work than the adapter's;
* ``old``: the adapter of revision ``--old-rev`` (loaded from git: the time step, v and g in torch, the one-call
  decode kernel, then D in torch); ``new``: this tree's adapter (one compiled call); both with the arguments as
  HF's Mamba-2 layer passes them (dt, A, D, dt_bias expanded from one value per head, dt_softplus, z None),
  float32, on a state in the layout a patched prefill leaves in HF's cache;
* ``old bf16`` / ``new bf16``: the same with bfloat16 activations and D, dt_bias (A float32, the state float32), as
  a bfloat16 checkpoint runs (ggml has no bfloat16 scan: compare with its float32 columns).

Before the timing it checks that old and new agree (output and state, float32) and that new agrees with ggml on a
step without D. Usage, from the repository root (ggml's libraries from scripts/ggml_build.sh):

    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=$PWD/src python scripts/mamba2_decode_ggml_ab.py \\
        --lib /work/tmp/ggml2/build/src --out benchmarks/results/X_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numba
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggml_bench  # noqa: E402

from linattn.integrations.transformers import mamba2 as new  # noqa: E402
from linattn.tools.harness.results import atomic_write  # noqa: E402

ADAPTER = "src/linattn/integrations/transformers/mamba2.py"


def old_module(rev: str):
    """The adapter module as revision ``rev`` has it (its source from git, run as a module of its own)."""
    source = subprocess.run(["git", "show", f"{rev}:{ADAPTER}"], check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("mamba2_old")
    module.__file__ = f"{rev}:{ADAPTER}"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - this repository's own code
    return module


def layer(H, P, N, G, seed=0):
    """One token's raw inputs and the same as HF's layer passes them to the adapter."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, H, P, generator=gen)
    dt = torch.randn(1, H, generator=gen) - 2
    A = -torch.rand(H, generator=gen) * 8 - 1
    Bm, Cm = (torch.randn(1, G, N, generator=gen) for _ in range(2))
    D, bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen) * 0.1
    return x, dt, A, Bm, Cm, D, bias


def hf_args(x, dt, A, Bm, Cm, D, bias, dtype):
    P, N = x.shape[-1], Bm.shape[-1]
    def c(t):
        return t.to(dtype)

    args = (c(x), c(dt)[:, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), c(Bm), c(Cm))
    return args, dict(D=c(D)[:, None].expand(-1, P), dt_bias=c(bias)[:, None].expand(-1, P), dt_softplus=True)


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def rows_for(g, cpu, old, name, H, G, threads_list, args):
    P, N = 64, 128
    x, dt, A, Bm, Cm, D, bias = layer(H, P, N, G)
    S0 = torch.randn(1, H, P, N, generator=torch.Generator().manual_seed(1)) * 0.1
    gd = ggml_bench.Graph(g, cpu, 4 * (2 * H * P + H + 2 * G * N + 3 * H * P * N + H + 1), 12, 30 * args.repeats)
    ts, tx, tdt, tA = gd.tensor((N, P, H, 1)), gd.tensor((P, H, 1, 1)), gd.tensor((H, 1, 1)), gd.tensor((1, H))
    tB, tC, tids = gd.tensor((N, G, 1, 1)), gd.tensor((N, G, 1, 1)), gd.tensor((1,), ggml_bench.I32)
    for t, src in ((tx, x), (tdt, dt + bias), (tA, A), (tB, Bm), (tC, Cm)):
        gd.view(t, tuple(src.shape)).copy_(src)
    gd.view(tids, (1,), torch.int32).zero_()
    res = g.ggml_ssm_scan(gd.ctx, ts, tx, tdt, tA, tB, tC, tids)
    gd.build(res, ts, x.numel())
    y_g, s_g = gd.view(res, (1, H, P)), gd.view(ts, (1, H, P, N))

    def cache_state():  # linattn's memory, HF's view: as a patched prefill leaves HF's cache
        return S0.transpose(-1, -2).contiguous().transpose(-1, -2)

    f32_args, f32_kw = hf_args(x, dt, A, Bm, Cm, D, bias, torch.float32)
    bf_args, bf_kw = hf_args(x, dt, A, Bm, Cm, D, bias, torch.bfloat16)
    states = {k: cache_state() for k in ("old", "new", "old bf16", "new bf16")}
    calls = {
        "ggml": None, "ggml op": None,
        "old": lambda: old.mamba2_selective_state_update(states["old"], *f32_args, **f32_kw),
        "new": lambda: new.mamba2_selective_state_update(states["new"], *f32_args, **f32_kw),
        "old bf16": lambda: old.mamba2_selective_state_update(states["old bf16"], *bf_args, **bf_kw),
        "new bf16": lambda: new.mamba2_selective_state_update(states["new bf16"], *bf_args, **bf_kw),
    }
    out = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        calls["ggml"] = lambda t=threads: gd.compute(t)
        calls["ggml op"] = lambda t=threads: gd.compute(t, op_alone=True)
        # checks: old = new (float32); new = ggml on a step without D
        s_old, s_new = cache_state(), cache_state()
        y_old = old.mamba2_selective_state_update(s_old, *f32_args, **f32_kw)
        y_new = new.mamba2_selective_state_update(s_new, *f32_args, **f32_kw)
        d_old = max(rel(y_new, y_old), rel(s_new, s_old))
        s_g.copy_(S0)
        gd.compute(threads)
        s_nd = cache_state()
        y_nd = new.mamba2_selective_state_update(s_nd, *f32_args, **{**f32_kw, "D": None})
        d_ggml = max(rel(y_nd, y_g), rel(s_nd, s_g))
        s_g.copy_(S0)
        for f in calls.values():
            f()
        samples = {k: [] for k in calls}
        for r in range(args.repeats):
            order = list(calls.items()) if r % 2 == 0 else list(reversed(calls.items()))
            for k, f in order:
                time.sleep(args.gap_ms / 1e3)
                start = time.perf_counter()
                f()
                samples[k].append((time.perf_counter() - start) * 1e6)
        med = {k: statistics.median(v) for k, v in samples.items()}
        cells = "  ".join(f"{k} {med[k]:7.1f}" for k in calls)
        out.append(f"{name:13s} {threads}t  {cells}  | new/ggml {med['new'] / med['ggml']:.2f}  new/old "
                   f"{med['new'] / med['old']:.2f}  new bf16/ggml {med['new bf16'] / med['ggml']:.2f}  "
                   f"new bf16/old bf16 {med['new bf16'] / med['old bf16']:.2f}  | rel diff new-old {d_old:.1e} "
                   f"new-ggml {d_ggml:.1e}  | load {os.getloadavg()[0]:.2f}")
        print(out[-1], flush=True)
    gd.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default=os.environ.get("GGML_LIB_DIR"), help="folder with ggml's CPU libraries")
    parser.add_argument("--old-rev", default="ba785c1", help="git revision of the adapter called old")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=120, help="timed calls per column and row")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="idle time before each timed call")
    parser.add_argument("--out", default=None, help="result text file (an existing one is refused)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args()
    if not args.lib:
        sys.exit("mamba2_decode_ggml_ab: pass --lib DIR (libggml-base.so, libggml-cpu.so) or set GGML_LIB_DIR")
    g, cpu, _ = ggml_bench.load_ggml(args.lib)
    old = old_module(args.old_rev)
    lines = [f"# OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')} PYTHONPATH=src python "
             f"scripts/mamba2_decode_ggml_ab.py --lib {args.lib} --old-rev {args.old_rev} --threads "
             f"{' '.join(map(str, args.threads))} --repeats {args.repeats} --gap-ms {args.gap_ms:g}",
             f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  {ggml_bench.processor()} ({os.cpu_count()} "
             f"cores; {ggml_bench.vector_isa()})  ggml {ggml_bench.ggml_version(g, args.lib)}  torch "
             f"{torch.__version__}  numba {numba.__version__}  load average before {os.getloadavg()[0]:.2f}",
             "# one Mamba-2 decode token, B=1, us per call: medians of single calls each after an idle gap, columns "
             "interleaved; old = the adapter at --old-rev, new = this tree's; ggml = ggml_ssm_scan + the copy of its "
             "state (llama.cpp's graph), ggml op = the op alone (ggml gets dt + dt_bias and skips D: less work "
             "than the adapter's); bf16 = bfloat16 activations, D, dt_bias (float32 A and state); load = 1-min "
             "load average after the row"]
    print("\n".join(lines), flush=True)
    with torch.no_grad():
        for name, H, G in (("Mamba-2-2.7B", 80, 1), ("Nemotron-H-8B", 128, 8)):
            lines += rows_for(g, cpu, old, name, H, G, args.threads, args)
    lines.append(f"# load average after {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    if args.out:
        atomic_write(Path(args.out), lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"),
                     overwrite=args.overwrite)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
