"""HF's Gated DeltaNet and KDA decode step at two revisions of linattn, side by side: the source of ``--base`` (a git
revision, extracted with ``git archive`` into a temporary folder) against this tree's ``src``, each run alternately
in its own process (``--rounds`` times, so that both see the same load) through

* ``scripts/hf_families_bench.py --only functions --decode-only``: HF's step and linattn's interleaved, the caches
  evicted between steps (rows ``1t gated_delta ... decode step``);
* ``scripts/decode_step_profile.py``: the adapter against the kernel alone, state cold and warm (Qwen3.5's 16/32
  heads of 128 x 128, Kimi's 32 of 128 x 128, and the 8 x 8 state of the per-call overhead).

Prints the raw rows and the medians over rounds per revision; with ``--out``, writes them (atomically, never over
an existing file unless ``--overwrite``).

    python scripts/revision_decode_ab.py --base HEAD~1 --rounds 3 --out benchmarks/results/x_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = re.compile(r"^1t (gated_delta|kda) .*decode step\s+HF\s+([\d.]+) linattn\s+([\d.]+) ms")
PROFILE = re.compile(r"^(Qwen3\.5 GDN|Kimi KDA) (\S+) .*thr 1 (warm|cold) .*kernel\s+([\d.]+) .*adapter\s+([\d.]+)"
                     r"\s+HF\s+([\d.]+)")


def processor() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")


def extract(rev: str, into: Path) -> Path:
    """``src`` of ``rev`` under ``into``."""
    archive = into / "src.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=f, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run(src: Path, script: str, args: list[str]) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args], env=env, capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if BENCH.match(line) or PROFILE.match(line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare this tree's src against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=150, help="steps per row of decode_step_profile.py")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if args.out:
        from linattn.tools.harness.results import check_writable

        check_writable(args.out, overwrite=args.overwrite)
    lines, bench, profile = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"base": extract(args.base, Path(tmp)), "this": ROOT / "src"}
        for r in range(args.rounds):
            for name, src in paths.items():
                got = run(src, "hf_families_bench.py", ["--only", "functions", "--decode-only", "--threads", "1",
                                                       "--repeats", "5"])
                got += run(src, "decode_step_profile.py", ["--repeats", str(args.repeats), "--rounds", "1"])
                for line in got:
                    lines.append(f"round {r} {name:4s}  {line}")
                    print(lines[-1], flush=True)
                    if m := BENCH.match(line):
                        bench.setdefault((m[1], name), []).append((float(m[2]), float(m[3])))
                    elif m := PROFILE.match(line):
                        profile.setdefault((m[1], m[2], m[3], name), []).append(
                            (float(m[4]), float(m[5]), float(m[6])))
    med = statistics.median
    summary = [f"medians over {args.rounds} alternated rounds; base = {args.base}, this = the tree's src",
               "hf_families_bench (ms, caches evicted between steps):"]
    for (family, name), rows in sorted(bench.items()):
        hf, ours = med(r[0] for r in rows), med(r[1] for r in rows)
        summary.append(f"  {family:12s} {name:4s}  HF {hf:6.3f}  linattn {ours:6.3f}  HF/linattn {hf / ours:5.2f}x "
                       f"(each round: {', '.join(f'{r[0] / r[1]:.2f}x' for r in rows)})")
    summary.append("decode_step_profile (us): kernel alone, the adapter, HF's step")
    for (model, geometry, temp, name), rows in sorted(profile.items()):
        k, a, hf = (med(r[i] for r in rows) for i in range(3))
        summary.append(f"  {model:13s} {geometry:16s} {temp}  {name:4s}  kernel {k:7.1f}  adapter {a:7.1f}  "
                       f"adapter - kernel {a - k:6.1f}  HF/adapter {hf / a:5.2f}x")
    print("\n".join(summary))
    if args.out:
        from linattn.tools.harness.results import atomic_write

        header = (f"HF's Gated DeltaNet / KDA decode step at two revisions; {processor()}, {os.cpu_count()} "
                  f"cores, one thread, load average (1 min) {os.getloadavg()[0]:.2f} at the end\n")
        text = header + "\n".join(summary) + "\n\nraw rows:\n" + "\n".join(lines) + "\n"
        atomic_write(args.out, lambda p: p.write_text(text, encoding="utf-8"), overwrite=args.overwrite)


if __name__ == "__main__":
    main()
