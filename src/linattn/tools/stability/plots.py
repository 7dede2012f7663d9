"""The stability result drawn: worst error per length for each rule, the epsilon panel and the rescaling panel."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from linattn.tools.harness.plotting import pyplot, save_figure
from linattn.tools.stability.report import worst_by_length


def _plot_epsilon(ax, eps: dict[str, Any]) -> None:
    """The eps panel: one curve per ``add`` eps (change against the denominator, one color per eps). ``clamp``
    changes exactly the tokens whose denominator is below eps (to ``1 - den/eps``, so near 1 there) and nothing
    above, so its curves would lie under the ``add`` curves' plateau at 1 and drop to zero, where a log axis
    cannot draw them: each is a dotted line at eps instead, and a clamp that changed no token is named, not drawn."""
    values = sorted({c["eps"] for c in eps["cases"]})
    color = {e: f"C{k % 10}" for k, e in enumerate(values)}
    untouched = []
    for case in eps["cases"]:
        rows = [r for r in case["by_den_decade"] if r["max_rel_change"] > 0]
        if case["eps_mode"] == "add" and rows:
            ax.loglog([10.0 ** r["decade"] for r in rows], [r["max_rel_change"] for r in rows], "-", marker=".",
                      color=color[case["eps"]], label=f"add, eps {case['eps']:g}")
        elif case["eps_mode"] == "clamp" and rows and eps["den_min"] < case["eps"]:
            ax.axvline(case["eps"], color=color[case["eps"]], ls=":", lw=1.5)
        elif case["eps_mode"] == "clamp":
            untouched.append(f"{case['eps']:g}")
    ax.plot([], [], ls=":", color="gray", label="clamp, eps: changes only den < eps")
    if untouched:
        ax.plot([], [], ls="none", label=f"clamp, eps {', '.join(untouched)}: no token changed")
    ax.set(title="eps: change vs eps = 0 (float64)", xlabel="denominator q^T z (decade start)",
           ylabel="worst rel. change of a token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")  # the curves fall to the right: the lower left stays empty


def plot(doc: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Error vs length per dtype (log-log, one panel per rule) and the epsilon trade-off, as one PNG."""
    plt = pyplot()
    rules, dtypes = doc["config"]["rules"], doc["config"]["dtypes"]
    ncol = 3
    nrow = math.ceil((len(rules) + 2) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.0 * ncol, 3.9 * nrow), squeeze=False)
    flat = list(axes.flat)
    for ax, rule in zip(flat, rules, strict=False):
        top = 3.0
        for name in dtypes:
            worst = worst_by_length(doc["records"], rule, name)
            pts = [(t, e) for t, e in sorted(worst.items()) if e is not None]
            label = name if pts else f"{name}: kernel failed"
            ax.loglog([p[0] for p in pts], [max(p[1], 1e-17) for p in pts], "o-", label=label)
            top = max([top] + [3 * e for _, e in pts])
        ax.set(title=f"{rule} ({doc['config']['form']} form)", xlabel="sequence length T",
               ylabel="worst per-token rel. error", ylim=(1e-8, top))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    _plot_epsilon(flat[len(rules)], doc["epsilon"])
    ax = flat[len(rules) + 1]
    rs = doc["rescaling"]
    pos = rs["error_by_position"]
    for key, label in (("plain_max_rel", "one call"), ("rescaled_max_rel", f"rescaled every {rs['segment']}")):
        pts = [(p["start"], p[key]) for p in pos if p[key] is not None]
        ax.semilogy([p[0] for p in pts], [max(p[1], 1e-17) for p in pts], ".-", label=label)
    ax.set(title=f"accumulate, chunk form, {rs['candidate']['dtype']}: state rescaling",
           xlabel="token position (window start)", ylabel="worst rel. error in window")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    for ax in flat[len(rules) + 2:]:
        ax.axis("off")
    fig.tight_layout()
    return save_figure(fig, path, overwrite=overwrite, dpi=110)


