"""``linattn mqar``: the command line of the MQAR tool, on the tools' shared convention
(`linattn.tools.harness.cli`). One run (`experiment`), a latency pass for the
checkpoints of an earlier result, a summary over seeds (`seeds`), or the learning-rate
sweep (`sweep_runner`), which resumes from its ``--output``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from linattn.tools.harness import cli as hcli
from linattn.tools.harness.results import read_result, write_result
from linattn.tools.mqar import experiment, report
from linattn.tools.mqar.train import MIXER_SPECS, Diverged, TrainConfig

# What --quick changes where the option was left at its default.
QUICK = {k: experiment.QUICK[k] for k in ("vocab_size", "seq_len", "train_pairs", "steps", "batch_size",
                                         "eval_pairs", "eval_examples", "histories")}
# The options --sweep and --sweep-report read; any other one given with them is refused.
SWEEP_OPTIONS = {"sweep", "sweep_report", "mixers", "quick", "workers", "output", "plot_path", "overwrite",
                 "no_progress"}


def _json_writer(schema: str):
    """A writer for `hcli.write`: the document validated against ``schema``, written atomically."""
    return lambda path, doc, overwrite: write_result(doc, path, schema, overwrite=overwrite)


def _write(doc: dict, schema: str, plot, output: Path | None, plot_path: Path | None, overwrite: bool) -> None:
    """The result file and its plot, each only where asked (``plot(doc, path, overwrite=...)`` draws it)."""
    if output:
        hcli.write("--output", _json_writer(schema), output, doc, overwrite=overwrite)
    if plot_path:
        hcli.write("--plot", lambda p, overwrite: plot(doc, p, overwrite=overwrite), plot_path, overwrite=overwrite)


def _summarize(paths: tuple[str, ...], output: Path | None, plot_path: Path | None, overwrite: bool) -> None:
    from linattn.tools.mqar import seeds as mqar_seeds

    try:
        doc = mqar_seeds.summarize([read_result(p, "mqar") for p in paths], [str(p) for p in paths])
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(mqar_seeds.format_summary(doc))
    _write(doc, "mqar_seeds", mqar_seeds.plot_summary, output, plot_path, overwrite)


def _sweep(ctx: click.Context, report_path: str | None, mixers: tuple[str, ...], quick: bool, workers: int | None,
           output: Path | None, plot_path: Path | None, overwrite: bool, no_progress: bool) -> None:
    """``--sweep`` (train, resuming from ``output``) or ``--sweep-report`` (read a result, print, plot)."""
    from linattn.tools.mqar import sweep, sweep_report, sweep_runner

    given = sorted(p.opts[-1] for p in ctx.command.params if p.name not in SWEEP_OPTIONS
                   and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None))
    if given:
        raise click.UsageError(f"{', '.join(given)}: not used by --sweep/--sweep-report")
    if report_path and ctx.get_parameter_source("sweep") != ParameterSource.DEFAULT:
        raise click.UsageError("--sweep and --sweep-report are separate passes; give one")
    hcli.check_outputs(overwrite, {"--plot": plot_path})
    if report_path:
        try:
            doc = read_result(report_path, "mqar_sweep")
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    else:
        if not output and not quick:
            raise click.UsageError("--sweep needs --output: it runs for hours and resumes from that file "
                                   "(--quick runs without one)")
        # an existing --output is resumed, not overwritten: the runner judges its content
        hcli.check_outputs(True, {"--output": output, "--plot": plot_path})
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
        hcli.write("--plot", lambda p, overwrite: sweep_report.plot(doc, p, overwrite=overwrite), plot_path,
                   overwrite=overwrite)


def _ints(ctx, param, value):
    if value is None or isinstance(value, tuple):
        return value
    try:
        out = tuple(int(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return out


MAX_LR = 10.0  # AdamW steps every weight by about lr: far beyond this a run can only diverge


def _lr(ctx, param, value):
    if not (0 < value <= MAX_LR):  # NaN fails this too
        raise click.BadParameter(f"must be a learning rate in (0, {MAX_LR:g}], got {value!r}")
    return value


def _mixers(ctx, param, value):
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [n for n in names if n not in MIXER_SPECS]
    if bad or not names:
        raise click.BadParameter(f"unknown mixer(s) {', '.join(bad) or '(none given)'}; expected some of "
                                 f"{', '.join(MIXER_SPECS)}")
    return names


FULL = experiment.FULL


@click.command(name="mqar", context_settings=hcli.CONTEXT)
@click.option("--mixers", default=",".join(MIXER_SPECS), callback=_mixers)
@hcli.quick_option(help="Tiny setting (T=32, 120 steps, histories 512/2048): minutes. With --sweep: a smoke run "
                        "of the sweep (42 runs of at most 40 steps).")
@click.option("--vocab-size", type=click.IntRange(min=5), default=FULL["vocab_size"], help="Quick: 32.")
@click.option("--seq-len", type=click.IntRange(min=8), default=FULL["seq_len"], help="Quick: 32.")
@click.option("--train-pairs", default=",".join(map(str, FULL["train_pairs"])), callback=_ints,
              help="Pairs per training batch, drawn per step (quick: 2,4).")
@click.option("--eval-pairs", default=",".join(map(str, FULL["eval_pairs"])), callback=_ints,
              help="Pairs evaluated (quick: 2,4,8).")
@click.option("--steps", type=click.IntRange(min=1), default=FULL["steps"],
              help="Training steps per model (quick: 120).")
@click.option("--batch-size", type=click.IntRange(min=1), default=FULL["batch_size"])
@click.option("--hidden-size", type=click.IntRange(min=8), default=64)
@click.option("--num-layers", type=click.IntRange(min=1), default=2)
@click.option("--num-heads", type=click.IntRange(min=1), default=2)
@click.option("--head-dim", type=click.IntRange(min=2), default=16,
              help="q/k/v width per head: the state of a linear layer is num_heads x head_dim x head_dim.")
@click.option("--lr", type=float, default=3e-3, callback=_lr, help=f"Peak learning rate, in (0, {MAX_LR:g}].")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Wall-clock training budget per model (stops early; --resume continues).")
@click.option("--eval-examples", type=click.IntRange(min=1), default=FULL["eval_examples"], help="Quick: 64.")
@click.option("--histories", default=",".join(map(str, FULL["histories"])), callback=_ints,
              help="Decode histories (quick: 512,2048; with --latency-from: the result's own unless given).")
@click.option("--no-controls", is_flag=True,
              help="Skip the controls (moved evidence, overwritten and near-duplicate keys, precision).")
@click.option("--no-latency", is_flag=True,
              help="Skip the decode-latency pass (measure it later, in a quiet window, with --latency-from).")
@hcli.threads_option(help=f"torch threads for training and the latency pass; default: {hcli.THREADS_RULE}.")
@click.option("--seed", type=click.IntRange(min=0), default=0)
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
                   "Resumes from --output when run again with the same options (that is not an overwrite).")
@click.option("--workers", type=click.IntRange(min=1), default=None, show_default="all cores",
              help="--sweep: worker processes, one torch thread each.")
@click.option("--sweep-report", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Train nothing: print the table of this (possibly partial) sweep result; with --plot, plot it.")
@hcli.output_option()
@hcli.plot_option(help="Write the PNG plot here.", dest="plot_path")
@hcli.overwrite_option()
@hcli.no_progress_option()
@click.pass_context
def command(ctx: click.Context, mixers, quick, vocab_size, seq_len, train_pairs, eval_pairs, steps, batch_size,
            hidden_size, num_layers, num_heads, head_dim, lr, budget_s, eval_examples, histories, no_controls,
            no_latency, threads, seed, checkpoint_dir, resume, output, plot_path, overwrite, no_progress,
            latency_from, summarize, sweep, workers, sweep_report) -> None:
    """Multi-query associative recall trained per mixer, with decode latency at 2K/8K/32K; or (--sweep) the
    best accuracy over a learning-rate sweep per mixer, width and setting."""
    if sweep or sweep_report:
        _sweep(ctx, sweep_report, mixers, quick, workers, output, plot_path, overwrite, no_progress)
        return
    if workers is not None:
        raise click.BadParameter("only used with --sweep", param_hint="--workers")
    if resume and not checkpoint_dir:
        raise click.BadParameter("--resume needs --checkpoint-dir", param_hint="--resume")
    if latency_from and not checkpoint_dir:
        raise click.BadParameter("--latency-from needs --checkpoint-dir", param_hint="--latency-from")
    if latency_from and summarize:
        raise click.UsageError("--latency-from and --summarize are separate passes; give one")
    hcli.check_outputs(overwrite, {"--output": output, "--plot": plot_path})
    if summarize:
        _summarize(summarize, output, plot_path, overwrite)
        return
    threads = hcli.apply_threads(ctx, threads)
    if latency_from:
        given = histories if ctx.get_parameter_source("histories") != ParameterSource.DEFAULT else None
        try:
            doc = experiment.latency_only(read_result(latency_from, "mqar"), str(latency_from), Path(checkpoint_dir),
                                          histories=given, repeats=None, threads=threads, progress=not no_progress)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    else:
        o: dict[str, Any] = {"vocab_size": vocab_size, "seq_len": seq_len, "train_pairs": train_pairs,
                             "steps": steps, "batch_size": batch_size, "eval_pairs": eval_pairs,
                             "eval_examples": eval_examples, "histories": histories}
        o |= hcli.quick_values(ctx, quick, QUICK)
        cfg = TrainConfig(vocab_size=o["vocab_size"], seq_len=o["seq_len"], train_pairs=o["train_pairs"],
                          steps=o["steps"], batch_size=o["batch_size"], hidden_size=hidden_size, num_layers=num_layers,
                          num_heads=num_heads, head_dim=head_dim, lr=lr, seed=seed)
        try:
            doc = experiment.run(mixers, cfg, eval_pairs=o["eval_pairs"], eval_examples=o["eval_examples"],
                                 histories=() if no_latency else o["histories"],
                                 latency_repeats=(experiment.QUICK if quick else FULL)["latency_repeats"],
                                 budget_s=budget_s, checkpoint_dir=checkpoint_dir, resume=resume, threads=threads,
                                 with_controls=not no_controls, progress=not no_progress)
        except Diverged as exc:  # not a usage error: the run itself went non-finite
            raise click.ClickException(str(exc)) from None
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        doc["config"]["quick"] = quick
    click.echo(report.format_table(doc))
    _write(doc, "mqar", report.plot, output, plot_path, overwrite)
    if not latency_from:
        click.echo(f"({doc['elapsed_s']:.1f} s)")
