"""HF's one-token decode step in bfloat16 (Qwen3.5's linear-attention geometry: B=1, 16 query/key heads, 32 value
heads, Dk = Dv = 128; Kimi Linear's per-channel gates alike): HF's own torch function against linattn's adapter of
this tree and of another revision, side by side in one process, one thread, in alternating blocks.

q, k, v and beta come in bfloat16 (HF's projections), g in float32 (HF computes it in float32), the cache's state
in float32. Usage, from the repository root (the result file is written only when named, and never overwritten):

    git archive main src | tar -x -C /tmp/linattn-base
    PYTHONPATH=$PWD/src python scripts/bf16_decode_hf.py /tmp/linattn-base/src [benchmarks/results/NAME_cpu.txt]
"""

from __future__ import annotations

import inspect
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead_ab import load_base  # noqa: E402

BLOCKS, CALLS = 61, 20


def processor() -> str:
    """The processor's model name (Linux), else what platform says."""
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def inputs(per_channel: bool):
    """One token of Qwen3.5's (or, per channel, Kimi's) layer as HF passes it to the recurrent function."""
    torch.manual_seed(0)
    B, Hq, HV, D = 1, 16, 32, 128
    bf = torch.bfloat16
    q, k = torch.randn(B, 1, Hq, D).to(bf), torch.randn(B, 1, Hq, D).to(bf)
    v = torch.randn(B, 1, HV, D).to(bf)
    if per_channel:  # Kimi: one head count for q, k and v
        q, k = torch.randn(B, 1, HV, D).to(bf), torch.randn(B, 1, HV, D).to(bf)
        g = -F.softplus(torch.randn(B, 1, HV, D))
    else:
        g = -F.softplus(torch.randn(B, 1, HV))
    beta = torch.rand(B, 1, HV).to(bf)
    S = torch.randn(B, HV, D, D) * 0.01
    return q, k, v, g, beta, S


def main() -> None:
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi
    from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen

    import linattn.integrations.transformers as this_hf

    base = load_base(Path(sys.argv[1]).resolve())
    import linattn_base.integrations.transformers as base_hf

    torch.set_num_threads(1)
    lines = [f"HF decode step, bfloat16 q/k/v/beta, float32 g and state, l2 in kernel; {processor()}, "
             f"{os.cpu_count()} cores, 1 thread, load {os.getloadavg()[0]:.2f} at start; us per call: median and "
             f"min over {BLOCKS - 1} alternating blocks of {CALLS} calls"]
    unwrap = inspect.unwrap  # HF's own torch code, beneath the decorator that may route to fla's Triton kernels
    cases = [("qwen3.5 gated_delta", False, unwrap(qwen.torch_recurrent_gated_delta_rule),
              base_hf.gated_delta.recurrent_gated_delta_rule, this_hf.gated_delta.recurrent_gated_delta_rule),
             ("kimi per-channel", True, unwrap(kimi.recurrent_kimi_delta_attention),
              base_hf.kda.recurrent_kimi_delta_attention, this_hf.kda.recurrent_kimi_delta_attention)]
    del base
    for name, per_channel, hf_fn, base_fn, this_fn in cases:
        q, k, v, g, beta, S0 = inputs(per_channel)
        fns = {"hf": hf_fn, "base": base_fn, "this": this_fn}
        states = {n: S0.clone() for n in fns}
        times = {n: [] for n in fns}
        for block in range(BLOCKS):
            order = list(fns) if block % 2 else list(fns)[::-1]
            for n in order:
                fn, S = fns[n], states[n]
                start = time.perf_counter_ns()
                for _ in range(CALLS):
                    _, S = fn(q, k, v, g, beta, initial_state=S, output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
                if block:
                    times[n].append((time.perf_counter_ns() - start) / CALLS / 1e3)
                states[n] = S.clone() if n == "hf" else S  # HF's cache copies the state back: a fresh one each call
        med = {n: statistics.median(t) for n, t in times.items()}
        lo = {n: min(t) for n, t in times.items()}
        lines.append(f"{name:20s} median: hf {med['hf']:7.1f} base {med['base']:7.1f} this {med['this']:7.1f} "
                     f"(hf/this {med['hf'] / med['this']:4.1f}x, base/this {med['base'] / med['this']:4.1f}x)   "
                     f"min: hf {lo['hf']:7.1f} base {lo['base']:7.1f} this {lo['this']:7.1f}")
        print(lines[-1], flush=True)
    lines.append(f"load {os.getloadavg()[0]:.2f} at end")
    print(lines[-1])
    if len(sys.argv) == 3:
        out = Path(sys.argv[2])
        if out.exists():
            sys.exit(f"{out} exists: not overwritten")
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, out)


if __name__ == "__main__":
    main()
