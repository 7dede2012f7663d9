"""Several seeds of one ``linattn mqar`` setting, side by side: per mixer the mean, the spread (min-max) and the
values of every accuracy the runs report (``linattn mqar --summarize a.json b.json ...``)."""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from linattn.tools.harness.plotting import pyplot, save_figure

SCHEMA = "linattn.mqar_seeds/1"
# Config keys that may differ between the summarized runs (everything else must agree).
MAY_DIFFER = ("seed", "resume", "budget_s", "histories", "latency_repeats", "quick", "mixers")


def _metrics(rec: dict[str, Any], n_table: int) -> dict[str, float]:
    """Flat name -> value for one model record."""
    out: dict[str, float] = {}
    for r in rec["eval"]:
        if r["distance"] == "all":
            out[f"acc_all@{r['num_pairs']}"] = r["accuracy"]
        elif r["num_pairs"] == n_table and r["distance"] in ("short", "long"):
            out[f"acc_{r['distance']}@{n_table}"] = r["accuracy"]
    ctl = rec.get("controls") or {}
    if ctl.get("overwrites"):
        out["overwrites"] = ctl["overwrites"]["accuracy"]
    for r in ctl.get("near_duplicate", []):
        if r["rho"] is not None:
            out[f"near_duplicate@{r['rho']:g}"] = r["accuracy"]
    for r in ctl.get("precision", []):
        for p in ("float32", "bfloat16_state_float32", "bfloat16"):
            out[f"{p}@T{r['total_len']}"] = r[p]
    for r in ctl.get("moved", []):
        out[f"moved_gap{r['gap']}@T{r['total_len']}"] = r["accuracy"]
    if rec.get("final_loss") is not None:
        out["final_loss"] = rec["final_loss"]
    return out


def summarize(docs: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """The seeds document (schema ``mqar_seeds``). Raises ValueError naming the setting when the runs differ in
    anything but the seed, the mixers and the budget/latency settings, or repeat a seed. Each mixer is summarized
    over the runs that have it (its ``seeds``); mixers found in fewer than two runs are listed in ``skipped``."""
    if len(docs) < 2:
        raise ValueError(f"summarize: needs at least two result files, got {len(docs)}")
    base = {k: v for k, v in docs[0]["config"].items() if k not in MAY_DIFFER}
    for doc, src in zip(docs[1:], sources[1:], strict=True):
        other = {k: v for k, v in doc["config"].items() if k not in MAY_DIFFER}
        diff = sorted(k for k in base.keys() | other.keys() if base.get(k) != other.get(k))
        if diff:
            raise ValueError(f"summarize: {src} differs from {sources[0]} in {', '.join(diff)}")
    seeds = [d["config"]["seed"] for d in docs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"summarize: seeds repeat ({seeds})")
    n_table = docs[0]["table"][0]["num_pairs"] if docs[0]["table"] else max(base["train_pairs"])
    names = list(dict.fromkeys(r["mixer"] for d in docs for r in d["models"]))
    mixers, skipped = [], []
    for name in names:
        found = [(d["config"]["seed"], r) for d in docs for r in d["models"] if r["mixer"] == name]
        if len(found) < 2:
            skipped.append(name)
            continue
        recs = [r for _, r in found]
        per_seed = [_metrics(r, n_table) for r in recs]
        keys = [k for k in per_seed[0] if all(k in m for m in per_seed)]
        metrics = {}
        for k in keys:
            vals = [m[k] for m in per_seed]
            metrics[k] = {"values": vals, "mean": statistics.fmean(vals), "min": min(vals), "max": max(vals),
                          "std": statistics.stdev(vals)}
        mixers.append({"mixer": name, "seeds": [s for s, _ in found], "state_floats": recs[0]["state_floats"],
                       "steps_done": [r["steps_done"] for r in recs], "stop_reason": [r["stop_reason"] for r in recs],
                       "metrics": metrics})
    if not mixers:
        raise ValueError("summarize: no mixer appears in two of the result files")
    return {"schema": SCHEMA, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "sources": sources, "seeds": seeds, "num_pairs": n_table, "skipped": skipped,
            "config": {**base, "mixers": [m["mixer"] for m in mixers]}, "mixers": mixers}


def format_summary(doc: dict[str, Any]) -> str:
    """Mean [min-max] in percent over the seeds, one row per mixer."""
    n = doc["num_pairs"]
    pairs = doc["config"]["eval_pairs"]
    cols = [(f"{p} pairs", f"acc_all@{p}") for p in pairs] + [
        (f"{n}p short", f"acc_short@{n}"), (f"{n}p long", f"acc_long@{n}"), ("overwrites", "overwrites"),
        ("dup rho .9", "near_duplicate@0.9")]
    prec = [k for k in doc["mixers"][0]["metrics"] if k.startswith("bfloat16@T")]
    if prec:
        T = prec[-1].split("@")[1]
        cols += [(f"f32 {T}", f"float32@{T}"), (f"bf16w {T}", f"bfloat16_state_float32@{T}"),
                 (f"bf16 {T}", f"bfloat16@{T}")]
    lines = [f"seeds {doc['seeds']}: mean [min-max] %, {doc['config']['steps']} steps",
             f"{'mixer':<20}{'seeds':>7}{'state':>6}" + "".join(f"{c:>15}" for c, _ in cols)]
    for m in doc["mixers"]:
        cells = []
        for _, key in cols:
            s = m["metrics"].get(key)
            cells.append("-" if s is None else f"{100 * s['mean']:.0f} [{100 * s['min']:.0f}-{100 * s['max']:.0f}]")
        seeds = ",".join(str(x) for x in m["seeds"])
        lines.append(f"{m['mixer']:<20}{seeds:>7}{m['state_floats']:>6}" + "".join(f"{c:>15}" for c in cells))
    if doc["skipped"]:
        lines.append(f"in fewer than two runs, not summarized: {', '.join(doc['skipped'])}")
    return "\n".join(lines)


def plot_summary(doc: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Accuracy vs pairs (mean, min-max band) and the controls as bars with min-max whiskers, per mixer."""
    plt = pyplot()
    fig, (ax_p, ax_c) = plt.subplots(1, 2, figsize=(17, 5), gridspec_kw={"width_ratios": [1, 1.6]})
    colors = dict(zip([m["mixer"] for m in doc["mixers"]], plt.cm.tab10.colors, strict=False))
    pairs = doc["config"]["eval_pairs"]
    for m in doc["mixers"]:
        st = [m["metrics"][f"acc_all@{p}"] for p in pairs]
        c = colors[m["mixer"]]
        ax_p.plot(pairs, [100 * s["mean"] for s in st], "o-", color=c, label=m["mixer"])
        ax_p.fill_between(pairs, [100 * s["min"] for s in st], [100 * s["max"] for s in st], color=c, alpha=0.15)
    ax_p.plot(pairs, [100 / p for p in pairs], ":", color="black", label="chance (1/pairs)")
    ax_p.set(title="exact recall vs pairs over seeds (mean, band = min-max)", xlabel="key-value pairs",
             ylabel="accuracy (%)", ylim=(-3, 103))
    n = doc["num_pairs"]
    keys = [f"acc_all@{n}", "overwrites", "near_duplicate@0.9"]
    prec = [k for k in doc["mixers"][0]["metrics"] if k.startswith("bfloat16@T")]
    if prec:
        T = prec[-1].split("@")[1]
        keys += [f"float32@{T}", f"bfloat16_state_float32@{T}", f"bfloat16@{T}"]
    width = 0.8 / len(doc["mixers"])
    for i, m in enumerate(doc["mixers"]):
        st = [m["metrics"].get(k) for k in keys]
        mean = [np.nan if s is None else 100 * s["mean"] for s in st]
        err = [[0 if s is None else 100 * (s["mean"] - s["min"]) for s in st],
               [0 if s is None else 100 * (s["max"] - s["mean"]) for s in st]]
        ax_c.bar(np.arange(len(keys)) + (i - (len(doc["mixers"]) - 1) / 2) * width, mean, width, yerr=err,
                 capsize=2, color=colors[m["mixer"]], label=m["mixer"])
    ax_c.set_xticks(range(len(keys)), [k.replace("bfloat16_state_float32", "bf16 w/f32 state") for k in keys],
                    fontsize=8)
    ax_c.set(title=f"{n} pairs and the controls (mean, whiskers = min-max over seeds)", ylabel="accuracy (%)",
             ylim=(0, 103))
    for ax in (ax_p, ax_c):
        ax.grid(True, alpha=0.3)
    ax_p.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, overwrite=overwrite)
