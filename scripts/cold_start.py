"""Cold start of the compiled CPU kernels: seconds from launch to the first line of output, and to the end, for the
README's first Python block and for ``linattn bench``, each from an empty numba cache (a fresh NUMBA_CACHE_DIR,
which numba then uses instead of the ``__pycache__`` next to the kernels).

Several source trees can be compared in one run (``--tree before=/tmp/old/src --tree after=src``): their runs
alternate, so a change of machine load falls on both. Each tree runs its own README's first block. The machine's
load (``uptime``) is recorded before every run.

    PYTHONPATH=$PWD/src python scripts/cold_start.py --tree after=src --runs 2 -o benchmarks/results/cold_start_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTICE = "linattn: compiling"  # the kernels' one-line notice on stderr: not a result, so not "first output"


def first_block(readme: Path) -> str:
    match = re.search(r"```python\n(.*?)```", readme.read_text(), re.S)
    if match is None:
        raise SystemExit(f"{readme}: no python block")
    return match.group(1)


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(cmd: list[str], env: dict, cwd: str) -> tuple[float | None, float, int, str]:
    """Seconds to the first output line that is not the compile notice (None: none), seconds to exit, exit
    status, and the notice line if one was printed."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: list[float] = []
    notice: list[str] = []

    def watch(stream) -> None:
        for line in stream:
            if line.startswith(NOTICE):
                notice.append(line.strip())
            elif line.strip() and not first:
                first.append(time.perf_counter() - start)

    readers = [threading.Thread(target=watch, args=(s,)) for s in (proc.stdout, proc.stderr)]
    for r in readers:
        r.start()
    rc = proc.wait()
    total = time.perf_counter() - start
    for r in readers:
        r.join()
    return (first[0] if first else None), total, rc, (notice[0] if notice else "")


def one_run(name: str, src: Path, what: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cold_start_") as tmp:
        env = dict(os.environ, PYTHONPATH=str(src), NUMBA_CACHE_DIR=os.path.join(tmp, "numba"),
                   OMP_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
        if what == "readme":
            cmd = [sys.executable, "-c", first_block(src.parent / "README.md")]
        else:
            cmd = [sys.executable, "-m", "linattn.tools.cli", "bench", "--no-progress", "-o",
                   os.path.join(tmp, "b.json")]
        before = load()
        first, total, rc, notice = timed(cmd, env, tmp)
    return dict(tree=name, what=what, first=first, total=total, rc=rc, load=before, notice=notice)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                    help="a source tree to time (its src folder; the README one level up); repeatable")
    ap.add_argument("--runs", type=int, default=2, help="cold runs per tree and program")
    ap.add_argument("--what", default="readme,bench", help="comma-separated: readme, bench")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="OMP/NUMBA_NUM_THREADS of the runs")
    ap.add_argument("-o", "--output", type=Path, help="also write the report here (refused if it exists)")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in (args.tree or [f"current={ROOT / 'src'}"])]
    if args.output is not None and args.output.exists() and not args.overwrite:
        raise SystemExit(f"--output {args.output} exists (--overwrite replaces it)")
    lines = [f"cold start from an empty numba cache; processor: {processor()}, {os.cpu_count()} cores, "
             f"{args.threads} threads; python {platform.python_version()}",
             f"started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average (1/5/15 min) {load()}",
             "", f"{'tree':8} {'program':7} {'run':>3} {'first output s':>14} {'total s':>8} {'rc':>3}  load before"]
    print("\n".join(lines), flush=True)
    rows = []
    for what in args.what.split(","):
        for i in range(args.runs):
            for name, src in trees:
                r = one_run(name, Path(src).resolve(), what, args.threads)
                rows.append(r)
                first = "-" if r["first"] is None else f"{r['first']:.1f}"
                line = f"{name:8} {what:7} {i + 1:>3} {first:>14} {r['total']:8.1f} {r['rc']:>3}  {r['load']}"
                lines.append(line)
                print(line, flush=True)
    lines += ["", "medians (first output / total, s):"]
    for what in args.what.split(","):
        for name, _ in trees:
            sel = [r for r in rows if r["tree"] == name and r["what"] == what]
            firsts = [r["first"] for r in sel if r["first"] is not None]
            med = f"{statistics.median(firsts):.1f}" if firsts else "-"
            lines.append(f"  {name:8} {what:7} {med:>6} / {statistics.median(r['total'] for r in sel):.1f}")
    notices = sorted({r["notice"] for r in rows if r["notice"]})
    lines += ["", "compile notice printed: " + (" | ".join(notices) if notices else "none")]
    lines.append(f"finished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {load()}")
    print("\n".join(lines[-(len(args.what.split(',')) * len(trees) + 4):]), flush=True)
    if args.output is not None:
        tmp = args.output.with_suffix(args.output.suffix + ".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        os.replace(tmp, args.output)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
