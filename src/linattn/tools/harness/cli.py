"""Output files of the command-line tools: checked before a run, written atomically after it, errors as click
messages (never a traceback), written paths printed in full.

Every tool calls :func:`check_outputs` before measuring anything and :func:`write` for each file at the end; the
rules behind both live in :mod:`linattn.tools.harness.results` (``check_writable``, ``atomic_write``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from linattn.tools.harness import results


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

    A file that appeared since :func:`check_outputs` (another run racing for the name) gets the same "exists"
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
    """A file path option or argument, as a :class:`~pathlib.Path`. Unlike ``click.Path`` it does not touch the
    file system (:func:`check_outputs` and the readers judge the path and name the problem), and it refuses a
    NUL byte, on which ``click.Path`` fails with a traceback."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        text = os.fspath(value)
        if "\0" in text:
            self.fail("the path contains a NUL byte", param, ctx)
        return Path(text)


FILE = FilePath()
