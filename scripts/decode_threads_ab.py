"""Why linattn's decode step of HF's Gated DeltaNet and KDA timed slower at 2 threads than at 1 in
``scripts/hf_families_bench.py`` (whose steps alternate with HF's own): each step timed right after a call of
HF's torch function (as there) and right after its own untimed step (warm, alone), at 1 and 2 torch threads,
under libgomp's default wait policy (its idle worker spins after each parallel region) and under
``OMP_WAIT_POLICY=PASSIVE`` (it sleeps), each policy in its own process (libgomp reads it at start-up).

Per family (Qwen3.5's GDN: 16 q/k heads, 32 value heads, 128 x 128; Kimi's KDA: 32 heads, 128 x 128, a gate per
key channel; B = 1, float32, a 2 MiB state): ``adapter`` (the replaced HF function), ``kernel`` (the one-call
decode kernel alone, raw addresses: no torch op, no Python checks) and ``copy`` (a state-sized
``Tensor.copy_``, itself a torch op that uses torch's threads); medians in microseconds, the 1-minute load average
after each row.

    PYTHONPATH=src python scripts/decode_threads_ab.py --out benchmarks/results/decode_threads_ab_cpu.txt
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from linattn.integrations import transformers as lt
from linattn.kernels import cpu_decode
from linattn.tools.harness.machine import processor_name as processor
from linattn.tools.harness.results import atomic_write


def hf_fn(model_type: str, name: str):
    return inspect.unwrap(lt.original(lt.modeling(model_type), name))


def family_modes(family: str):
    """(HF's step, {mode: step}) of one family, each on its own state."""
    gen = torch.Generator().manual_seed(0)
    kda = family == "kda"
    H, HV, D = (32, 32, 128) if kda else (16, 32, 128)
    q, k = (torch.randn(1, 1, H, D, generator=gen) for _ in range(2))
    v = torch.randn(1, 1, HV, D, generator=gen)
    g = -F.softplus(torch.randn(1, 1, HV, *((D,) if kda else ()), generator=gen)) * 0.1
    beta = torch.rand(1, 1, HV, generator=gen)
    S = torch.randn(1, HV, D, D, generator=gen) * 0.01
    S_hf, S_ad, S_k, dst, o = S.clone(), S.clone(), S.clone(), torch.empty_like(S), torch.empty(1, HV, D)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    hf = (hf_fn("kimi_linear", "recurrent_kimi_delta_attention") if kda
          else hf_fn("qwen3_5", "torch_recurrent_gated_delta_rule"))
    ours = lt.recurrent_kimi_delta_attention if kda else lt.recurrent_gated_delta_rule
    flat = [x[:, 0] for x in (q, k, v, g, beta)]
    code, width = cpu_decode.FEATURE_CODES["l2"], D if kda else 1

    def kernel():
        return cpu_decode.decode(*(x.data_ptr() for x in flat), S_k.data_ptr(), S_k.data_ptr(), o.data_ptr(), 1, H,
                                 HV, D, D, width, code, 0, 0, 1, D**-0.5, 1e-6)

    modes = {"adapter": lambda: ours(q, k, v, g, beta, initial_state=S_ad, **kw), "kernel": kernel,
             "copy": lambda: dst.copy_(S_k)}
    return (lambda: hf(q, k, v, g, beta, initial_state=S_hf, **kw)), modes


def child(threads: list[int], repeats: int) -> None:
    policy = os.environ.get("OMP_WAIT_POLICY", "default")
    with torch.no_grad():
        for family in ("gdn", "kda"):
            hf, modes = family_modes(family)
            for t in threads:
                torch.set_num_threads(t)
                for before in ("after HF", "alone"):
                    times = {n: [] for n in modes}
                    for _ in range(3):
                        for fn in modes.values():
                            hf()
                            fn()
                    for _ in range(repeats):
                        for name, fn in modes.items():
                            hf() if before == "after HF" else fn()
                            start = time.perf_counter()
                            fn()
                            times[name].append(time.perf_counter() - start)
                    med = "  ".join(f"{n} {statistics.median(v) * 1e6:7.1f}" for n, v in times.items())
                    print(f"{policy:8s} {family:4s} threads {t}  {before:8s}  {med}  load {os.getloadavg()[0]:.2f}",
                          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.child:
        child(threads, args.repeats)
        return
    lines = [f"Decode step after HF's own step vs alone: {processor()} ({os.cpu_count()} cores), torch "
             f"{torch.__version__}, medians of {args.repeats} steps (us); policy = libgomp's OMP_WAIT_POLICY", ""]
    for policy in ("default", "PASSIVE", "default", "PASSIVE"):
        env = dict(os.environ)
        env.pop("OMP_WAIT_POLICY", None)
        if policy != "default":
            env["OMP_WAIT_POLICY"] = policy
        out = subprocess.run([sys.executable, __file__, "--child", "--threads", args.threads, "--repeats",
                              str(args.repeats)], env=env, capture_output=True, text=True, check=True).stdout
        print(out, end="", flush=True)
        lines += out.splitlines()
    text = "\n".join(lines) + "\n"
    if args.out:
        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)


if __name__ == "__main__":
    main()
