"""``linattn perf``: the command line of the kernel benchmark (CPU by default, ``--device cuda`` on a GPU)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from linattn.tools.harness import cli as hcli
from linattn.tools.harness.results import atomic_write, write_result
from linattn.tools.perf import work


def _write_text(path: Path, text: str, overwrite: bool) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite)


def _threads(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        counts = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise click.BadParameter(f"expected distinct thread counts >= 1, comma-separated, got {value!r}")
    return counts


@click.command(name="perf", context_settings=hcli.CONTEXT)
@hcli.output_option()
@click.option("--markdown", "markdown", type=hcli.FILE, default=None,
              help="Write the Markdown tables here (they are printed to stdout either way).")
@hcli.quick_option()
@click.option("--only", "only", multiple=True,
              help="Run only cases matching these patterns (fnmatch on names like 'fwd/delta/linattn/B1_T8192'; "
                   "no wildcard = substring). Repeatable or comma-separated.")
@click.option("--threads", "threads", default=None, callback=_threads,
              show_default=f"{','.join(map(str, work.FULL.threads))}; with --quick one count, {hcli.THREADS_RULE}",
              help="Thread counts, comma-separated: one pass over every case at each, with the matmul rate and "
                   "copy bandwidth measured again; two counts add the thread-scaling table (CPU only).")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timed samples per case.",
              show_default=f"{work.FULL.repeats}; {work.QUICK.repeats} with --quick; 10 on cuda")
@click.option("--max-call-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Skip a case projected (from a shorter T) to take longer than this per call.",
              show_default=f"{work.FULL.max_call_s:g}; {work.QUICK.max_call_s:g} with --quick; 2 on cuda")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Cases not started within this many seconds (of each thread count's pass) are skipped.",
              show_default=f"{work.FULL.budget_s:g} on cpu; {work.QUICK.budget_s:g} with --quick; 200 on cuda")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory pass (one profiled call per case).")
@click.option("--list", "list_only", is_flag=True, help="Print the case names and exit (with --device cuda: a dry "
              "run that needs no GPU, with each case's FLOPs and the time budget).")
@hcli.overwrite_option()
@hcli.no_progress_option()
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu",
              help="cuda: linattn's Triton chunk kernels against flash-linear-attention's Triton kernels and SDPA "
                   "on the GPU.")
def command(output, markdown, quick, only, threads, repeats, max_call_s, budget_s, no_memory, list_only, overwrite,
            no_progress, device) -> None:
    """Kernel benchmark: linattn vs its peers and softmax, as fractions of the machine's own matmul rate and copy
    bandwidth measured in the same run, at 1 and 2 threads. CPU by default (flash-linear-attention / HF
    pure-torch peers); --device cuda times the Triton kernels on a GPU. Writes files only with -o/--markdown."""
    patterns = tuple(p.strip() for arg in only for p in arg.split(",") if p.strip())
    if device == "cuda":
        _cuda_command(output, markdown, quick, patterns, repeats, max_call_s, list_only, overwrite, budget_s)
        return
    from linattn.tools.perf import cpu
    from linattn.tools.perf.report import render_markdown, render_quick

    cfg = work.QUICK if quick else work.FULL
    if threads is None:
        threads = (hcli.default_threads()[0] or _torch_threads(),) if quick else work.FULL.threads
    changes = {k: v for k, v in (("budget_s", budget_s), ("repeats", repeats), ("max_call_s", max_call_s))
               if v is not None}
    cfg = replace(cfg, memory=not no_memory, threads=threads, **changes)
    try:
        cases = work.select(cpu.build_cases(cfg), patterns)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("only: "), param_hint="--only") from None
    if list_only:
        click.echo("\n".join(c.name for c in cases))
        return
    hcli.check_outputs(overwrite, {"--output": output, "--markdown": markdown})
    warning = cpu.peer_warning(cases)  # at the start, not after minutes of measuring: the one line about peers
    if warning:
        click.echo(warning, err=True)
    doc = cpu.run(cfg, only=patterns, progress=not no_progress)
    text = render_markdown(doc)
    click.echo(render_quick(doc) if quick else text)
    if output:
        hcli.write("--output", lambda p, overwrite: write_result(doc, p, "perf", overwrite=overwrite), output,
                   overwrite=overwrite)
    if markdown:
        hcli.write("--markdown", lambda p, overwrite: _write_text(p, text, overwrite), markdown, overwrite=overwrite)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _cuda_command(output, markdown, quick, patterns, repeats, max_call_s, list_only, overwrite, budget_s) -> None:
    """``--device cuda``: plan (``--list`` needs no GPU), refuse clearly without one, measure, write."""
    from linattn.tools.perf import cuda as pc
    from linattn.tools.perf.cuda_report import render_markdown

    cfg = pc.QUICK if quick else pc.FULL
    changes = {k: v for k, v in (("repeats", repeats), ("max_call_s", max_call_s), ("budget_s", budget_s))
               if v is not None}
    cfg = replace(cfg, **changes)
    try:
        cases = work.select(pc.plan(cfg), patterns)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("only: "), param_hint="--only") from None
    if list_only:
        for c in cases:
            click.echo(f"{c.name}  {c.flops / 1e9:.1f} GFLOP")
        est = pc.estimate(cases, cfg)
        click.echo(f"{len(cases)} cases; timed calls take about {est['timed_calls_s']:.1f} s at an assumed "
                   f"{est['assumed_tflops']:g} TFLOP/s, plus compilation and fla's autotuning; no case starts "
                   f"after {cfg.budget_s:g} s")
        return
    try:
        pc.require_cuda()
    except pc.NoCudaDevice as exc:
        raise click.ClickException(str(exc)) from None
    hcli.check_outputs(overwrite, {"--output": output, "--markdown": markdown})
    doc = pc.run(cfg, only=patterns, progress=lambda name: click.echo(f"  {name}", err=True))
    text = render_markdown(doc)
    click.echo(text)
    if output:
        hcli.write("--output", lambda p, overwrite: write_result(doc, p, "perf_cuda", overwrite=overwrite),
                   output, overwrite=overwrite)
    if markdown:
        hcli.write("--markdown", lambda p, overwrite: _write_text(p, text, overwrite), markdown, overwrite=overwrite)
