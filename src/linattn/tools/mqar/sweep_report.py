"""Tables and zoology-style plots of an ``mqar_sweep`` document (complete or partial)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from linattn.tools.harness.plotting import pyplot, save_figure


def _settings(doc: dict[str, Any]) -> list[tuple[int, int]]:
    return [(T, P) for T, P, *_ in doc["config"]["settings"]]


def format_best(doc: dict[str, Any]) -> str:
    """Progress, then one row per mixer and width: per setting the seeds' mean test accuracy [min-max] at the
    winning lr; ``*`` marks an entry on the plateau, ``+`` one won in the plateau extension (longer runs), ``?`` one
    whose seeds (or extension) are not all finished."""
    p = doc["progress"]
    lines = [f"runs finished: {p['finished']} of {p['total']}{' (complete)' if p['complete'] else ''}"]
    best = {(b["mixer"], b["d_model"], b["seq_len"], b["num_pairs"]): b for b in doc["best"]}
    settings = _settings(doc)
    lines.append(f"{'mixer':<20}{'d':>5}" + "".join(f"{f'T{T}/{P} pairs':>26}" for T, P in settings))
    for d in doc["config"]["widths"]:
        for mixer in doc["config"]["mixers"]:
            cells = []
            for T, P in settings:
                b = best.get((mixer, d, T, P))
                if b is None:
                    cells.append("-")
                    continue
                mark = ("*" if b["plateau"] else "") + ("+" if b.get("extended") else "") + (
                    "" if b["complete"] else "?")
                cells.append(f"{100 * b['test_mean']:.0f} [{100 * b['test_min']:.0f}-{100 * b['test_max']:.0f}] "
                             f"lr {b['lr']:.2g}{mark}")
            lines.append(f"{mixer:<20}{d:>5}" + "".join(f"{c:>26}" for c in cells))
    lines.append("test accuracy % at the lr with the best validation accuracy: mean [min-max] over seeds "
                 f"{doc['config']['seeds']}; * = no lr left the plateau, + = won in the plateau extension, "
                 "? = seeds or extension not all finished")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Accuracy against model width, one panel per (sequence length, pairs), a line per mixer (mean over seeds at
    the winning lr, whiskers min-max; hollow markers: on the plateau)."""
    plt = pyplot()
    settings = _settings(doc)
    fig, axes = plt.subplots(1, len(settings), figsize=(max(7.0, 4.6 * len(settings)), 4.4), squeeze=False,
                             sharey=True)
    mixers = doc["config"]["mixers"]
    colors = dict(zip(mixers, plt.cm.tab10.colors, strict=False))
    for ax, (T, P) in zip(axes[0], settings, strict=True):
        for mixer in mixers:
            pts = sorted((b for b in doc["best"] if (b["mixer"], b["seq_len"], b["num_pairs"]) == (mixer, T, P)),
                         key=lambda b: b["d_model"])
            if not pts:
                continue
            xs = [b["d_model"] for b in pts]
            mean = [100 * b["test_mean"] for b in pts]
            err = [[m - 100 * b["test_min"] for m, b in zip(mean, pts, strict=True)],
                   [100 * b["test_max"] - m for m, b in zip(mean, pts, strict=True)]]
            c = colors[mixer]
            ax.errorbar(xs, mean, yerr=err, color=c, capsize=3, label=mixer)
            for x, m, b in zip(xs, mean, pts, strict=True):
                ax.plot([x], [m], "o", color=c, mfc="white" if b["plateau"] else c, zorder=3)
        ax.axhline(100 / P, ls=":", color="black", lw=1)
        ax.set(title=f"sequence length {T}, {P} pairs", xlabel="model width", xscale="log", ylim=(-3, 103))
        widths = doc["config"]["widths"]
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlim(min(widths) / 1.3, max(widths) * 1.3)
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("MQAR test accuracy (%)")
    shown = {}  # one legend for all panels, also when the last panel has no finished group yet
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            shown.setdefault(label, h)
    if shown:
        axes[0][-1].legend(list(shown.values()), list(shown), fontsize=8)
    p = doc["progress"]
    fig.suptitle(f"MQAR: best over learning rates {doc['config']['lrs']}\nmean and range over seeds at the best lr "
                 f"({p['finished']} of {p['total']} runs; hollow: on the plateau; dotted: chance)", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, overwrite=overwrite)
