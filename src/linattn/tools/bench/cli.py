"""``linattn bench``: one decode step at history length L, explicit KV history vs a fixed recurrent state.

This module is the command line and the run itself; the parts live next to it:

* `linattn.tools.bench.plan`: the run's parameters (`Plan`), byte counts, dry-run checks, hardware;
* `linattn.tools.bench.workload`: token stream, the two decode paths, timing, memory, float64 check;
* `linattn.tools.bench.report`: result document, decision, table and plot.

Unlike the other tools, ``linattn bench`` always writes its result file (a run is evidence); ``-o`` picks the name.

``linattn bench`` measures and writes a result file; ``linattn bench show FILE...`` prints saved results side
by side and can plot them. docs/bench.md explains what is measured and how.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import torch

import linattn
from linattn.tools.bench import plan as bp
from linattn.tools.bench import report as bench_report
from linattn.tools.bench import workload as bench_workload
from linattn.tools.bench.plan import BASELINE, CANDIDATE_PATHS, DTYPES, Plan
from linattn.tools.bench.report import SCHEMA, format_table, plot_results
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness import machine, results
from linattn.tools.harness.machine import BusyMeter

# The tools' one rule for the default thread count (re-exported: bench was its first user).
SMALL_MACHINE_CORES = cli_files.SMALL_MACHINE_CORES
default_threads = cli_files.default_threads


def run(plan: Plan, identity: dict[str, Any], *, progress: bool = True, threads_source: str = "torch's own choice",
        others_before: float | None = None, loadavg_before: list[float] | None = None) -> dict[str, Any]:
    """Measure every path at every length with a progress bar on stderr (unless ``progress`` is off); a failure
    mid-run is recorded with the rows measured so far (never invented ones). Other processes' CPU use is measured
    over the whole run and judged with the rows (`bench_report.assess_contention`)."""
    from tqdm import tqdm

    steps_per = plan.warmup + plan.repeats * (2 if plan.device == "cuda" else 1)
    total = len(plan.sequence_lengths) * (1 + len(plan.rules)) * steps_per
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    failure, transient_ok = None, True
    meter = BusyMeter().start()
    with tqdm(total=total, desc="bench", unit="step", file=sys.stderr, mininterval=0.5, leave=False,
              disable=not progress) as bar:
        try:
            tokens = bench_workload.make_tokens(plan)
            transient_ok = bench_workload.measure(
                plan, tokens, rows, checks, tick=lambda: bar.update(1), describe=bar.set_description_str
            )
        except (RuntimeError, MemoryError) as exc:  # e.g. CUDA out of memory: record it, keep what was measured
            failure = {"stage": "measure", "message": f"{type(exc).__name__}: {exc}".strip()[:2000]}
    hardware = bp.hardware_info(plan.device)
    contention = bench_report.assess_contention(
        rows,
        cores=hardware["cpu_count"],
        threads=hardware["threads"],
        threads_source=threads_source,
        others_before=others_before,
        others_during=meter.stop(),
        loadavg_before=loadavg_before,
    )
    return bench_report.build_document(
        plan,
        identity=identity,
        hardware=hardware,
        rows=rows,
        reference_checks=checks,
        failure=failure,
        transient_measured=transient_ok,
        contention=contention,
    )


# ---------------------------------------------------------------------------------------------------- CLI
def _callback(convert: Callable[[str, str], Any]):
    """A click callback that turns ``convert(value, name)``'s ValueError into a BadParameter naming the option."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        try:
            return convert(value, param.name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


_lengths_option = _callback(lambda value, _: bp.parse_lengths(value))
_label_option = _callback(results.check_label)


def _plan_text(plan: Plan, output: Path) -> str:
    B, H, D = plan.batch, plan.query_heads, plan.head_dim
    lines = [
        f"plan: {plan.device}, {plan.dtype} tokens, {plan.state_dtype} state, B={B} H={H} D={D}, "
        f"L={','.join(map(str, plan.sequence_lengths))}, warmup {plan.warmup}, repeats {plan.repeats}, "
        f"seed {plan.seed}",
        f"  {BASELINE}: K+V bytes "
        + ", ".join(f"L={L}: {bp.kv_history_bytes(B, H, L, D, plan.dtype):,}" for L in plan.sequence_lengths),
    ]
    for rule in plan.rules:
        total = bp.recurrent_state_bytes(B, H, D, D, plan.state_dtype, bp.normalizes(rule))
        matrix = bp.state_matrix_bytes(B, H, D, D, plan.state_dtype)
        lines.append(
            f"  {CANDIDATE_PATHS[rule]}: state bytes {total:,} at every L (S {matrix:,}); "
            f"reference check at L={plan.reference_check_length}"
        )
    lines.append(f"  output: {output}")
    return "\n".join(lines)


def _plan_from_options(opts: dict[str, Any], device: str) -> Plan:
    try:
        return Plan(
            sequence_lengths=opts["sequence_lengths"],
            query_heads=opts["query_heads"],
            head_dim=opts["head_dim"],
            batch=opts["batch"],
            dtype=bp.resolve_dtype(opts["dtype"], device),
            state_dtype=opts["state_dtype"],
            warmup=opts["warmup"],
            repeats=opts["repeats"],
            seed=opts["seed"],
            device=device,
            rules=tuple(r.strip() for r in opts["rules"].split(",") if r.strip()),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@click.group(invoke_without_command=True, context_settings=cli_files.CONTEXT)
@click.option(
    "--sequence-lengths",
    default="512,2048,8192",
    callback=_lengths_option,
    help="History lengths L, comma-separated (each >= 2).",
)
@click.option("--query-heads", default=8, type=click.IntRange(min=1), help="Attention heads H.")
@click.option("--head-dim", default=64, type=click.IntRange(min=1), help="Head dimension D (keys and values).")
@click.option("--batch", default=1, type=click.IntRange(min=1), help="Batch size B.")
@click.option(
    "--dtype",
    default="auto",
    type=click.Choice(["auto", *DTYPES]),
    help="Token dtype (KV cache, q/k/v); auto = bfloat16 on CUDA, float32 on the CPU.",
)
@click.option(
    "--state-dtype",
    default="float32",
    type=click.Choice(list(DTYPES)),
    help="Recurrent state dtype (bfloat16 reproduces the original experiment).",
)
@click.option(
    "--rules",
    default="accumulate",
    help="Candidate update rules, comma-separated: accumulate, gated, delta, gated_delta.",
)
@click.option("--warmup", default=10, type=click.IntRange(min=0), help="Untimed steps per path and L.")
@click.option("--repeats", default=100, type=click.IntRange(min=1), help="Timed steps per path and L.")
@click.option("--seed", default=0, type=int, help="Seed of the shared token stream.")
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), help="auto = cuda if present.")
@click.option(
    "--threads",
    default=None,
    type=click.IntRange(min=1),
    help=f"torch.set_num_threads for the run (recorded in hardware.threads); default: {cli_files.THREADS_RULE} "
    "(steady timings on small machines, docs/bench.md).",
)
@click.option(
    "--run-label",
    default=None,
    callback=_label_option,
    help="Names the result file; default <device>-<UTC time>, e.g. cpu-20250101T120000Z.",
)
@cli_files.output_option(
    help="Result file (bench always writes one).", show_default="benchmarks/results/<workload-id>_<run-label>.json "
    "under the current folder",
)
@click.option("--semantic-id", default="ARCH-RECURRENT-STATE-MECHANISM", callback=_label_option)
@click.option("--workload-id", default="arch-linear-recurrence-v2", callback=_label_option)
@click.option("--profile-id", default=None, callback=_label_option, help="Default <device>-<dtype>.")
@cli_files.overwrite_option()
@cli_files.quick_option(help="History lengths 64 and 256, 20 timed steps: checks the tool in seconds; its numbers "
                        "mean nothing (the result file says so in its plan).")
@cli_files.no_progress_option()
@click.option("--dry-run", is_flag=True, help="Check the device, dtypes and memory and print the plan; write nothing.")
@cli_files.plot_option(help="Also draw the result to this PNG.")
@click.pass_context
def command(ctx: click.Context, **opts: Any) -> None:
    """Decode step: explicit KV history vs fixed recurrent state, measured, recorded, plotted.

    Runs the benchmark by default; `linattn bench show FILE...` reads result files.
    """
    if ctx.invoked_subcommand is not None:
        return
    opts |= cli_files.quick_values(ctx, opts["quick"], {"sequence_lengths": (64, 256), "warmup": 2, "repeats": 20})
    cuda_available = torch.cuda.is_available()
    device = bp.resolve_device(opts["device"], cuda_available)
    plan = _plan_from_options(opts, device)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    run_label = opts["run_label"] or f"{device}-{now:%Y%m%dT%H%M%SZ}"
    output = opts["output"] or results.default_result_path("benchmarks/results", opts["workload_id"], run_label)
    # before measuring: a run of minutes should not end in a refusal
    cli_files.check_outputs(opts["overwrite"], {"--output": output, "--plot": opts["plot"]})

    threads, threads_source = opts["threads"], "--threads"
    if threads is None:
        threads, threads_source = default_threads(device, os.cpu_count())
    if threads is not None:
        before = torch.get_num_threads()
        ctx.call_on_close(lambda: torch.set_num_threads(before))  # callers in-process keep their setting
        torch.set_num_threads(threads)
    checks, failure = bp.preflight(plan, cuda_available=cuda_available)
    echo = click.echo if opts["dry_run"] else (lambda s: click.echo(s, err=True))
    echo(_plan_text(plan, output))
    echo(f"  threads: {torch.get_num_threads()} ({threads_source})")
    for c in checks:
        echo(f"  check {c['check']}: {'ok' if c['ok'] else 'FAILED'} ({c['detail']})")
    if failure is not None:
        click.echo(f"failure ({failure['stage']}): {failure['message']}; nothing measured, no file written", err=True)
        ctx.exit(1)
    if opts["dry_run"]:
        click.echo("dry run: environment ok; nothing measured, no file written")
        return

    identity = {
        "semantic_id": opts["semantic_id"],
        "workload_id": opts["workload_id"],
        "run_label": run_label,
        "profile_id": opts["profile_id"] or f"{device}-{plan.dtype}",
        "created_utc": f"{now:%Y-%m-%dT%H:%M:%SZ}",
        "linattn_version": linattn.__version__,
    }
    others_before = machine.others_busy_now()
    early = machine.busy_reason(others_before, os.cpu_count(), torch.get_num_threads())
    if early:
        click.echo(f"warning: the machine is busy ({early}); timings may not be representative", err=True)
    doc = run(
        plan,
        identity,
        progress=not opts["no_progress"],
        threads_source=threads_source,
        others_before=others_before,
        loadavg_before=machine.load_info()["loadavg"],
    )
    click.echo(format_table([doc]))
    cli_files.write(
        "--output", lambda p, overwrite: results.write_result(doc, p, SCHEMA, overwrite=overwrite), output,
        overwrite=opts["overwrite"],
    )
    if opts["plot"] is not None:
        cli_files.write("--plot", lambda p, overwrite: plot_results([doc], p, overwrite=overwrite), opts["plot"],
                        overwrite=opts["overwrite"])
    if doc["evidence_level"] == "disturbed":
        click.echo("warning: timings disturbed (see contention in the result file); rerun on a quiet machine before "
                   "trusting the step times or the time crossover", err=True)
    if doc["failure"] is not None:
        ctx.exit(1)


@command.command("show", context_settings=cli_files.CONTEXT)
@click.argument("files", nargs=-1, required=True, type=cli_files.FILE)
@cli_files.plot_option(help="Draw state bytes and step time against L (log-log) to this PNG.")
@cli_files.overwrite_option()
def show(files: tuple[Path, ...], plot: Path | None, overwrite: bool) -> None:
    """Print saved result files side by side; optionally plot them."""
    cli_files.check_outputs(overwrite, {"--plot": plot})
    docs = []
    for f in files:
        try:
            docs.append(results.read_result(f, SCHEMA))
        except (OSError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="FILES") from None
    click.echo(format_table(docs))
    if plot is not None:
        cli_files.write("--plot", lambda p, overwrite: plot_results(docs, p, overwrite=overwrite), plot,
                        overwrite=overwrite)
