"""``linattn lab``: one line per check, exit status 1 if any fails."""

from __future__ import annotations

import sys
import time

import click

from linattn.tools.lab.checks import CHECKS, one_thread


@click.command(name="lab")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--verbose", "-v", is_flag=True, help="Also print where each check's worst error was.")
def command(seed: int, verbose: bool) -> None:
    """PASS/FAIL checks that prove the mechanism on random inputs (float64 unless a line says otherwise).

    Each line is `name: PASS|FAIL  max_err=E tol=T`, with E the worst max|a - b| / max(1, max|b|) of the check.
    Exits with status 1 if any check fails.
    """
    start = time.perf_counter()
    failed = 0
    for check in CHECKS:
        with one_thread():
            result = check(seed)
        click.echo(result.line())
        if verbose or not result.passed:
            click.echo(f"    {result.detail}")
        failed += not result.passed
    elapsed = time.perf_counter() - start
    click.echo(f"{len(CHECKS) - failed} of {len(CHECKS)} checks passed (seed {seed}, {elapsed:.1f} s)")
    if failed:
        sys.exit(1)
