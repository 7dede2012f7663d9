"""The function rows of ``hf_families_bench.py`` over several fresh processes: a replaced function's speed-up over
HF's torch function moves by 10-30% from one process to the next on a virtual machine (where its buffers and the
state land, what the neighbours do), more than the spread of the medians within one run. Each run is a new
process (``hf_families_bench.py --only functions``, with ``--decode-only`` only the decode steps); the table gives
per row the median times of HF's function and linattn's over the runs, the median speed-up, the lowest and the
highest, and each run's.

    PYTHONPATH=src python scripts/hf_function_runs.py --runs 7 --decode-only \
        --out benchmarks/results/hf_decode_runs_cpu.txt
    PYTHONPATH=src python scripts/hf_function_runs.py --runs 3 --out benchmarks/results/hf_function_runs_cpu.txt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from linattn.tools.harness.machine import processor_name
from linattn.tools.harness.results import atomic_write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--decode-only", action="store_true", help="only the decode-step rows")
    parser.add_argument("--out", default=None, help="result text file (refused if it exists, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    bench = Path(__file__).with_name("hf_families_bench.py")
    runs: dict[tuple[str, str, int], list[tuple[float, float, float]]] = {}  # (speed-up, HF time, linattn time)
    loads = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            out = Path(tmp) / f"run{i}.json"
            subprocess.run([sys.executable, str(bench), "--only", "functions", "--threads", *map(str, args.threads),
                            *(["--decode-only"] if args.decode_only else []), "--out", str(out)], check=True,
                           capture_output=True)
            for row in json.loads(out.read_text())["rows"]:
                runs.setdefault((row["family"], row["what"], row["threads"]), []).append(
                    (row["speedup"], row["hf"], row["linattn"]))
            loads.append(os.getloadavg()[0])
            print(f"run {i + 1}/{args.runs} done, load {loads[-1]:.2f}", flush=True)
    lines = [f"# PYTHONPATH=src python scripts/hf_function_runs.py --runs {args.runs}"
             + (" --decode-only" if args.decode_only else ""),
             f"# {processor_name()}, {os.cpu_count()} cores; HF's torch function's time / linattn's, each run a fresh "
             f"process (medians of interleaved calls within it: 3 per prefill, 60 per decode step); 1-min load after "
             f"the runs {min(loads):.2f}-{max(loads):.2f}",
             f"{'family':28s} {'what':16s} {'threads':>7s} {'HF ms':>9s} {'linattn ms':>10s} {'median':>7s} "
             f"{'lowest':>7s} {'highest':>7s}  runs"]
    for (family, what, threads), rs in runs.items():
        s, hf, la = (list(col) for col in zip(*rs, strict=True))
        lines.append(f"{family:28s} {what:16s} {threads:7d} {statistics.median(hf):9.2f} {statistics.median(la):10.2f}"
                     f" {statistics.median(s):6.2f}x {min(s):6.2f}x {max(s):6.2f}x  " + " ".join(f"{x:.2f}" for x in s))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
