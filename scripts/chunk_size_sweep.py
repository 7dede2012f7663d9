"""Median chunk-form forward time per rule and chunk size (B=1, T=8192, H=8, D=64, float32), side by side.

Used to choose the default ``chunk_size``: python scripts/chunk_size_sweep.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

import linattn


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main() -> None:
    torch.manual_seed(0)
    B, T, H, D = 1, 8192, 8, 64
    q, k, v = F.elu(torch.randn(B, T, H, D)) + 1, F.elu(torch.randn(B, T, H, D)) + 1, torch.randn(B, T, H, D)
    k_unit = F.normalize(torch.randn(B, T, H, D), dim=-1)
    g, beta = F.logsigmoid(torch.randn(B, T, H) + 4), torch.rand(B, T, H)
    g_channel = F.logsigmoid(torch.randn(B, T, H, D) + 4)
    cases = {
        "accumulate": lambda C: linattn.linear_attention(q, k, v, chunk_size=C),
        "gated_head": lambda C: linattn.linear_attention(q, k, v, rule="gated", g=g, chunk_size=C),
        "gated_channel": lambda C: linattn.linear_attention(q, k, v, rule="gated", g=g_channel, chunk_size=C),
        "delta": lambda C: linattn.linear_attention(q, k_unit, v, rule="delta", beta=beta, chunk_size=C),
        "gated_delta": lambda C: linattn.linear_attention(q, k_unit, v, rule="gated_delta", g=g, beta=beta,
                                                          chunk_size=C),
    }
    sizes = (32, 64, 128, 256)
    print("| rule | " + " | ".join(f"C={c} ms" for c in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    with torch.no_grad():
        for name, run in cases.items():
            print(f"| {name} | " + " | ".join(f"{median_ms(lambda c=c, run=run: run(c)):.1f}" for c in sizes) + " |")


if __name__ == "__main__":
    main()
