"""``linattn stability``: reads the options, runs the three measurements, prints the table, writes files if asked."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import click

import linattn
from linattn.api import RULES
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness.results import atomic_write_json, validate
from linattn.tools.stability.measure import (
    DEFAULT_CHUNKS,
    DEFAULT_DTYPES,
    DEFAULT_LENGTHS,
    DEFAULT_RULES,
    DEFAULT_SCALES,
    DTYPES,
    FEATURE_MAP,
    check_positive,
    epsilon_tradeoff,
    reference_summary,
    rescaling_check,
    stability_sweep,
)
from linattn.tools.stability.plots import plot
from linattn.tools.stability.report import RESULT_SCHEMA, summary


def _list(kind: type):
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple:
        try:
            items = tuple(kind(s) for s in value.split(",") if s.strip())
            check_positive(param.name, items, kind)
        except ValueError as exc:
            raise click.BadParameter(f"expected a comma-separated list of positive {kind.__name__}s: {exc}") from None
        return items

    return parse


@click.command(name="stability", context_settings=cli_files.CONTEXT)
@click.option("--rule", "rules", type=click.Choice(RULES), multiple=True, default=DEFAULT_RULES, show_default=True,
              help="Update rule (repeat for several).")
@click.option("--form", default="chunk", show_default=True, help="Form to test (see linattn.supported_forms).")
@click.option("--dtype", "dtypes", type=click.Choice(list(DTYPES)), multiple=True, default=DEFAULT_DTYPES,
              show_default=True, help="Candidate dtype of inputs and state (repeat for several).")
@click.option("--state-dtype", type=click.Choice(list(DTYPES)), default=None,
              help="Keep the state in this dtype instead of the candidate's (mixed precision).")
@click.option("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), show_default=True, callback=_list(int))
@click.option("--scales", default=",".join(map(str, DEFAULT_SCALES)), show_default=True, callback=_list(float),
              help="Input scales: q, k, v = scale * N(0, 1).")
@click.option("--chunk-sizes", default=",".join(map(str, DEFAULT_CHUNKS)), show_default=True, callback=_list(int))
@click.option("--heads", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--dim", type=click.IntRange(min=1), default=32, show_default=True, help="Head (key = value) width.")
@click.option("--full-grid", is_flag=True, help="Every scale with every chunk size (default: one factor at a time).")
@click.option("--rescale-dtype", type=click.Choice(list(DTYPES)), default="float16", show_default=True,
              help="Dtype of the state-rescaling check.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@cli_files.quick_option(help="Two lengths, one scale, two dtypes: checks the tool in seconds; its numbers mean "
                        "nothing.")
@cli_files.threads_option()
@cli_files.output_option()
@cli_files.plot_option(help="Write the PNG plot here.", dest="plot_path")
@cli_files.overwrite_option()
@cli_files.no_progress_option()
@click.pass_context
def command(ctx, rules, form, dtypes, state_dtype, lengths, scales, chunk_sizes, heads, dim, full_grid, rescale_dtype,
            seed, quick, threads, output, plot_path, overwrite, no_progress) -> None:
    """Low-precision error against float64 over lengths, input scales and chunk sizes; epsilon; rescaling.
    Prints a summary; writes files only with -o/--output and --plot."""
    cli_files.check_outputs(overwrite, {"--output": output, "--plot": plot_path})
    cli_files.apply_threads(ctx, threads)
    small = cli_files.quick_values(ctx, quick, {"lengths": (64, 256), "scales": (1.0,), "chunk_sizes": (16, 64),
                                               "dtypes": ("float32", "bfloat16")})
    lengths, scales = small.get("lengths", lengths), small.get("scales", scales)
    chunk_sizes, dtypes = small.get("chunk_sizes", chunk_sizes), small.get("dtypes", dtypes)
    for rule in rules:
        if form not in linattn.supported_forms(rule):
            raise click.BadParameter(f"rule {rule!r} has no form {form!r}", param_hint="--form")
    start = time.perf_counter()
    records = stability_sweep(rules=rules, form=form, dtypes=dtypes, lengths=lengths, scales=scales,
                              chunk_sizes=chunk_sizes, state_dtype=state_dtype, heads=heads, dim=dim, seed=seed,
                              full_grid=full_grid, progress=not no_progress)
    doc = {
        "tool": "stability",
        "linattn_version": linattn.__version__,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {"rules": list(rules), "form": form, "dtypes": list(dtypes), "state_dtype": state_dtype,
                   "lengths": list(lengths), "scales": list(scales), "chunk_sizes": list(chunk_sizes),
                   "grid": "full" if full_grid else "one factor at a time",
                   "batch": 1, "heads": heads, "dim": dim, "seed": seed,
                   "feature_maps": {r: FEATURE_MAP[r] for r in rules},
                   "inputs": "q, k, v = scale * N(0,1) rounded to a grid all candidate dtypes hold; delta rules: "
                             "unit-norm keys, beta = sigmoid(N(0,1)); gated rules: alpha ~ U[0.9, 1) per head",
                   "error_measure": "per token max|o - o64| / max|o64|, worst token"},
        "reference": reference_summary(rules, seed),
        "records": records,
        "epsilon": epsilon_tradeoff(seed=seed),
        "rescaling": rescaling_check(dtype=rescale_dtype, seed=seed, length=max(lengths)),
    }
    doc["elapsed_s"] = round(time.perf_counter() - start, 2)
    validate(doc, RESULT_SCHEMA, source="stability result")
    click.echo(summary(doc))
    if output:
        cli_files.write("--output", atomic_write_json, output, doc, overwrite=overwrite)
    if plot_path:
        cli_files.write("--plot", lambda p, overwrite: plot(doc, p, overwrite=overwrite), plot_path,
                        overwrite=overwrite)
    click.echo(f"({doc['elapsed_s']:.1f} s)")
