"""``CausalLM.generate`` tokens per second, this tree against another revision, side by side in one process: the same
weights and prompt, greedy decoding, float32, one thread (a small model: vocab 256, hidden 256, 4 Gated DeltaNet
layers of 4 heads of 64, by default).

The two run in turns, the order alternating each round, so load changes on a shared machine hit both alike; the
table gives the median and the best tokens/s over rounds (new tokens of all rows over the generate call's wall time,
prefill included) and checks that both pick the same tokens. Usage, from the repository root:

    git archive <rev> src | tar -x -C /tmp/linattn-base       # the revision to compare with
    PYTHONPATH=src python scripts/generate_ab.py /tmp/linattn-base/src --base-rev <rev> \
        [--output benchmarks/results/NAME_cpu.txt]

``--output`` writes the table (atomically) to a new file; an existing file is never overwritten.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead_ab import load_base  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def revision(src: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def build(module, args) -> torch.nn.Module:
    torch.manual_seed(0)
    nn = importlib.import_module(f"{module.__name__}.nn")
    return nn.CausalLM(args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                              head_dim=args.head_dim, mixers=args.mixer).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base_src", type=Path, help="the other revision's src directory (holding linattn/)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="batch sizes (default 1)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens (default 16)")
    parser.add_argument("--new", type=int, default=128, help="new tokens per generate call (default 128)")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds per version (default 9)")
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--mixer", default="gated_delta")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base-rev", default=None, help="the other revision's name, for the header")
    parser.add_argument("--output", type=Path, help="write the table to this new file (never overwritten)")
    args = parser.parse_args()
    if args.output is not None and args.output.exists():
        sys.exit(f"--output {args.output} exists; choose a new name (results are never overwritten)")
    sys.path.insert(0, str(ROOT / "src"))
    import linattn

    base = load_base(args.base_src.resolve())
    torch.set_num_threads(args.threads)
    models = {"base": build(base, args), "this": build(linattn, args)}
    models["base"].load_state_dict(models["this"].state_dict())  # the same weights, whatever each init draws
    load = os.getloadavg()
    lines = [
        f"# generate_ab.py {args.base_src} ({args.base_rev or revision(args.base_src)}) vs this tree "
        f"({revision(ROOT)})",
        f"# {datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ}  {processor()}; nproc {os.cpu_count()}; "
        f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"CausalLM vocab {args.vocab}, hidden {args.hidden}, {args.layers} x {args.mixer} ({args.heads} heads of "
        f"{args.head_dim}), float32, {args.threads} thread(s); greedy generate of {args.new} tokens after a "
        f"{args.prompt}-token prompt; tokens/s median (best) over {args.rounds} alternating rounds",
        f"{'B':>3} {'base tok/s':>18} {'this tok/s':>18} {'this/base':>10}  same tokens",
    ]
    print("\n".join(lines), flush=True)
    for B in args.batch:
        prompt = torch.randint(0, args.vocab, (B, args.prompt), generator=torch.Generator().manual_seed(B))
        out = {name: m.generate(prompt, args.new) for name, m in models.items()}  # warm up (and compile)
        same = torch.equal(out["base"], out["this"])
        rates = {name: [] for name in models}
        for r in range(args.rounds):
            for name in (list(models) if r % 2 else list(models)[::-1]):
                start = time.perf_counter()
                models[name].generate(prompt, args.new)
                rates[name].append(B * args.new / (time.perf_counter() - start))
        med = {name: statistics.median(v) for name, v in rates.items()}
        row = (f"{B:>3} {med['base']:>10.1f} ({max(rates['base']):>5.1f}) {med['this']:>10.1f} "
               f"({max(rates['this']):>5.1f}) {med['this'] / med['base']:>9.2f}x  {'yes' if same else 'NO'}")
        print(row, flush=True)
        lines.append(row)
    load = os.getloadavg()
    lines.append(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(lines[-1])
    if args.output is not None:
        if args.output.exists():
            sys.exit(f"--output {args.output} appeared meanwhile; not overwritten")
        tmp = args.output.with_name(args.output.name + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, args.output)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
