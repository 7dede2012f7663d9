"""Plant a fixed list of bugs, one at a time, and report which tests catch each.

Each mutant is a textual patch (an exact snippet and its replacement) applied to a temporary copy of ``src/`` and
``tests/`` (never to this tree); then the test suite runs on that copy and every failing test is recorded. A bug
that no test catches is a hole in the suite. The list holds bugs that once survived the suite, in the four
places where a regression would land unnoticed: the tools' own reference checks, the precision devices, the peer
adapters and the perf cross-check, ``State``'s methods; plus the slab carry and a reference feature-map twin.

Usage (from the repository root; not part of the pytest suite)::

    python scripts/mutation_check.py                 # every mutant, the test files listed with it (~5 min)
    python scripts/mutation_check.py --full          # every mutant, the full suite each (~10 min on 2 cores)
    python scripts/mutation_check.py --only float32_cumsum --only half_carry_chunks
    python scripts/mutation_check.py --list

Exit status 0 when every mutant was caught and the unmutated copy passes, 1 otherwise. The record of the last
run is in docs/testing.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    place: str  # which of the four places it belongs to
    what: str
    path: str  # relative to the repository root
    old: str | tuple[str, ...]  # must occur exactly once in the file (alternatives: the first one found is used)
    new: str
    tests: tuple[str, ...]  # test files that should catch it (run by default; --full runs every test)


MUTANTS: tuple[Mutant, ...] = (
    Mutant("bench_check_vs_itself", "tool self-checks",
           "linattn bench compares the float64 reference with itself",
           "src/linattn/tools/bench/workload.py",
           "got = output.detach().double().cpu().numpy()", "got = o_ref[:, -1]",
           ("tests/test_selfchecks.py", "tests/test_bench.py")),
    Mutant("stability_check_vs_itself", "tool self-checks",
           "linattn stability compares the NumPy reference with itself",
           "src/linattn/tools/stability/measure.py",
           "return float(np.abs(o.numpy() - ref).max())", "return float(np.abs(ref - ref).max())",
           ("tests/test_selfchecks.py", "tests/test_stability.py")),
    Mutant("perf_mismatch_path", "tool self-checks",
           "linattn perf's cross-check calls every peer a match",
           "src/linattn/tools/perf/peers.py",
           '"status": "match" if rel <= tol else "MISMATCH"', '"status": "match"',
           ("tests/test_selfchecks.py", "tests/test_perf.py", "tests/test_peers.py")),
    Mutant("half_carry_chunks", "precision",
           "a half-precision state is carried across chunks in half precision",
           "src/linattn/ops/common.py",
           "return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype", "return dtype",
           ("tests/test_precision.py",)),
    Mutant("half_carry_slabs", "precision",
           "the chunk form hands the state from slab to slab in the half dtype",
           "src/linattn/prefill.py",
           "initial_state=S, chunk_size=call.chunk_size, scale=scale_,",
           "initial_state=S.to(dtype), chunk_size=call.chunk_size, scale=scale_,",
           ("tests/test_precision.py",)),
    Mutant("float32_cumsum", "precision",
           "cumulative log-gates summed in the working dtype instead of float64",
           "src/linattn/ops/common.py",
           "g.to(torch.float64).clamp(min=LOG_GATE_FLOOR).cumsum(dim=dim)",
           "g.clamp(min=LOG_GATE_FLOOR).cumsum(dim=dim)",
           ("tests/test_precision.py", "tests/test_forms.py")),
    Mutant("peer_fla_gate_beta_swap", "peer adapters",
           "fla's chunked gated delta rule adapter passes beta as the gate and g as beta",
           "src/linattn/tools/perf/peers.py",
           "Tensor:\n    return fn(inp.q, inp.k, inp.v, inp.g, inp.beta)[0]\n\n\ndef _fla_gdr_recurrent",
           "Tensor:\n    return fn(inp.q, inp.k, inp.v, inp.beta, inp.g)[0]\n\n\ndef _fla_gdr_recurrent",
           ("tests/test_peers.py",)),
    Mutant("peer_hf_gate_beta_swap", "peer adapters",
           "HF's Qwen3-Next adapter passes beta as the gate and g as beta",
           "src/linattn/tools/perf/peers.py",
           "return fn(inp.q, inp.k, inp.v, inp.g, inp.beta)[0]  # scales q",
           "return fn(inp.q, inp.k, inp.v, inp.beta, inp.g)[0]  # scales q",
           ("tests/test_peers.py",)),
    Mutant("state_clone_is_self", "State methods",
           "State.clone returns the same object (caught by the State method tests)",
           "src/linattn/state.py",
           ("return State(self.S.clone(), None if self.z is None else self.z.clone())",
            "return self._map(lambda x: x.clone(memory_format=torch.contiguous_format))"),  # an older State
           "return self",
           ("tests/test_state.py",)),
    Mutant("reference_softplus_twin", "reference feature maps",
           "the reference's NumPy softplus twin drops the log1p(exp(-|x|)) term",
           "src/linattn/reference.py",
           "return np.logaddexp(0.0, x)", "return np.maximum(x, 0.0)",
           ("tests/test_forms.py", "tests/test_reference.py")),
)


def copy_tree(dest: Path) -> None:
    for name in ("src", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.path
    text = path.read_text()
    for old in (mutant.old,) if isinstance(mutant.old, str) else mutant.old:
        if text.count(old) == 1:
            path.write_text(text.replace(old, mutant.new))
            return
    raise SystemExit(f"{mutant.name}: its snippet does not occur exactly once in {mutant.path}; "
                     "update the mutant to the current source")


def run_tests(tree: Path, targets: tuple[str, ...]) -> tuple[int, list[str], str, float]:
    """(exit code, failing test ids, last line of pytest's output, seconds) for ``targets`` in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pytest", "-q", "--tb=no", "-rfE", "-p", "no:cacheprovider", *targets]
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", res.stdout, flags=re.M)
    lines = [s for s in res.stdout.strip().splitlines() if s.strip()]
    return res.returncode, failed, lines[-1] if lines else res.stderr.strip()[-300:], time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="run the full suite for each mutant")
    parser.add_argument("--only", action="append", default=[], help="mutant name (repeatable)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"unknown mutant(s) {sorted(unknown)}; see --list")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:<26} [{m.place}] {m.what}")
        return 0

    survived = []
    with tempfile.TemporaryDirectory(prefix="linattn-mutants-") as tmp:
        base = Path(tmp) / "base"
        copy_tree(base)
        targets = () if args.full else tuple(sorted({t for m in chosen for t in m.tests if (base / t).exists()}))
        code, failed, summary, secs = run_tests(base, targets)
        print(f"unmutated copy: {summary} ({secs:.0f} s)", flush=True)
        if code != 0:
            print("the unmutated copy fails; fix the suite first:\n  " + "\n  ".join(failed))
            return 1
        for m in chosen:
            tree = Path(tmp) / m.name
            copy_tree(tree)
            apply(m, tree)
            targets = () if args.full else tuple(t for t in m.tests if (tree / t).exists())
            if not args.full and not targets:  # e.g. the State tests live on a branch not merged yet
                survived.append(m.name)
                print(f"\n{m.name} [{m.place}]: {m.what}\n  SURVIVED: none of {list(m.tests)} exists here", flush=True)
                shutil.rmtree(tree, ignore_errors=True)
                continue
            code, failed, summary, secs = run_tests(tree, targets)
            caught = code in (1, 2) and bool(failed)  # tests failed (or errored); not a usage error
            if not caught:
                survived.append(m.name)
            print(f"\n{m.name} [{m.place}]: {m.what}\n  {'CAUGHT' if caught else 'SURVIVED'} ({secs:.0f} s): "
                  f"{len(failed)} failing test(s); {summary}", flush=True)
            for test_id in failed[:8]:
                print(f"    {test_id}")
            if len(failed) > 8:
                print(f"    ... and {len(failed) - 8} more")
            shutil.rmtree(tree, ignore_errors=True)
    print(f"\n{len(chosen) - len(survived)} of {len(chosen)} mutants caught"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
