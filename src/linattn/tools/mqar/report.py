"""The table and the six-panel plot of one ``linattn mqar`` result (schema ``mqar``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from linattn.tools.harness.plotting import pyplot, save_figure


def _controls_cells(rec: dict[str, Any]) -> tuple[float | None, ...]:
    """(overwritten, near-duplicate at rho 0.9, float32 / bf16 + f32 state / all bf16 at the longest length)."""
    ctl = rec.get("controls") or {}
    ovr = (ctl.get("overwrites") or {}).get("accuracy")
    dup = next((r["accuracy"] for r in ctl.get("near_duplicate", []) if r["rho"] == 0.9), None)
    prec = (ctl.get("precision") or [{}])[-1]
    return ovr, dup, prec.get("float32"), prec.get("bfloat16_state_float32"), prec.get("bfloat16")


def format_table(doc: dict[str, Any]) -> str:
    hs = doc["config"]["histories"]
    n = doc["table"][0]["num_pairs"] if doc["table"] else 0

    def pct(x):
        return "   -" if x is None else f"{100 * x:4.0f}"

    head = f"{'mixer':<20}{'state':>7}" + "".join(f"{f'ms@{h // 1024}K' if h >= 1024 else f'ms@{h}':>10}"
                                                    for h in hs)
    head += f"{'short%':>8}{'long%':>7}{'all%':>6}   (pairs = {n})"
    head += f" | controls{'ovr%':>6}{'dup.9%':>8}{'f32%':>6}{'bf16w%':>8}{'bf16%':>7}"
    lines = [head]
    recs = {r["mixer"]: r for r in doc["models"]}
    for row in doc["table"]:
        ms = "".join(f"{row['ms_per_token'].get(str(h), float('nan')):>10.3f}" for h in hs)
        ovr, dup, f32, bfw, bf = _controls_cells(recs[row["mixer"]])
        lines.append(f"{row['mixer']:<20}{recs[row['mixer']]['state_floats']:>7}{ms}{pct(row['acc_short']):>8}"
                     f"{pct(row['acc_long']):>7}{pct(row['acc_all']):>6}{'':>15} |{'':>8}{pct(ovr):>6}"
                     f"{pct(dup):>8}{pct(f32):>6}{pct(bfw):>8}{pct(bf):>7}")
    ctl = next((r["controls"] for r in doc["models"] if r.get("controls")), None)
    if ctl and "precision" in ctl:
        longest = ctl["precision"][-1]
        lines.append(f"controls at {ctl['num_pairs']} pairs: ovr = {ctl['num_pairs'] // 2} keys written again "
                     f"with new values; dup.9 = key embeddings sharing 90% of their direction; f32 / bf16w (bfloat16 "
                     f"weights, float32 state) / bf16 (all bfloat16, state too) at T = {longest['total_len']}")
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Six panels: training loss, accuracy vs pairs, accuracy vs distance, decode ms/token vs history, and the
    controls: accuracy vs near-duplicate key similarity, and overwrites / precision per mixer."""
    plt = pyplot()
    fig, grid = plt.subplots(2, 3, figsize=(19, 9.2))
    axes = grid.ravel()
    colors = dict(zip([m["mixer"] for m in doc["models"]], plt.cm.tab10.colors, strict=False))
    n_table = doc["table"][0]["num_pairs"] if doc["table"] else None
    for rec in doc["models"]:
        c, name = colors[rec["mixer"]], rec["mixer"]
        curve = np.array(rec["loss_curve"])
        if curve.size:
            axes[0].plot(curve[:, 0], curve[:, 1], color=c, label=name)
        alls = [r for r in rec["eval"] if r["distance"] == "all"]
        axes[1].plot([r["num_pairs"] for r in alls], [100 * r["accuracy"] for r in alls], "o-", color=c, label=name)
        bins = [r for r in rec["eval"] if r["num_pairs"] == n_table and r["distance"] not in ("all", "short", "long")]
        axes[2].plot(range(len(bins)), [100 * r["accuracy"] for r in bins], "o-", color=c, label=name)
        axes[2].set_xticks(range(len(bins)), [r["distance"] for r in bins])
        lat = [r for r in doc["latency"] if r["mixer"] == name]
        if lat:
            axes[3].plot([r["history"] for r in lat], [r["ms_per_token"] for r in lat], "o-", color=c, label=name)
    cfg = doc["config"]
    axes[0].set(title="training loss (query tokens)", xlabel="step", ylabel="cross-entropy", yscale="log")
    pairs = sorted({r["num_pairs"] for m in doc["models"] for r in m["eval"]})
    axes[1].plot(pairs, [100 / p for p in pairs], ":", color="black", label="chance (1/pairs)")
    axes[1].set(title=f"exact recall vs pairs (trained on {cfg['train_pairs']}, T={cfg['seq_len']})",
                xlabel="key-value pairs", ylabel="accuracy (%)", ylim=(-3, 103))
    axes[2].set(title=f"exact recall vs write-to-query distance ({n_table} pairs)", xlabel="distance (tokens)",
                ylabel="accuracy (%)", ylim=(-3, 103))
    axes[3].set(title="decode latency per token (batch 1)", xlabel="history (tokens)", ylabel="ms / token",
                xscale="log", yscale="log")
    hs = cfg["histories"]
    if not doc["latency"]:
        axes[3].text(0.5, 0.5, "not measured in this run\n(--no-latency; see --latency-from)", ha="center",
                     va="center", transform=axes[3].transAxes)
    axes[3].set_xticks(hs, [f"{h // 1024}K" if h >= 1024 else str(h) for h in hs])
    axes[3].minorticks_off()
    _plot_controls(doc, axes[4], axes[5], colors)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, overwrite=overwrite)


def _plot_controls(doc: dict[str, Any], ax_dup, ax_bars, colors) -> None:
    """Near-duplicate keys: accuracy vs the keys' mean pairwise cosine; bars: overwrites and the three precisions."""
    recs = [r for r in doc["models"] if r.get("controls")]
    n = recs[0]["controls"]["num_pairs"] if recs else None
    for rec in recs:
        dup = rec["controls"].get("near_duplicate") or []
        pulled = [r for r in dup if r["rho"] is not None]
        ax_dup.plot([r["mean_cosine"] for r in pulled], [100 * r["accuracy"] for r in pulled], "o-",
                    color=colors[rec["mixer"]], label=rec["mixer"])
        for r in dup:
            if r["rho"] is None:  # the embeddings as trained
                ax_dup.plot(r["mean_cosine"], 100 * r["accuracy"], "*", ms=12, color=colors[rec["mixer"]])
    ax_dup.set(title=f"near-duplicate keys ({n} pairs; star: as trained)", xlabel="mean cosine between key embeddings",
               ylabel="accuracy (%)", ylim=(-3, 103))
    labels = ["overwrites", "float32", "bf16 w, f32 state", "bf16 all"]
    width = 0.8 / max(1, len(recs))
    for i, rec in enumerate(recs):
        ovr, _, f32, bfw, bf = _controls_cells(rec)
        vals = [float("nan") if v is None else 100 * v for v in (ovr, f32, bfw, bf)]
        ax_bars.bar(np.arange(len(labels)) + (i - (len(recs) - 1) / 2) * width, vals, width,
                    color=colors[rec["mixer"]], label=rec["mixer"])
    prec = (recs[0]["controls"].get("precision") or [{}])[-1] if recs else {}
    ax_bars.set_xticks(range(len(labels)), labels)
    ax_bars.set(title=f"overwritten keys; precision at T = {prec.get('total_len', '?')} ({n} pairs)",
                ylabel="accuracy (%)", ylim=(0, 103))
