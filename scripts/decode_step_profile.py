"""Where the time of HF's replaced decode step goes, at Qwen3.5's Gated DeltaNet (16 q/k heads, 32 value heads,
128 x 128) and Kimi Linear's KDA (32 heads, 128 x 128, a gate per key channel), B = 1, float32, one thread:

* copy: ``torch.Tensor.copy_`` of a state-sized tensor (the memory rate a pass over the state can reach);
* kernel: the one-call decode kernel alone (``cpu_decode.decode``, raw addresses);
* fast_decode: linattn's proof of the plain case plus the kernel (``linattn.decode.fast_decode``);
* adapter: the replaced HF function (``recurrent_gated_delta_rule`` / ``recurrent_kimi_delta_attention``);
* HF: HF's own torch function.

Each is run with the state warm (the step timed right after an untimed one) and cold (a 64 MiB buffer read
between steps, as a model's other layers evict it); kernel, fast_decode and adapter update one state; modes
interleaved, 64 different tokens cycled, medians in microseconds; and the per-call
overhead alone, on a tiny state (2 q/k heads, 4 value heads, 8 x 8).

    PYTHONPATH=src python scripts/decode_step_profile.py --out benchmarks/results/decode_step_profile_cpu.txt
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time

import torch
import torch.nn.functional as F

from linattn import backends
from linattn import decode as lindecode
from linattn.integrations import transformers as lt
from linattn.kernels import cpu_decode
from linattn.state import State
from linattn.tools.harness.machine import processor_name as processor
from linattn.tools.harness.results import atomic_write

TOKENS = 64


def hf_fn(model_type: str, name: str):
    return inspect.unwrap(lt.original(lt.modeling(model_type), name))


def modes_for(family: str, H: int, HV: int, D: int):
    gen = torch.Generator().manual_seed(0)
    kda = family == "kda"
    q, k = (torch.randn(1, TOKENS, H, D, generator=gen) for _ in range(2))
    v = torch.randn(1, TOKENS, HV, D, generator=gen)
    g = -F.softplus(torch.randn(1, TOKENS, HV, *((D,) if kda else ()), generator=gen)) * 0.1
    beta = torch.rand(1, TOKENS, HV, generator=gen)
    toks = [tuple(x[:, i:i + 1] for x in (q, k, v, g, beta)) for i in range(TOKENS)]
    flat = [tuple(x[:, 0] for x in t) for t in toks]
    states = [torch.randn(1, HV, D, D, generator=gen) * 0.01 for _ in range(4)]
    o = torch.empty(1, HV, D)
    dst = torch.empty_like(states[0])
    code, width = cpu_decode.FEATURE_CODES["l2"], D if kda else 1
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    ours = lt.recurrent_kimi_delta_attention if kda else lt.recurrent_gated_delta_rule
    hf = (hf_fn("kimi_linear", "recurrent_kimi_delta_attention") if kda
          else hf_fn("qwen3_5", "torch_recurrent_gated_delta_rule"))
    fixed = lindecode.plain_args(backends.plan_step("auto", states[0]), "gated_delta", "l2", False, D**-0.5, 1e-6,
                                 "add")
    state = State(states[0])  # kernel, fast_decode and adapter update the same memory: no mode has a warmer state

    def kernel(i, S=states[0]):
        a = flat[i]
        return cpu_decode.decode(a[0].data_ptr(), a[1].data_ptr(), a[2].data_ptr(), a[3].data_ptr(),
                                 a[4].data_ptr(), S.data_ptr(), S.data_ptr(), o.data_ptr(), 1, H, HV, D, D, width,
                                 code, 0, 0, 1, D**-0.5, 1e-6)

    return {"copy": lambda i: dst.copy_(states[1]), "kernel": kernel,
            "fast_decode": lambda i: lindecode.fast_decode(fixed, *flat[i], state, True),
            "adapter": lambda i: ours(*toks[i], initial_state=states[0], **kw),
            "HF": lambda i: hf(*toks[i], initial_state=states[3], **kw)}, (toks, states)


def medians(modes: dict, repeats: int, evict: torch.Tensor | None) -> dict:
    for fn in modes.values():
        for i in range(4):
            fn(i)
    times = {n: [] for n in modes}
    for r in range(repeats):
        for name, fn in modes.items():
            if evict is not None:
                evict.sum()
            else:  # the same step just before: every mode's state equally warm
                fn((r + 1) % TOKENS)
            start = time.perf_counter()
            fn(r % TOKENS)
            times[name].append(time.perf_counter() - start)
    return {n: statistics.median(t) * 1e6 for n, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1", help="torch's thread counts, each row at each (e.g. 1,2)")
    parser.add_argument("--families", default="gdn,kda,tiny", help="which of gdn, kda, tiny (the 8 x 8 state)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]
    lines = [f"HF's replaced decode step, where the time goes: {processor()} ({os.cpu_count()} cores), "
             f"torch threads {args.threads} (thr), "
             f"torch {torch.__version__}; medians of {args.repeats} interleaved steps (us); load = 1-min load "
             "average after the row; GB/s = the state read and written once in that time", ""]

    def emit(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    evict = torch.ones(16 << 20)  # 64 MiB
    with torch.no_grad():
        cases = {"gdn": ("gdn", 16, 32, 128), "kda": ("kda", 32, 32, 128), "tiny": ("gdn", 2, 4, 8)}
        for _ in range(args.rounds):
            for (family, H, HV, D), threads in ((cases[f], t) for f in args.families.split(",") for t in thread_counts):
                torch.set_num_threads(threads)
                modes, keep = modes_for(family, H, HV, D)
                nbytes = 2 * HV * D * D * 4
                name = {"gdn": "Qwen3.5 GDN", "kda": "Kimi KDA"}[family] + f" {H}/{HV} x {D} x {D}"
                for label, ev in (("warm", None), ("cold", evict)):
                    if D == 8 and ev is not None:
                        continue
                    m = medians(modes, args.repeats, ev)
                    parts = "  ".join(f"{n} {t:8.1f}" + (f" ({nbytes / t / 1e3:4.1f} GB/s)" if n in ("copy", "kernel")
                                                         else "") for n, t in m.items())
                    emit(f"{name:28s} thr {threads} {label:5s} {parts}  HF/adapter {m['HF'] / m['adapter']:.2f}x  "
                         f"load {os.getloadavg()[0]:.2f}")
                del keep
    if args.out:
        print("wrote", atomic_write(args.out, lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"),
                                    overwrite=args.overwrite))


if __name__ == "__main__":
    main()
