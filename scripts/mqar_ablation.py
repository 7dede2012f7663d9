"""Why the MQAR sweep is set up as it is: single runs of its pipeline (``sweep.train_run``, the same stopping rules
and held-out sets) with one design choice changed at a time. Usage, from the repository root:

    python scripts/mqar_ablation.py [--output benchmarks/results/mqar_ablation_cpu.txt [--overwrite]]

1. Softmax attention at length 256 (width 64, 16 pairs, lr 3.16e-3, seed 0): learned absolute positions or the
   short convolution, each with and without length-64 batches mixed into every other step.
2. Gated DeltaNet at length 64 with 8 pairs (width 64, lr 3.16e-3, seeds 1 and 2, where the sweep's runs stayed
   low): the Mamba-2 decay initialization of ``linattn.nn`` (A in [1, 16], dt in [1e-3, 0.1], so 0.2 to 0.999 of
   the state kept per token) against every head starting at 0.99 (A = 1, dt = 0.01).

Prints one row per run (about 10 minutes on one core); ``--output`` writes the table atomically (an existing file
only with ``--overwrite``).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import replace
from datetime import datetime, timezone

import torch

from linattn.tools.harness import machine
from linattn.tools.harness.results import atomic_write, check_writable
from linattn.tools.mqar import sweep
from linattn.tools.mqar.sweep import FULL, Job

ATTENTION = Job("attention", 64, 256, 16, 3.16e-3, 0)
VARIANTS = [  # (what changes, config, job, slow decay init)
    ("positions, no mixture", replace(FULL, attention_positions=True, attention_conv_size=0, mixed_in=()),
     ATTENTION, False),
    ("positions, mixture", replace(FULL, attention_positions=True, attention_conv_size=0), ATTENTION, False),
    ("convolution, no mixture", replace(FULL, mixed_in=()), ATTENTION, False),
    ("convolution, mixture (the sweep)", FULL, ATTENTION, False),
    *((f"{'retention 0.99 at init' if slow else 'Mamba-2 init (the sweep)'}", FULL,
       Job("gated_delta", 64, 64, 8, 3.16e-3, seed), slow) for seed in (1, 2) for slow in (False, True)),
]


def slow_decay(model: torch.nn.Module) -> torch.nn.Module:
    """Every Gated DeltaNet head starts keeping ~0.99 of its state per token: A = 1, softplus(dt_bias) = 0.01, as
    ``LinearAttention(A_init_range=(1, 1), dt_init_range=(0.01, 0.01))`` initializes it."""
    with torch.no_grad():
        for block in model.layers:
            if hasattr(block.mixer, "dt_bias"):
                block.mixer.A_log.zero_()
                block.mixer.dt_bias.fill_(math.log(math.expm1(0.01)))
    return model


def run(cfg, job: Job, slow: bool) -> dict:
    real = sweep.build_model
    if slow:
        sweep.build_model = lambda mixer, tc: slow_decay(real(mixer, tc))
    try:
        return sweep.train_run(cfg, job)
    finally:
        sweep.build_model = real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    args = parser.parse_args()
    if args.output:
        check_writable(args.output, overwrite=args.overwrite)  # before minutes of training, not after
    lines = ["# mqar_ablation.py: one run each, the sweep's pipeline (1 torch thread, early stopping)",
             f"# {datetime.now(timezone.utc).isoformat(timespec='seconds')}  {machine.processor_name()}, "
             f"{os.cpu_count()} cores, load average before {os.getloadavg()[0]:.2f}",
             "| mixer | length / pairs | seed | variant | steps | stop | best step | val acc | test acc | CPU s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for label, cfg, job, slow in VARIANTS:
        r = run(cfg, job, slow)
        lines.append(f"| {job.mixer} | {job.seq_len} / {job.num_pairs} | {job.seed} | {label} | {r['steps']} | "
                     f"{r['stop_reason']} | {r['best_step']} | {100 * r['val_accuracy']:.1f}% | "
                     f"{100 * r['test_accuracy']:.1f}% | {r['cpu_s']:.0f} |")
        print(lines[-1], flush=True)
    lines.append(f"load average after {os.getloadavg()[0]:.2f}")
    text = "\n".join(lines) + "\n"
    if args.output:
        atomic_write(args.output, lambda tmp: tmp.write_text(text), overwrite=args.overwrite)


if __name__ == "__main__":
    main()
