"""The grouped chunk form (`linattn.ops.gated.chunk_grouped`, Mamba-2's SSD in matmuls) against the numba token
loop, and against ggml's ``ggml_ssm_scan`` when its library loads, for the Mamba-2 prefill: the gated rule with one
gate per head and q/k shared by groups of value heads. One process, B = 1, float32, runs interleaved, medians.

Rows:

* ``layers``: Mamba-2-2.7B's layer (80 value heads of dim 64, state 128, 1 group) and Nemotron-H-8B's (128 heads,
  8 groups) at ``--T`` tokens (ggml_bench.py's inputs and gates), at each of ``--threads``: the token loop
  (``backend="cpu"``), what ``backend="auto"`` runs (the plan is printed), ``chunk_grouped`` itself at each of
  ``--chunks`` tokens per chunk, ``chunk_grouped`` run on blocks of ``--head-blocks`` value heads one after
  the other (each block's state small enough for the core's cache; chunk 32), and ggml (``--lib``, as in
  scripts/ggml_bench.py);
* ``sweep`` (the policy's thresholds, `linattn.backends.policy.GROUPED_CHUNK_MIN_TOKENS` / ``_MIN_GROUP``): 128
  value heads of dim 64, state 128, over T and over the value heads per q/k head, the chunk form's time over the
  token loop's (below 1: the chunk form is faster).

``auto`` splits the value heads over threads, one share per Python thread with torch on one thread; ``chunk C``
calls ``chunk_grouped`` on torch's own threads. ``--busy-core`` keeps one core busy with a spinning process
meanwhile, as on a machine shared with other work.

    PYTHONPATH=src python scripts/ssd_prefill_ab.py --lib /work/tmp/ggml2/build/src \\
        --out benchmarks/results/ssd_prefill_ab_cpu.txt

writes the table atomically (refusing to replace a file without ``--overwrite``); without ``--out`` it prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba
import torch
import torch.nn.functional as F

import linattn
from linattn import buffers
from linattn.backends import cpu as cpu_backend
from linattn.ops.gated import chunk_grouped
from linattn.tools.harness.results import atomic_write

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggml_bench  # noqa: E402  (scripts/ggml_bench.py: ggml's loader and the Mamba-2 rows)

LAYERS = {"Mamba-2-2.7B": (80, 1), "Nemotron-H-8B": (128, 8)}  # value heads, groups (P = 64, N = 128)


def inputs(T: int, H: int, G: int, P: int = 64, N: int = 128, seed: int = 0):
    """ggml_bench.py's Mamba-2 inputs mapped to linattn's: q = C, k = B, v = softplus(dt) x, g = softplus(dt) A."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, T, H, P, generator=gen)
    dt = torch.randn(1, T, H, generator=gen) - 2
    A = -torch.rand(H, generator=gen) * 8 - 1
    Bm, Cm = (torch.randn(1, T, G, N, generator=gen) for _ in range(2))
    d = F.softplus(dt)
    return Cm, Bm, d[..., None] * x, d * A


def medians_ms(fns: dict, repeats: int) -> dict:
    """Median ms of each function, interleaved, after one untimed round."""
    samples = {name: [] for name in fns}
    for r in range(repeats + 1):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            if r:
                samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) * 1e3 for name, s in samples.items()}


def calls(q, k, v, g, chunks, head_blocks=()):
    """The token loop, auto, chunk_grouped at each chunk size and on blocks of value heads, each returning (o,
    final state [B, H, N, P])."""
    kw = dict(rule="gated", g=g, normalize=False, scale=1.0, output_final_state=True)

    def loop():
        o, st = linattn.linear_attention(q, k, v, backend="cpu", **kw)
        return o, st.S

    def auto():
        o, st = linattn.linear_attention(q, k, v, **kw)
        return o, st.S

    fns = {"token loop": loop, "auto": auto}
    out = buffers.empty(tuple(v.shape))
    S0 = torch.zeros(v.shape[0], v.shape[2], q.shape[-1], v.shape[-1])
    for C in chunks:
        fns[f"chunk {C}"] = lambda C=C: chunk_grouped(q, k, v, g, initial_state=S0, chunk_size=C, scale=1.0, out=out)
    H, G = v.shape[2], q.shape[2]
    for hb in head_blocks:
        if (H // G) % hb:
            continue  # a block must lie within one q/k group

        def blocked(hb=hb):
            S = torch.empty_like(S0)
            for h0 in range(0, H, hb):
                grp = h0 // (H // G)
                S[:, h0:h0 + hb] = chunk_grouped(q[:, :, grp:grp + 1], k[:, :, grp:grp + 1], v[:, :, h0:h0 + hb],
                                                 g[:, :, h0:h0 + hb], initial_state=S0[:, h0:h0 + hb], chunk_size=32,
                                                 scale=1.0, out=out[:, :, h0:h0 + hb])[1]
            return out, S
        fns[f"blocks of {hb}"] = blocked
    return fns


def rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def layer_rows(args, lib, lines):
    g_lib = ggml_bench.load_ggml(lib) if lib else None
    for name, (H, G) in LAYERS.items():
        q, k, v, g = inputs(args.T, H, G)
        plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, normalize=False, scale=1.0)
        lines.append(f"{name}: H={H} G={G} P=64 N=128 T={args.T}; auto's plan: {plan}")
        graphs = None
        if g_lib is not None:
            gb, gcpu, _ = g_lib
            gp, gd, cases = ggml_bench.mamba2_cases(gb, gcpu, name, H, 64, 128, G, args.T, args.repeats + 2)
            graphs = (gp, gd, cases[0])
        try:
            for threads in args.threads:
                torch.set_num_threads(threads)
                numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                fns = calls(q, k, v, g, args.chunks, args.head_blocks)
                o_ref, S_ref = fns["token loop"]()
                diffs = {n: max(rel(o, o_ref), rel(S, S_ref)) for n, (o, S) in
                         ((n, f()) for n, f in fns.items() if n != "token loop")}
                if graphs is not None:
                    case = graphs[2]
                    (d_ggml, _), _ = case["check"](threads)
                    fns["ggml"] = lambda c=case, t=threads: (c["setup"](), c["ggml"](t))
                    diffs["ggml"] = d_ggml
                ms = medians_ms(fns, args.repeats)
                load = os.getloadavg()[0]
                base = ms["token loop"]
                parts = [f"{n} {t:7.1f} ms ({t / base:4.2f}x)" for n, t in ms.items()]
                lines.append(f"  {threads}t  " + "  ".join(parts) + f"  load {load:.1f}")
                lines.append("      max rel diff vs the token loop (ggml: vs linattn): " +
                             "  ".join(f"{n} {d:.1e}" for n, d in diffs.items()))
                print(lines[-2], flush=True)
        finally:
            if graphs is not None:
                graphs[0].close()
                graphs[1].close()


def sweep_rows(args, lines):
    """Chunk form over token loop time, 128 value heads of dim 64, state 128: over T at 16 value heads per q/k head
    (Nemotron-H-8B's grouping), and over the grouping at T = 1024."""
    lines.append("sweep: 128 value heads of dim 64, state 128; time of the chunk form as auto runs it (its chunk size, "
                 "shares of heads on threads) over the token loop's (below 1: the chunk form is faster), token loop "
                 "ms in brackets")
    grid = [(16, T) for T in (128, 256, 512, 1024, 2048)] + [(group, 1024) for group in (2, 4, 8, 32, 128)]
    for threads in args.threads:
        torch.set_num_threads(threads)
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        for group, T in grid:
            q, k, v, g = inputs(T, 128, 128 // group)
            S0 = torch.zeros(1, 128, 128, 64)
            fns = {"token loop": calls(q, k, v, g, [])["token loop"],
                   "chunk": lambda q=q, k=k, v=v, g=g, S0=S0: cpu_backend.grouped_prefill(q, k, v, g, S0, 1.0)}
            ms = medians_ms(fns, args.repeats)
            chunk = ms["chunk"]
            loop = ms["token loop"]
            lines.append(f"  {threads}t  value heads per q/k head {group:3d}  T={T:5d}  {chunk / loop:5.2f}x"
                         f"  ({loop:7.2f} ms)  load {os.getloadavg()[0]:.1f}")
            print(lines[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default=os.environ.get("GGML_LIB_DIR"), help="ggml's library folder (optional)")
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chunks", type=int, nargs="*", default=[32, 64, 128])
    parser.add_argument("--head-blocks", type=int, nargs="*", default=[],
                        help="value heads per block for the blocked rows (sizes that divide a group's heads)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip", choices=["layers", "sweep"], default=None)
    parser.add_argument("--busy-core", action="store_true",
                        help="keep one core busy with a spinning process meanwhile (a machine shared with other work)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    lines = [f"scripts/ssd_prefill_ab.py {' '.join(sys.argv[1:])}",
             f"{ggml_bench.processor()} ({ggml_bench.vector_isa()}), {os.cpu_count()} cores, torch "
             f"{torch.__version__}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
             f"1-min load at start {os.getloadavg()[0]:.1f}; B=1, float32, medians of {args.repeats} interleaved runs"]
    if args.busy_core:
        lines.append("one core kept busy by a spinning process throughout")
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    start = time.perf_counter()
    try:
        with torch.no_grad():
            if args.skip != "layers":
                layer_rows(args, args.lib, lines)
            if args.skip != "sweep":
                sweep_rows(args, lines)
    finally:
        if args.busy_core:
            spinner.kill()
            spinner.wait()
    lines.append(f"took {time.perf_counter() - start:.0f} s; 1-min load at the end {os.getloadavg()[0]:.1f}")
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write(args.out, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=args.overwrite)
    print(text)


if __name__ == "__main__":
    main()
