"""``linattn.Decoder`` against ``linattn.step(..., inplace=True)`` on the same inputs, side by side in one process
(B = 1, H = 8, D = 64, float32, one thread): microseconds per call, minimum and median over alternating blocks.

Usage, from the repository root: ``PYTHONPATH=src python scripts/decoder_overhead.py``
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import linattn

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

        times: dict[str, list[float]] = {"decoder": [], "step": []}
        for _ in range(4):  # alternate, so drift in the machine's speed hits both alike
            times["decoder"] += per_call_us(run_decoder)
            times["step"] += per_call_us(run_step)
        d, s = times["decoder"], times["step"]
        print(f"{rule:12s} {fmap:5s} min: decoder {min(d):6.1f} step {min(s):6.1f}   "
              f"median: decoder {statistics.median(d):6.1f} step {statistics.median(s):6.1f}")


if __name__ == "__main__":
    main()
