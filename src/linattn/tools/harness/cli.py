"""The tools' command-line convention and their output files.

Options every tool spells the same way where it applies: ``-o/--output``, ``--plot``, ``--overwrite``, ``--quick``,
``--threads``, ``--no-progress``; every command shows its defaults in ``--help`` (`CONTEXT`). A tool writes
a file only where a flag asks for one (``bench`` and ``explain`` write theirs to a default name), and an
existing file is refused with one line unless ``--overwrite``.

Outputs are checked before a run (`check_outputs`), written atomically after it (`write`), errors are
click messages (never a traceback), written paths are printed in full. The rules behind both live in
`linattn.tools.harness.results` (``check_writable``, ``atomic_write``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from linattn.tools.harness import results

# Every tool's click context: defaults shown in --help.
CONTEXT = {"show_default": True}


def check_outputs(overwrite: bool, outputs: dict[str, str | os.PathLike | None]) -> None:
    """Refuse, before any work, every output (``{"--output": path, "--plot": path}``; None = not asked for) that
    could not be written, and two flags naming one file. Raises click.UsageError naming the flag."""
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        try:
            results.check_writable(path, overwrite=overwrite)
        except FileExistsError as exc:
            raise click.UsageError(f"{flag} {exc}") from None
        except (ValueError, OSError) as exc:
            raise click.UsageError(f"{flag} {os.fspath(path)!r}: {exc}") from None
        key = os.path.abspath(path)
        if key in seen:
            raise click.UsageError(f"{seen[key]} and {flag} name the same file {os.fspath(path)!r}")
        seen[key] = flag


def write(flag: str, writer: Callable[..., Any], path: str | os.PathLike, *args: Any, overwrite: bool = False) -> Path:
    """``writer(path, *args, overwrite=overwrite)`` (an atomic writer), then print ``wrote <absolute path>``.

    A file that appeared since `check_outputs` (another run racing for the name) gets the same "exists"
    message as before the run; any other failure to write is a one-line error, exit status 1."""
    try:
        writer(path, *args, overwrite=overwrite)
    except FileExistsError as exc:
        raise click.UsageError(f"{flag} {exc}") from None
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{flag}: could not write {os.fspath(path)!r}: {exc}") from None
    out = Path(path).absolute()
    click.echo(f"wrote {out}")
    return out


class FilePath(click.ParamType):
    """A file path option or argument, as a `Path`. Unlike ``click.Path`` it does not touch the
    file system (`check_outputs` and the readers judge the path and name the problem), and it refuses a
    NUL byte, on which ``click.Path`` fails with a traceback."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        text = os.fspath(value)
        if "\0" in text:
            self.fail("the path contains a NUL byte", param, ctx)
        return Path(text)


FILE = FilePath()


# ------------------------------------------------------------------------------------------ shared options
def output_option(help: str = "Write the JSON result here.", default: Any = None, **kwargs: Any) -> Callable:
    """``-o/--output FILE`` (default: nothing written unless the tool documents otherwise)."""
    return click.option("-o", "--output", "output", type=FILE, default=default, help=help, **kwargs)


def plot_option(help: str = "Draw the result to this PNG.", dest: str = "plot") -> Callable:
    return click.option("--plot", dest, type=FILE, default=None, help=help)


def overwrite_option(help: str = "Replace existing output files (otherwise they are refused).") -> Callable:
    return click.option("--overwrite", is_flag=True, help=help)


QUICK_HELP = "Tiny configuration that checks the tool in seconds; its numbers mean nothing."


def quick_option(help: str = QUICK_HELP) -> Callable:
    return click.option("--quick", is_flag=True, help=help)


def quick_values(ctx: click.Context, quick: bool, values: dict[str, Any]) -> dict[str, Any]:
    """With ``--quick``, ``values`` replace the defaults of the options a user did not set on the command line
    (an explicit option always wins); without it, nothing changes. Returns the options that change."""
    if not quick:
        return {}
    return {name: value for name, value in values.items()
            if ctx.get_parameter_source(name) in (click.core.ParameterSource.DEFAULT, None)}


def no_progress_option() -> Callable:
    return click.option("--no-progress", is_flag=True, help="Hide the progress bar.")


# On a CPU with at most this many cores every tool runs on one torch thread unless --threads says otherwise.
SMALL_MACHINE_CORES = 4
THREADS_RULE = f"1 on a CPU with at most {SMALL_MACHINE_CORES} cores, else torch's own choice"


def default_threads(device: str = "cpu", cores: int | None = -1) -> tuple[int | None, str]:
    """The torch thread count a tool uses when --threads is not given (None: leave torch's), and why.

    Small kernels end in a barrier where torch's intra-op threads wait for each other: when the OS deschedules
    one of them the whole call waits a scheduler slice. On a 2-core machine with one busy competitor, 2 threads
    made decode steps of 0.05 ms take 12-24 ms while 1 thread stayed at 0.05 ms (docs/bench.md), so a small
    machine runs one thread and stays steady; large machines keep torch's choice. ``cores`` -1: this machine's.
    """
    cores = os.cpu_count() if cores == -1 else cores
    if device == "cpu" and cores is not None and cores <= SMALL_MACHINE_CORES:
        return 1, f"default: 1 thread on a machine with {cores} <= {SMALL_MACHINE_CORES} cores (stable timings)"
    return None, "default: torch's own choice"


def threads_option(help: str = f"torch.set_num_threads for the run; default: {THREADS_RULE}.",
                   default: int | None = None) -> Callable:
    """``--threads N``; None (the default) applies `default_threads` in `apply_threads`."""
    return click.option("--threads", type=click.IntRange(min=1), default=default, help=help)


def apply_threads(ctx: click.Context, threads: int | None, device: str = "cpu") -> int:
    """Set torch's thread count for this command, ``threads`` or else `default_threads` (restored when it
    ends, for callers in the same process); returns the count in effect."""
    import torch

    if threads is None:
        threads, _ = default_threads(device)
    if threads is not None:
        before = torch.get_num_threads()
        ctx.call_on_close(lambda: torch.set_num_threads(before))
        torch.set_num_threads(threads)
    return torch.get_num_threads()
