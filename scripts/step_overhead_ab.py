"""Decode ``step`` of this tree against another revision, side by side in one process (B=1, H=8, D=64, float32,
one thread): whole calls for every rule with ``inplace`` False and True, in alternating blocks.

On a shared machine the medians move by tens of microseconds, far more than validation costs; the minimum over
many short blocks is what an unpreempted call costs. Usage, from the repository root:

    git worktree add /tmp/linattn-base main          # or: git archive <rev> src | tar -x -C /tmp/linattn-base
    python scripts/step_overhead_ab.py /tmp/linattn-base/src
"""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def load_base(src: Path):
    """The other revision's package, imported as ``linattn_base`` (a renamed copy, so both load in one process)."""
    tmp = Path(tempfile.mkdtemp())
    # Without __pycache__: numba's disk cache there may index kernels of another loader ('<dynamic>' on reload).
    shutil.copytree(src / "linattn", tmp / "linattn_base", ignore=shutil.ignore_patterns("__pycache__"))
    for path in (tmp / "linattn_base").rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\blinattn\.", "linattn_base.", text)
        text = re.sub(r"from linattn import", "from linattn_base import", text)
        # Both names bound: "linattn." was rewritten above, a bare "linattn" (an argument, a default) was not.
        path.write_text(re.sub(r"^import linattn$", "import linattn_base\nimport linattn_base as linattn", text,
                               flags=re.M))
    sys.path.insert(0, str(tmp))
    import linattn_base

    return linattn_base


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.path.insert(0, str(ROOT / "src"))
    import linattn

    base = load_base(Path(sys.argv[1]).resolve())
    torch.set_num_threads(1)
    torch.manual_seed(0)
    B, H, D = 1, 8, 64
    q, k, v = (torch.randn(B, H, D) for _ in range(3))
    k = F.normalize(k, dim=-1)
    g, beta = torch.full((B, H), -0.1), torch.full((B, H), 0.5)
    cases = [("accumulate", {"feature_map": "elu1"}), ("gated", {"g": g}), ("delta", {"beta": beta}),
             ("gated_delta", {"g": g, "beta": beta})]
    mods = {"base": base, "this": linattn}
    print(f"step, B={B} H={H} D={D} float32, 1 thread; us per call over 200 alternating blocks of 50 calls")
    for rule, kw in cases:
        for inplace in (False, True):
            states = {name: m.step(q, k, v, None, rule=rule, **kw)[1] for name, m in mods.items()}
            times = {name: [] for name in mods}
            for block in range(201):
                order = list(mods) if block % 2 else list(mods)[::-1]
                for name in order:
                    step, st = mods[name].step, states[name]
                    start = time.perf_counter_ns()
                    for _ in range(50):
                        _, st = step(q, k, v, st, rule=rule, inplace=inplace, **kw)
                    if block:
                        times[name].append((time.perf_counter_ns() - start) / 50e3)
                    states[name] = st
            lo = {n: min(t) for n, t in times.items()}
            med = {n: statistics.median(t) for n, t in times.items()}
            print(f"{rule:12s} inplace={inplace!s:5s}  min: base {lo['base']:6.1f} this {lo['this']:6.1f} "
                  f"({lo['this'] - lo['base']:+5.1f})   median: base {med['base']:6.1f} this {med['this']:6.1f}")


if __name__ == "__main__":
    main()
