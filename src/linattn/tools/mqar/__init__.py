"""``linattn mqar``: multi-query associative recall, trained on a CPU, next to the decode latency of each mixer.

For each mixer (softmax attention, accumulate with elu+1 and with Taylor features, gated, delta, gated delta, a
gated-delta/attention hybrid) a two-layer :class:`linattn.nn.CausalLM` is trained on MQAR
(:mod:`linattn.tools.mqar.data`) within a step count and a time budget, then evaluated: exact-match recall by
number of pairs and by write-to-query distance, and the controls of :mod:`linattn.tools.mqar.controls` -- the
evidence moved at fixed total length (forgetting), overwritten and near-duplicate keys (write-rule capacity), and
bfloat16 weights with a float32 or a bfloat16 state (precision). Finally the decode latency
per token at histories of 2K/8K/32K tokens is timed side by side for every mixer: the KV cache of attention layers
holds that many random keys and values (contents do not change the time), the linear layers hold their fixed state.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch
from tqdm import tqdm

import linattn
from linattn.nn import KVCache
from linattn.tools.mqar.controls import control_pairs, controls
from linattn.tools.mqar.train import (
    MIXER_SPECS,
    TrainConfig,
    build_model,
    config_dict,
    evaluate,
    load_weights,
    state_floats,
    train,
)
from linattn.tools.results import atomic_write, check_label, read_result, refuse_existing, write_result

SCHEMA = "linattn.mqar/2"
QUICK = {"vocab_size": 32, "seq_len": 32, "train_pairs": (2, 4), "steps": 120, "batch_size": 32,
         "eval_pairs": (2, 4, 8), "eval_examples": 64, "histories": (512, 2048), "latency_repeats": 3}
FULL = {"vocab_size": 48, "seq_len": 48, "train_pairs": (2, 4, 8), "steps": 4000, "batch_size": 32,
        "eval_pairs": (2, 4, 8, 12), "eval_examples": 256, "histories": (2048, 8192, 32768), "latency_repeats": 7}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _short_long(rows: list[dict[str, Any]], n: int) -> tuple[float | None, float | None]:
    pick = {r["distance"]: r["accuracy"] for r in rows if r["num_pairs"] == n}
    return pick.get("short"), pick.get("long")


@torch.no_grad()
def decode_latency(models: dict[str, Any], histories: tuple[int, ...], *, repeats: int, calls: int = 5,
                   progress: bool = True) -> list[dict[str, Any]]:
    """Median milliseconds per decoded token (batch 1) for every (mixer, history), interleaved so that every
    mixer sees the same machine load; each timing is ``calls`` steps from the same cache (the history stays L)."""
    caches = {}
    for name, model in models.items():
        _, base = model(torch.ones(1, 8, dtype=torch.int64))
        for L in histories:
            layer_caches = []
            for block, c in zip(model.layers, base, strict=True):
                if isinstance(c, KVCache):
                    m = block.mixer
                    gen = torch.Generator().manual_seed(L)
                    c = KVCache(torch.randn(1, L, m.num_heads, m.head_dim, generator=gen),
                                torch.randn(1, L, m.num_heads, m.head_dim, generator=gen))
                layer_caches.append(c)
            caches[(name, L)] = layer_caches
    token = torch.ones(1, 1, dtype=torch.int64)
    times: dict[tuple[str, int], list[float]] = {k: [] for k in caches}
    for key in caches:  # warm-up
        models[key[0]](token, caches[key])
    for _ in tqdm(range(repeats), desc="decode latency", disable=not progress, unit="round"):
        for key, cache in caches.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                models[key[0]](token, cache)
            times[key].append((time.perf_counter() - t0) / calls * 1e3)
    rows = []
    for (name, L), ts in times.items():
        model = models[name]
        kv_bytes = sum(c.k.numel() + c.v.numel() for c in caches[(name, L)] if isinstance(c, KVCache)) * 4
        rows.append({"mixer": name, "history": L, "ms_per_token": round(statistics.median(ts), 4),
                     "ms_min": round(min(ts), 4), "kv_cache_bytes": kv_bytes,
                     "state_bytes": state_floats(model) * 4})
    return rows


def summary_table(records: list[dict[str, Any]], latency: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """One row per mixer: accuracy at ``n`` pairs (short, long, all distances) next to its decode latency."""
    table = []
    for rec in records:
        short, long = _short_long(rec["eval"], n)
        table.append({"mixer": rec["mixer"], "num_pairs": n, "acc_short": short, "acc_long": long,
                      "acc_all": next(r["accuracy"] for r in rec["eval"] if r["num_pairs"] == n
                                      and r["distance"] == "all"),
                      "ms_per_token": {str(r["history"]): r["ms_per_token"] for r in latency
                                       if r["mixer"] == rec["mixer"]}})
    return table


def latency_only(doc: dict[str, Any], source: str, checkpoint_dir: Path, *, histories: tuple[int, ...] | None,
                 repeats: int | None, threads: int, progress: bool = True) -> dict[str, Any]:
    """Only the decode-latency pass, for the trained checkpoints of a result ``doc`` (read from ``source``):
    every model is rebuilt from ``checkpoint_dir/<mixer>.safetensors`` (refused unless it has the result's
    configuration and the steps the result records), timed, and the latency and table of a copy of ``doc``
    replaced. The evaluations are carried over unchanged."""
    torch.set_num_threads(threads)
    c = doc["config"]
    cfg = TrainConfig(**{k: (tuple(c[k]) if k == "train_pairs" else c[k]) for k in config_dict(TrainConfig())})
    models = {}
    for rec in doc["models"]:
        path = Path(checkpoint_dir) / f"{rec['mixer']}.safetensors"
        if not path.is_file():
            raise ValueError(f"checkpoint-dir: no checkpoint {path} for mixer {rec['mixer']}")
        model = build_model(rec["mixer"], cfg)
        step = load_weights(path, model, rec["mixer"], cfg)
        if step != rec["steps_done"]:
            raise ValueError(f"checkpoint-dir: {path} is at step {step}, the result records {rec['steps_done']}")
        models[rec["mixer"]] = model.eval()
    hs = tuple(histories or c["histories"] or FULL["histories"])
    reps = repeats or c.get("latency_repeats") or FULL["latency_repeats"]
    before = os.getloadavg()
    latency = decode_latency(models, hs, repeats=reps, progress=progress)
    out = {**doc, "config": {**c, "histories": list(hs), "latency_repeats": reps}, "latency": latency,
           "table": summary_table(doc["models"], latency, doc["table"][0]["num_pairs"] if doc["table"]
                                  else max(cfg.train_pairs)),
           "latency_pass": {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "source": source,
                            "loadavg_before": list(before), "loadavg_after": list(os.getloadavg())}}
    out["environment"] = {**doc["environment"], "torch_threads": torch.get_num_threads()}
    return out


def run(mixers: tuple[str, ...], cfg: TrainConfig, *, eval_pairs: tuple[int, ...], eval_examples: int,
        histories: tuple[int, ...], latency_repeats: int, budget_s: float | None, checkpoint_dir: Path | None,
        resume: bool, threads: int, with_controls: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train, evaluate and time every mixer; returns the result document (schema ``mqar``)."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    load_before = os.getloadavg()
    models, records = {}, []
    for mixer in mixers:
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"{mixer}.safetensors"
        model, info = train(mixer, cfg, checkpoint=ckpt, resume=resume, budget_s=budget_s, progress=progress)
        rows = evaluate(model, cfg, pairs=eval_pairs, examples=eval_examples)
        log = info.pop("log")
        stride = max(1, len(log) // 100)
        rec = {"mixer": mixer, "layers": list(model.mixers), "params": sum(p.numel() for p in model.parameters()),
               "state_floats": state_floats(model), **info, "final_loss": log[-1][1] if log else None,
               "loss_curve": log[::stride], "eval": rows,
               "controls": controls(model, cfg, n=control_pairs(cfg), examples=eval_examples)
               if with_controls else None}
        records.append(rec)
        models[mixer] = model
        if progress:
            acc = ", ".join(f"{r['num_pairs']}:{100 * r['accuracy']:.0f}%" for r in rows if r["distance"] == "all")
            tqdm.write(f"{mixer}: {info['steps_done']} steps ({info['stop_reason']}), accuracy by pairs {acc}")
    load_mid = os.getloadavg()
    latency = decode_latency(models, histories, repeats=latency_repeats, progress=progress) if histories else []
    table = summary_table(records, latency, max(cfg.train_pairs))
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {**config_dict(cfg), "mixers": list(mixers), "eval_pairs": list(eval_pairs),
                   "eval_examples": eval_examples, "histories": list(histories),
                   "latency_repeats": latency_repeats, "budget_s": budget_s, "resume": resume,
                   "short_distance": f"<= {cfg.seq_len // 4}", "long_distance": f"> {cfg.seq_len // 2}",
                   "chance": "1/num_pairs if the model only knows that the answer is one of the stored values"},
        "environment": {"cpu": _cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "torch": torch.__version__, "linattn": linattn.__version__,
                        "python": platform.python_version(), "loadavg_before": list(load_before),
                        "loadavg_before_latency": list(load_mid), "loadavg_after": list(os.getloadavg())},
        "models": records,
        "latency": latency,
        "table": table,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100), overwrite=overwrite)
    finally:
        plt.close(fig)


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


def _summarize_command(paths: tuple[str, ...], output: str | None, plot_path: str | None, overwrite: bool) -> None:
    from linattn.tools.mqar import seeds as mqar_seeds

    try:
        doc = mqar_seeds.summarize([read_result(p, "mqar") for p in paths], [str(p) for p in paths])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(mqar_seeds.format_summary(doc))
    if output:
        click.echo(f"wrote {write_result(doc, output, 'mqar_seeds', overwrite=overwrite)}")
    if plot_path:
        click.echo(f"wrote {mqar_seeds.plot_summary(doc, plot_path, overwrite=overwrite)}")


_SWEEP_OPTIONS = {"sweep", "sweep_report", "mixers", "quick", "workers", "output", "plot_path", "overwrite",
                  "no_progress"}


def _sweep_command(ctx, report, mixers, quick, workers, output, plot_path, overwrite, no_progress) -> None:
    """``--sweep`` (train, resuming from ``output``) or ``--sweep-report`` (read a result, print, plot)."""
    from click.core import ParameterSource

    from linattn.tools.mqar import sweep, sweep_report, sweep_runner

    given = sorted(p.opts[0] for p in ctx.command.params if p.name not in _SWEEP_OPTIONS
                   and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None))
    if given:
        raise click.UsageError(f"{', '.join(given)}: not used by --sweep/--sweep-report")
    if report and ctx.get_parameter_source("sweep") != ParameterSource.DEFAULT:
        raise click.UsageError("--sweep and --sweep-report are separate passes; give one")
    if plot_path:
        try:
            refuse_existing(plot_path, overwrite=overwrite)
        except FileExistsError as exc:
            raise click.UsageError(str(exc)) from None
    if report:
        try:
            doc = read_result(report, "mqar_sweep")
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    else:
        if not output and not quick:
            raise click.UsageError("--sweep needs --output: it runs for hours and resumes from that file "
                                   "(--quick runs without one)")
        if output:
            check_label(Path(output).stem, "--output file name")
        base = sweep.QUICK if quick else sweep.FULL
        try:
            cfg = sweep.SweepConfig.from_json({**base.as_json(), "mixers": list(mixers)})
            doc = sweep_runner.run_sweep(cfg, output=output, workers=workers or os.cpu_count() or 1,
                                         overwrite=overwrite, progress=not no_progress)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if output:
            click.echo(f"wrote {Path(output).absolute()}")
    click.echo(sweep_report.format_best(doc))
    if plot_path:
        click.echo(f"wrote {sweep_report.plot(doc, plot_path, overwrite=overwrite)}")


def _ints(ctx, param, value):
    if value is None:
        return None
    try:
        out = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return out


def _mixers(ctx, param, value):
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [n for n in names if n not in MIXER_SPECS]
    if bad or not names:
        raise click.BadParameter(f"unknown mixer(s) {bad}; expected some of {list(MIXER_SPECS)}")
    return names


@click.command(name="mqar")
@click.option("--mixers", default=",".join(MIXER_SPECS), show_default=True, callback=_mixers)
@click.option("--quick", is_flag=True,
              help="Tiny setting (T=32, 120 steps, histories 512/2048): minutes. With --sweep: a smoke run of "
                   "the sweep (42 runs of at most 40 steps).")
@click.option("--vocab-size", type=click.IntRange(min=5), default=None, help="Default 48 (quick: 32).")
@click.option("--seq-len", type=click.IntRange(min=8), default=None, help="Default 48 (quick: 32).")
@click.option("--train-pairs", default=None, callback=_ints, help="Pairs per training batch, drawn per step.")
@click.option("--eval-pairs", default=None, callback=_ints, help="Pairs evaluated.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Training steps per model.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None)
@click.option("--hidden-size", type=click.IntRange(min=8), default=64, show_default=True)
@click.option("--num-layers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--num-heads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--head-dim", type=click.IntRange(min=2), default=16, show_default=True,
              help="q/k/v width per head: the state of a linear layer is num_heads x head_dim x head_dim.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True)
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock training budget per model (stops early; --resume continues).")
@click.option("--eval-examples", type=click.IntRange(min=1), default=None)
@click.option("--histories", default=None, callback=_ints, help="Decode histories, default 2048,8192,32768.")
@click.option("--no-controls", is_flag=True,
              help="Skip the controls (moved evidence, overwritten and near-duplicate keys, precision).")
@click.option("--no-latency", is_flag=True,
              help="Skip the decode-latency pass (measure it later, in a quiet window, with --latency-from).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="torch threads.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--checkpoint-dir", type=click.Path(file_okay=False), default=None,
              help="Save <mixer>.safetensors here (every 100 steps and at the end).")
@click.option("--resume", is_flag=True, help="Continue from the checkpoints in --checkpoint-dir.")
@click.option("--latency-from", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Train nothing: rebuild the models of this result from --checkpoint-dir, run only the latency "
                   "pass, write the result with new latency to --output.")
@click.option("--summarize", type=click.Path(dir_okay=False, exists=True), multiple=True,
              help="Train nothing: summarize these results of one setting over seeds (repeat the option).")
@click.option("--sweep", is_flag=True,
              help="Learning-rate sweep as zoology measures MQAR: every mixer x width 64/128 x (T, pairs) in "
                   "(64,4), (64,8), (256,16), (256,32) x 4 learning rates, early stopping, 3 seeds at the best lr. "
                   "Resumes from --output when run again with the same options.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="--sweep: worker processes, one torch thread each [default: all cores].")
@click.option("--sweep-report", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Train nothing: print the table of this (possibly partial) sweep result; with --plot, plot it.")
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Write the JSON result here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Write the PNG plot here.")
@click.option("--overwrite", is_flag=True, help="Replace existing --output/--plot files.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bars.")
def command(mixers, quick, vocab_size, seq_len, train_pairs, eval_pairs, steps, batch_size, hidden_size, num_layers,
            num_heads, head_dim, lr, budget_s, eval_examples, histories, no_controls, no_latency, threads, seed,
            checkpoint_dir, resume, output, plot_path, overwrite, no_progress, latency_from, summarize, sweep,
            workers, sweep_report) -> None:
    """Multi-query associative recall trained per mixer, with decode latency at 2K/8K/32K; or (--sweep) the
    best accuracy over a learning-rate sweep per mixer, width and setting."""
    if sweep or sweep_report:
        _sweep_command(click.get_current_context(), sweep_report, mixers, quick, workers, output, plot_path,
                       overwrite, no_progress)
        return
    if workers is not None:
        raise click.BadParameter("only used with --sweep", param_hint="--workers")
    if resume and not checkpoint_dir:
        raise click.BadParameter("--resume needs --checkpoint-dir", param_hint="--resume")
    if latency_from and not checkpoint_dir:
        raise click.BadParameter("--latency-from needs --checkpoint-dir", param_hint="--latency-from")
    if latency_from and summarize:
        raise click.UsageError("--latency-from and --summarize are separate passes; give one")
    for path in (output, plot_path):
        if path:
            check_label(Path(path).stem, "--output/--plot file name")
            try:
                refuse_existing(path, overwrite=overwrite)
            except FileExistsError as exc:
                raise click.UsageError(str(exc)) from None
    if summarize:
        _summarize_command(summarize, output, plot_path, overwrite)
        return
    if latency_from:
        try:
            doc = latency_only(read_result(latency_from, "mqar"), str(latency_from), Path(checkpoint_dir),
                               histories=histories, repeats=None, threads=threads, progress=not no_progress)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        click.echo(format_table(doc))
        if output:
            click.echo(f"wrote {write_result(doc, output, 'mqar', overwrite=overwrite)}")
        if plot_path:
            click.echo(f"wrote {plot(doc, plot_path, overwrite=overwrite)}")
        return
    base = QUICK if quick else FULL
    cfg = TrainConfig(vocab_size=vocab_size or base["vocab_size"], seq_len=seq_len or base["seq_len"],
                      train_pairs=train_pairs or base["train_pairs"], steps=steps or base["steps"],
                      batch_size=batch_size or base["batch_size"], hidden_size=hidden_size, num_layers=num_layers,
                      num_heads=num_heads, head_dim=head_dim,
                      lr=lr, seed=seed)
    try:
        doc = run(mixers, cfg, eval_pairs=eval_pairs or base["eval_pairs"],
                  eval_examples=eval_examples or base["eval_examples"],
                  histories=() if no_latency else histories or base["histories"],
                  latency_repeats=base["latency_repeats"], budget_s=budget_s, checkpoint_dir=checkpoint_dir,
                  resume=resume, threads=threads, with_controls=not no_controls, progress=not no_progress)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    doc["config"]["quick"] = quick
    click.echo(format_table(doc))
    if output:
        click.echo(f"wrote {write_result(doc, output, 'mqar', overwrite=overwrite)}")
    if plot_path:
        click.echo(f"wrote {plot(doc, plot_path, overwrite=overwrite)}")
    click.echo(f"({doc['elapsed_s']:.1f} s)")
