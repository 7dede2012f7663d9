"""One MQAR training step of the gated (GLA, per-channel gates) model of the sweep (mixer-only blocks, 2 layers, 2
heads) with "auto" taking the compiled prefill and backward where ``linattn.backends.policy.compiled_backward``
says so, against the torch path (forward and backward in the torch chunk form), in turns in one process (the
order alternating each round) so that load changes hit both alike. Usage, from the repository root:

    python scripts/train_step_ab.py --threads 1 [--output benchmarks/results/NAME_cpu.txt]

Prints median milliseconds per step (forward, backward, AdamW) per (width, sequence length) and the ratio;
``--output`` writes the table atomically (an existing file only with ``--overwrite``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import datetime, timezone

import torch

from linattn.backends import policy
from linattn.tools.harness import machine
from linattn.tools.harness.results import atomic_write, check_writable
from linattn.tools.mqar.train import TrainConfig, build_model, loss_and_accuracy, train_batch


def emit(lines: list[str], output: str | None, overwrite: bool = False) -> None:
    """Print the table; with ``output``, also write it atomically there (an existing file only with ``overwrite``)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if output:
        atomic_write(output, lambda tmp: tmp.write_text(text), overwrite=overwrite)


def step(cfg: TrainConfig, model, opt, i: int) -> float:
    """Seconds of one training step on batch ``i``."""
    batch = train_batch(cfg, i)
    start = time.perf_counter()
    loss, _ = loss_and_accuracy(model, batch.inputs, batch.targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--output", default=None)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    args = parser.parse_args()
    if args.output:
        check_writable(args.output, overwrite=args.overwrite)  # before minutes of timing, not after
    torch.set_num_threads(args.threads)
    real = policy.compiled_backward
    lines = [f"# train_step_ab.py --threads {args.threads} --rounds {args.rounds}",
             f"# {datetime.now(timezone.utc).isoformat(timespec='seconds')}  {machine.processor_name()}, "
             f"{os.cpu_count()} cores, load average before {os.getloadavg()[0]:.2f}",
             "| width | T | batch | torch path ms | auto ms | auto / torch |", "|---|---|---|---|---|---|"]
    for width, T in ((64, 64), (128, 64), (64, 256), (128, 256)):
        cfg = TrainConfig(vocab_size=80, seq_len=T, train_pairs=(4,), hidden_size=width, num_layers=2, num_heads=2,
                          head_dim=width // 2, intermediate_size=0, batch_size=2048 // T)
        model = build_model("gated", cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        times: dict[str, list[float]] = {"torch": [], "auto": []}
        for i in range(3):
            step(cfg, model, opt, i)
        for r in range(args.rounds):
            for mode in ("torch", "auto") if r % 2 == 0 else ("auto", "torch"):
                policy.compiled_backward = real if mode == "auto" else (lambda *a: False)
                times[mode].append(step(cfg, model, opt, r))
        policy.compiled_backward = real
        t, a = (statistics.median(times[m]) * 1e3 for m in ("torch", "auto"))
        lines.append(f"| {width} | {T} | {cfg.batch_size} | {t:.1f} | {a:.1f} | {a / t:.2f}x |")
        print(lines[-1], flush=True)
    lines.append(f"load average after {os.getloadavg()[0]:.2f}")
    emit(lines, args.output, args.overwrite)


if __name__ == "__main__":
    main()
