"""``linattn.Decoder`` against ``linattn.step(..., inplace=True)`` and the compiled call alone (``cpu_decode.decode``
on the same pointers), on the same inputs, side by side in one process (B = 1, float32, one thread): microseconds per
call, minimum and median over alternating blocks, and the Decoder's median over the kernel's. Every rule at H = 8,
D = 64; gated delta with the L2 feature map at the Qwen3-Next geometry (16 q/k heads, 32 value heads, D = 128).

Usage, from the repository root: ``PYTHONPATH=src python scripts/decoder_overhead.py``
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F

import linattn
from linattn.kernels import cpu_decode

B = 1
CASES = [  # (q/k heads, value heads, width, rule, feature map)
    (8, 8, 64, "accumulate", "elu1"), (8, 8, 64, "gated", "elu1"), (8, 8, 64, "delta", "l2"),
    (8, 8, 64, "gated_delta", "l2"), (16, 32, 128, "gated_delta", "l2"),
]
BLOCKS, CALLS = 200, 50


def per_call_us(fn) -> list[float]:
    times = []
    for _ in range(BLOCKS // 4):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - t0) / CALLS * 1e6)
    return times


def main() -> None:
    torch.set_num_threads(1)
    print(f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  nproc {os.cpu_count()}  load average before "
          f"{os.getloadavg()[0]:.2f}")
    print(f"Decoder vs step, B={B} float32, 1 thread; us per call, blocks of {CALLS} calls")
    for Hq, H, D, rule, fmap in CASES:
        gen = torch.Generator().manual_seed(0)
        q, k = (torch.randn(B, Hq, D, generator=gen) for _ in range(2))
        v = torch.randn(B, H, D, generator=gen)
        kw = {}
        if rule in ("gated", "gated_delta"):
            kw["g"] = F.logsigmoid(torch.randn(B, H, generator=gen))
        if rule in ("delta", "gated_delta"):
            kw["beta"] = torch.rand(B, H, generator=gen)
        state = linattn.State.zeros(B, H, D, D, normalizer=rule in ("accumulate", "gated"))
        dec = linattn.Decoder(state.clone(), rule=rule, feature_map=fmap)
        other = state.clone()

        def run_decoder(dec=dec, q=q, k=k, v=v, kw=kw):
            dec(q, k, v, **kw)

        def run_step(other=other, q=q, k=k, v=v, kw=kw, rule=rule, fmap=fmap):
            linattn.step(q, k, v, other, rule=rule, feature_map=fmap, inplace=True, **kw)

        # the compiled call alone, on the pointers the Decoder passes (a third state, updated in place)
        alone, o = state.clone(), torch.empty(B, H, D)
        gated, delta = "g" in kw, "beta" in kw
        args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), kw["g"].data_ptr() if gated else 0,
                kw["beta"].data_ptr() if delta else 0, alone.S.data_ptr(), alone.S.data_ptr(), o.data_ptr(), B, Hq,
                H, D, D, 1 if gated else 0, cpu_decode.FEATURE_CODES[fmap], False, not delta, delta, D**-0.5, 1e-6)

        def run_kernel(args=args):
            cpu_decode.decode(*args)

        times: dict[str, list[float]] = {"decoder": [], "step": [], "kernel": []}
        for _ in range(4):  # alternate, so drift in the machine's speed hits all alike
            times["decoder"] += per_call_us(run_decoder)
            times["step"] += per_call_us(run_step)
            times["kernel"] += per_call_us(run_kernel)
        d, s, c = times["decoder"], times["step"], times["kernel"]
        print(f"Hq={Hq:2d} H={H:2d} D={D:3d} {rule:12s} {fmap:5s} min: decoder {min(d):6.1f} step {min(s):6.1f} "
              f"kernel {min(c):6.1f}   median: decoder {statistics.median(d):6.1f} step {statistics.median(s):6.1f} "
              f"kernel {statistics.median(c):6.1f}   decoder/kernel {statistics.median(d) / statistics.median(c):.2f}")
    v = torch.randn(B, 8, 64)
    S = torch.zeros(B, 8, 64, 64)
    for name, fn in (("torch.empty_like(v)", lambda: torch.empty_like(v)),
                     ("increment_version(S)", lambda: torch.autograd.graph.increment_version(S))):
        print(f"{name:22s} min {min(per_call_us(fn)):5.2f} us per call (one of the Python costs around the kernel)")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
