"""The compiled CPU kernels against the processor's own limits, at 1 and 2 threads, in one run.

Every rate is a fraction of a limit measured in the same run at the same thread count: the float32 matmul rate
(``torch.mm`` of 1024 x 1024 matrices) for prefill, and the copy bandwidth (``Tensor.copy_`` of as many bytes as
the state) for decode. Timings on a shared machine move between runs, and within one run by 30% and more over
minutes; ratios taken side by side move less. So each prefill case is timed in five rounds, each round the
matmul rate then the call, at 1 thread then at 2, and its fractions and its speed-up are medians of the per-round
ratios.

- prefill, delta and gated_delta, B = 1, T = 8192, H = 8, D = 64 and the Qwen3-Next geometry (T = 4096, 16 q/k
  heads, 32 value heads, D = 128), float32 and bfloat16 inputs, nonzero initial state, final state returned:
  time of ``linattn.linear_attention`` ("auto"), GFLOP/s counting 6 Dk Dv flops per token and value head, the
  fraction of the matmul rate, the 1 -> 2 thread speed-up, and "auto" against ``backend="torch"`` (float32);
- accumulate and gated (elu1 features, T = 8192, H = 8, D = 64): "auto" against "torch" at each thread count,
  GFLOP/s counting 4 Dk Dv flops per token and head;
- decode, one in-place ``linattn.step``: H = 8, D = 64 from a prefill's state and from ``State.zeros``, and the
  Qwen3-Next geometry at B = 1, 4, 16, 1 and 2 threads in alternating blocks; the serial one-call kernel against
  its parallel build (heads split over threads) at 2 threads,
  the bytes a step must move (the state read and written) per second as a fraction of the copy bandwidth;
- with ``--base SRC`` (a ``src`` folder of another revision): that tree's prefill kernel and this one's, alone,
  alternating in one process at 1 thread.

Usage, from the repository root (about 2 minutes on the 2-core AMD EPYC):

    git archive main src | tar -x -C /tmp/linattn-base
    PYTHONPATH=src python scripts/cpu_kernels_bench.py --base /tmp/linattn-base/src --output bench.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import linattn
from linattn.backends import policy
from linattn.kernels import cpu_prefill

THREADS = (1, 2)
PREFILL = {"h8": dict(T=8192, Hq=8, H=8, D=64), "qwen3_next": dict(T=4096, Hq=16, H=32, D=128)}


def processor() -> dict:
    info = {"machine": platform.machine(), "cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["model"] = value.strip()
        if key.strip() == "flags":
            flags = set(value.split())
            info["simd"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in flags]
            break
    return info


def best(fn, reps: int, warm: int = 1) -> tuple[float, float]:
    """(minimum, median) wall seconds of ``reps`` calls after ``warm`` warm-ups."""
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def matmul_rate() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    return 2 * 1024**3 / best(lambda: torch.mm(a, b), 9, 2)[0] / 1e9


def copy_rate(nbytes: int) -> float:
    """GB/s moved (read + write) by copying ``nbytes`` bytes."""
    n = max(nbytes // 4, 1)
    src, dst = torch.randn(n), torch.empty(n)
    reps = max(5, min(2000, int(2e8 // max(nbytes, 1))))

    def many():
        for _ in range(reps):
            dst.copy_(src)

    return 2 * n * 4 * reps / best(many, 5, 1)[0] / 1e9


def prefill_inputs(rule, T, Hq, H, D, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, T, Hq, D, generator=gen)
    k = F.normalize(torch.randn(1, T, Hq, D, generator=gen), dim=-1)
    v = torch.randn(1, T, H, D, generator=gen)
    kw = {"rule": rule}
    if rule in ("gated", "gated_delta"):
        kw["g"] = F.logsigmoid(torch.randn(1, T, H, generator=gen) + 3)
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(1, T, H, generator=gen)
    else:
        q, k = F.elu(q) + 1, F.elu(k) + 1
        kw["feature_map"] = None
    normalize = rule not in ("delta", "gated_delta")
    S0 = torch.randn(1, H, D, D, generator=gen) * 0.1
    kw["initial_state"] = linattn.State(S0, torch.rand(1, H, D, generator=gen) if normalize else None)
    return q.to(dtype), k.to(dtype), v.to(dtype), kw


def side_by_side(call, flops: float, rounds: int = 5) -> dict:
    """``call`` against the matmul rate, each timed right after the other at 1 and at 2 threads, in ``rounds``
    rounds: ms per thread count (the fastest round), GFLOP/s, the fraction of the matmul rate and the 1 -> 2
    speed-up as medians of the per-round ratios (a drift in the machine's speed between rounds cancels)."""
    ms, rate, frac, scaling = {n: [] for n in THREADS}, {n: [] for n in THREADS}, {n: [] for n in THREADS}, []
    for r in range(rounds):
        for n in THREADS:
            torch.set_num_threads(n)
            rate[n].append(matmul_rate())
            t = best(call, 1, 1 if r == 0 else 0)[0]
            ms[n].append(t * 1e3)
            frac[n].append(flops / t / 1e9 / rate[n][-1])
        scaling.append(ms[1][-1] / ms[2][-1])
    out = {}
    for n in THREADS:
        out[f"ms_{n}t"] = min(ms[n])
        out[f"gflops_{n}t"] = flops / min(ms[n]) / 1e6
        out[f"matmul_gflops_{n}t"] = statistics.median(rate[n])
        out[f"of_matmul_{n}t"] = statistics.median(frac[n])
    out["scaling_1_to_2"] = statistics.median(scaling)
    return out


def run_prefill(quick: bool) -> list[dict]:
    rows = []
    for geo, shape in PREFILL.items():
        shape = dict(shape, T=shape["T"] // 8) if quick else shape
        flops = 6 * shape["D"] ** 2 * shape["T"] * shape["H"]
        for rule in ("delta", "gated_delta"):
            for dtype in (torch.float32, torch.bfloat16):
                q, k, v, kw = prefill_inputs(rule, dtype=dtype, **shape)
                row = {"case": f"prefill {rule} {geo} {str(dtype)[6:]}", **shape}
                row.update(side_by_side(partial(linattn.linear_attention, q, k, v, output_final_state=True, **kw),
                                        flops))
                for n in THREADS:
                    torch.set_num_threads(n)
                    if dtype == torch.float32:
                        t_torch, _ = best(partial(linattn.linear_attention, q, k, v, output_final_state=True,
                                                  backend="torch", **kw), 1, 0)  # one call: seconds each
                        row[f"torch_ms_{n}t"] = t_torch * 1e3
                rows.append(row)
                print_row(row)
    return rows


def run_chunk_rules(quick: bool) -> list[dict]:
    rows = []
    shape = dict(T=1024 if quick else 8192, Hq=8, H=8, D=64)
    flops = 4 * shape["D"] ** 2 * shape["T"] * shape["H"]
    for rule in ("accumulate", "gated"):
        q, k, v, kw = prefill_inputs(rule, dtype=torch.float32, **shape)
        row = {"case": f"prefill {rule} h8 float32", **shape}
        for n in THREADS:
            torch.set_num_threads(n)
            mm = matmul_rate()  # right before the calls it is compared with
            for backend in ("auto", "torch", "cpu"):
                t, _ = best(partial(linattn.linear_attention, q, k, v, backend=backend, **kw), 3)
                row[f"{backend}_ms_{n}t"] = t * 1e3
            row[f"cpu_of_matmul_{n}t"] = flops / (row[f"cpu_ms_{n}t"] / 1e3) / 1e9 / mm
            row[f"auto_over_torch_{n}t"] = row[f"auto_ms_{n}t"] / row[f"torch_ms_{n}t"]
        rows.append(row)
        print_row(row)
    return rows


def repeat(fn, calls: int) -> None:
    for _ in range(calls):
        fn()


def decode_case(B, Hq, H, D, zeros: bool):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, D, generator=gen)
    k = F.normalize(torch.randn(B, Hq, D, generator=gen), dim=-1)
    v = torch.randn(B, H, D, generator=gen)
    g, beta = F.logsigmoid(torch.randn(B, H, generator=gen) + 3), torch.rand(B, H, generator=gen)
    if zeros:
        state = linattn.State.zeros(B, H, D, D, normalizer=False)
    else:
        _, state = linattn.linear_attention(q[:, None], k[:, None], v[:, None], rule="gated_delta", g=g[:, None],
                                            beta=beta[:, None], output_final_state=True)
    return lambda: linattn.step(q, k, v, state, rule="gated_delta", g=g, beta=beta, inplace=True)


def run_decode(limits_copy: dict) -> list[dict]:
    rows = []
    cases = [("h8 from prefill", 1, 8, 8, 64, False), ("h8 from State.zeros", 1, 8, 8, 64, True),
             ("qwen3_next B=1", 1, 16, 32, 128, False), ("qwen3_next B=4", 4, 16, 32, 128, False),
             ("qwen3_next B=16", 16, 16, 32, 128, False)]
    for name, B, Hq, H, D, zeros in cases:
        step = decode_case(B, Hq, H, D, zeros)
        state_bytes = B * H * D * D * 4
        calls = max(3, min(500, int(2e8 // state_bytes)))
        many = partial(repeat, step, calls)

        row = {"case": f"decode gated_delta {name}", "B": B, "H": H, "D": D, "state_entries": B * H * D * D}
        times = {n: [] for n in THREADS}
        for _ in range(5):  # thread counts alternate, so a drift in the machine's speed affects both alike
            for n in THREADS:
                torch.set_num_threads(n)
                times[n].append(best(many, 1)[0] / calls)
        for n in THREADS:
            t = min(times[n])
            row[f"us_{n}t"] = t * 1e6
            gbs = 2 * state_bytes / t / 1e9
            row[f"of_copy_{n}t"] = gbs / limits_copy[(state_bytes, n)]
        old = policy.DECODE_SPLIT_MIN_ENTRIES
        policy.DECODE_SPLIT_MIN_ENTRIES = 0  # force the heads split over threads
        torch.set_num_threads(2)
        try:
            row["parallel_us_2t"] = best(many, 5)[0] / calls * 1e6
        finally:
            policy.DECODE_SPLIT_MIN_ENTRIES = old
        row["slower_with_2_threads"] = row["us_2t"] > row["us_1t"] * 1.05
        rows.append(row)
        print_row(row)
    return rows


def load_kernel(src: str):
    """The other tree's prefill module (``cpu_prefill.py``, or ``cpu_numba.py`` in trees from before the kernels
    had a file each), loaded from its file; what it imports from linattn comes from this tree. Its numba disk
    cache goes to a fresh folder: entries cached for a module loaded this way cannot be reloaded by a later process
    (numba looks for '<dynamic>')."""
    import numba

    kernels = Path(src) / "linattn" / "kernels"
    path = kernels / "cpu_prefill.py" if (kernels / "cpu_prefill.py").exists() else kernels / "cpu_numba.py"
    spec = importlib.util.spec_from_file_location(f"base_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    old, numba.config.CACHE_DIR = numba.config.CACHE_DIR, tempfile.mkdtemp(prefix="linattn-base-numba-")
    try:
        spec.loader.exec_module(mod)
    finally:
        numba.config.CACHE_DIR = old
    return mod


def kernel_call(mod, q, k, v, g, beta, cu, S0, o, scale) -> None:
    mod.prefill(q, k, v, g, beta, cu, S0.copy(), o, scale=scale, eps=0.0, clamp=False, normalize=False)


def run_ab(base_src: str, quick: bool) -> list[dict]:
    """This tree's prefill kernel and another tree's, alone (float32 views), alternating, 1 thread."""
    torch.set_num_threads(1)
    base = load_kernel(base_src)
    rows = []
    for geo, shape in PREFILL.items():
        T, Hq, H, D = shape["T"] // (8 if quick else 1), shape["Hq"], shape["H"], shape["D"]
        for rule in ("delta", "gated_delta"):
            q, k, v, kw = prefill_inputs(rule, T, Hq, H, D, torch.float32)
            qn, kn, vn = (x[0].numpy() for x in (q, k, v))
            g = kw["g"][0].unsqueeze(-1).numpy() if "g" in kw else None
            beta = kw["beta"][0].numpy()
            cu = np.array([0, T], dtype=np.int64)
            o = np.empty((T, H, D), np.float32)
            S0 = kw["initial_state"].S.transpose(-1, -2).contiguous().numpy()

            calls = {name: partial(kernel_call, mod, qn, kn, vn, g, beta, cu, S0, o, D**-0.5)
                     for name, mod in (("base", base), ("this", cpu_prefill))}
            times = {"base": [], "this": []}
            calls["base"](), calls["this"]()
            rate = []
            for _ in range(3):
                rate.append(matmul_rate())  # beside the calls it is compared with
                for name, call in calls.items():
                    times[name].append(best(call, 1, 0)[0])
            mm = statistics.median(rate)
            flops = 6 * D * D * T * H
            row = {"case": f"kernel A/B {rule} {geo}", "base_ms": min(times["base"]) * 1e3,
                   "this_ms": min(times["this"]) * 1e3}
            row["this_over_base"] = row["this_ms"] / row["base_ms"]
            row["matmul_gflops"] = mm
            row["this_of_matmul"] = flops / (row["this_ms"] / 1e3) / 1e9 / mm
            row["base_of_matmul"] = flops / (row["base_ms"] / 1e3) / 1e9 / mm
            rows.append(row)
            print_row(row)
    return rows


def print_row(row: dict) -> None:
    parts = [row["case"]]
    for key, value in row.items():
        if key == "case" or key in ("T", "Hq", "H", "D", "B", "state_entries"):
            continue
        parts.append(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}")
    print("  ".join(parts), flush=True)


def write_json(path: Path, data: dict) -> None:
    """Atomically, refusing to replace an existing file."""
    if path.exists():
        raise SystemExit(f"--output: {path} exists; choose another name")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output", type=Path, help="write the results as JSON here (refuses to overwrite)")
    ap.add_argument("--base", help="a src/ folder of another revision: its prefill kernel against this one")
    ap.add_argument("--quick", action="store_true", help="sequences 8x shorter (a smoke run, not a measurement)")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: prefill, chunk, decode")
    args = ap.parse_args(argv)
    if args.output is not None and args.output.exists():
        raise SystemExit(f"--output: {args.output} exists; choose another name")
    skip = set(filter(None, args.skip.split(",")))
    threads_before = torch.get_num_threads()
    out = {"processor": processor(), "load_before": os.getloadavg(), "torch": torch.__version__,
           "numba": __import__("numba").__version__, "python": sys.version.split()[0]}
    print(f"processor {out['processor']}  load average {out['load_before']}", flush=True)
    t_start = time.perf_counter()
    limits, copy = {}, {}
    sizes = [1 * 8 * 64 * 64 * 4, 32 * 128 * 128 * 4, 4 * 32 * 128 * 128 * 4, 16 * 32 * 128 * 128 * 4]
    for n in THREADS:
        torch.set_num_threads(n)
        limits[n] = {"matmul_gflops": matmul_rate()}
        for size in sizes:
            copy[(size, n)] = copy_rate(size)
        limits[n]["copy_gbs"] = {str(size): copy[(size, n)] for size in sizes}
        print(f"{n} thread(s): matmul {limits[n]['matmul_gflops']:.1f} GFLOP/s, copy GB/s by bytes "
              + ", ".join(f"{s}: {copy[(s, n)]:.1f}" for s in sizes), flush=True)
    out["limits"] = {str(n): v for n, v in limits.items()}
    try:
        with torch.no_grad():
            if "prefill" not in skip:
                out["prefill"] = run_prefill(args.quick)
            if "chunk" not in skip:
                out["chunk_rules"] = run_chunk_rules(args.quick)
            if "decode" not in skip:
                out["decode"] = run_decode(copy)
            if args.base:
                out["kernel_ab"] = run_ab(args.base, args.quick)
    finally:
        torch.set_num_threads(threads_before)
    out["load_after"] = os.getloadavg()
    out["seconds"] = time.perf_counter() - t_start
    print(f"load average after {out['load_after']}; {out['seconds']:.0f} s", flush=True)
    if args.output is not None:
        write_json(args.output, out)


if __name__ == "__main__":
    main()
