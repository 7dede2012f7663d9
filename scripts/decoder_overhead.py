"""``linattn.Decoder`` against ``linattn.step(..., inplace=True)`` and the compiled call alone (``cpu_decode.decode``
on the same pointers), on the same inputs, side by side in one process
(B = 1, H = 8, D = 64, float32, one thread): microseconds per call, minimum and median over alternating blocks.

Usage, from the repository root: ``PYTHONPATH=src python scripts/decoder_overhead.py``
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import linattn
from linattn.kernels import cpu_decode

B, H, D = 1, 8, 64
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
    print(f"Decoder vs step, B={B} H={H} D={D} float32, 1 thread; us per call, blocks of {CALLS} calls")
    for rule, fmap in (("accumulate", "elu1"), ("gated", "elu1"), ("delta", "l2"), ("gated_delta", "l2")):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, D, generator=gen) for _ in range(3))
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
                kw["beta"].data_ptr() if delta else 0, alone.S.data_ptr(), alone.S.data_ptr(), o.data_ptr(), B, H, H,
                D, D, 1 if gated else 0, cpu_decode.FEATURE_CODES[fmap], False, not delta, delta, D**-0.5, 1e-6)

        def run_kernel(args=args):
            cpu_decode.decode(*args)

        times: dict[str, list[float]] = {"decoder": [], "step": [], "kernel": []}
        for _ in range(4):  # alternate, so drift in the machine's speed hits all alike
            times["decoder"] += per_call_us(run_decoder)
            times["step"] += per_call_us(run_step)
            times["kernel"] += per_call_us(run_kernel)
        d, s, c = times["decoder"], times["step"], times["kernel"]
        print(f"{rule:12s} {fmap:5s} min: decoder {min(d):6.1f} step {min(s):6.1f} kernel {min(c):6.1f}   "
              f"median: decoder {statistics.median(d):6.1f} step {statistics.median(s):6.1f} "
              f"kernel {statistics.median(c):6.1f}")
    v = torch.randn(B, H, D)
    S = torch.zeros(B, H, D, D)
    for name, fn in (("torch.empty_like(v)", lambda: torch.empty_like(v)),
                     ("increment_version(S)", lambda: torch.autograd.graph.increment_version(S))):
        print(f"{name:22s} min {min(per_call_us(fn)):5.2f} us per call (one of the Python costs around the kernel)")


if __name__ == "__main__":
    main()
