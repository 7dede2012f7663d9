"""Result files shared by the tools: schema validation, label checks, atomic writes that never clobber.

Every tool that leaves evidence on disk goes through `write_result` and `read_result`, so a file is
validated against its JSON Schema (``schemas/<name>.schema.json`` beside this module) both when written and when
read, an existing file is never replaced unless the caller says so, and an interrupted write leaves no half file behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import tempfile
import threading
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from linattn.tools.harness.jsonfile import read_json

# Labels and ids end up in file names: letters, digits, '.', '_' and '-' only, starting with a letter or digit,
# so no path separator, no hidden file, no '..' and nothing a shell needs quoting for.
_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class ResultValidationError(ValueError):
    """A document does not match its schema. ``missing`` lists absent fields as dotted paths."""

    def __init__(self, message: str, missing: list[str], problems: list[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.problems = problems


def check_label(value: object, name: str = "run_label") -> str:
    """Return ``value`` if it is safe as (part of) a file name, else raise ValueError naming ``name``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not _LABEL_RE.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{name} {value!r} is not allowed: use 1-100 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit (no path separators, spaces or '..')"
        )
    return value


@functools.cache
def load_schema(name: str) -> dict[str, Any]:
    """The packaged JSON Schema ``schemas/<name>.schema.json`` beside this module (checked: a valid draft 2020-12)."""
    path = resources.files("linattn.tools.harness").joinpath("schemas", f"{name}.schema.json")
    text = path.read_text(encoding="utf-8")
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _where(path) -> str:
    """Dotted path of a JSON location, e.g. ``metrics.rows[0].median_step_ms``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def validate(doc: object, schema: dict[str, Any], *, source: str = "document") -> None:
    """Raise `ResultValidationError` listing every missing field and every other mismatch."""
    validator = jsonschema.Draft202012Validator(schema)
    missing: list[str] = []
    problems: list[str] = []
    for err in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        if err.validator == "required" and isinstance(err.instance, dict):
            prefix = _where(err.absolute_path)
            for field in err.validator_value:
                if field not in err.instance:
                    missing.append(field if prefix == "(top level)" else f"{prefix}.{field}")
        else:
            problems.append(f"{_where(err.absolute_path)}: {err.message}")
    if missing or problems:
        parts = []
        if missing:
            parts.append("missing fields: " + ", ".join(dict.fromkeys(missing)))
        if problems:
            parts.append("; ".join(problems[:10]) + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
        raise ResultValidationError(f"{source} does not match the schema: " + "; ".join(parts), missing, problems)


def exists_error(path: str | os.PathLike) -> FileExistsError:
    """The one message for a result path that is taken, whether seen before the run or lost in a race."""
    return FileExistsError(f"{path} exists; refusing to overwrite it (pass --overwrite to replace it)")


def refuse_existing(path: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Raise FileExistsError if ``path`` exists (a dangling symlink counts) and ``overwrite`` is off."""
    if not overwrite and os.path.lexists(path):
        raise exists_error(path)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def check_writable(path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Everything that can be known about writing ``path`` before a run starts, so that a run of minutes does not
    end in a refusal: raises FileExistsError (taken, see `exists_error`) or ValueError naming the problem
    (a NUL byte, a name too long, a dangling symbolic link, a folder or special file in the way, a parent that is a
    file, a folder that cannot be written). Returns the path. Creates nothing."""
    text = os.fspath(path)
    if "\0" in text:
        raise ValueError("the path contains a NUL byte")
    path = Path(text)
    if not path.name or path.name in (".", ".."):
        raise ValueError(f"{text!r} names a folder, not a file")
    # the nearest folder that exists: the file will be created under it (missing folders are made)
    anc = path.parent
    while not os.path.lexists(anc) and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise ValueError(f"cannot create {path}: {anc} is a file, not a folder")
    for part in (path.relative_to(anc).parts if path.is_relative_to(anc) else (path.name,)):
        if len(os.fsencode(part)) > _name_max(anc):
            raise ValueError(f"the name {part[:40]!r}... is {len(os.fsencode(part))} bytes, longer than this file "
                             f"system allows ({_name_max(anc)})")
    if path.is_symlink() and not path.exists():
        raise ValueError(
            f"{path} is a dangling symbolic link (to {os.readlink(path)!r}); remove it or pick another name"
        )
    if os.path.lexists(path):
        if not overwrite:
            raise exists_error(path)
        if not path.is_file():
            raise ValueError(f"{path} exists and is not a regular file; refusing to replace it")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise ValueError(f"cannot create {path}: no permission to write in {anc}")
    return path


@contextlib.contextmanager
def _sigterm_unwinds():
    """While a temporary file exists, turn SIGTERM into SystemExit(143) so that the ``finally`` below removes it
    (the default action would kill the process on the spot). Only in the main thread, and only when nobody else
    handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Create ``path`` through ``write(temp_path)`` so that readers see the whole file or none of it.

    The temporary file lives in the same folder (``os.replace``/``os.link`` are atomic only within one file
    system) and keeps the final suffix, so writers that infer a format from it (matplotlib) still work. Without
    ``overwrite`` an existing file is refused with FileExistsError, also when it appears while ``write`` runs:
    the final name is made with ``os.link``, which fails if the name exists, so of two writers racing for one
    path exactly one wins and the other gets `exists_error`. SIGTERM or an exception leaves no temporary
    file behind.
    """
    path = check_writable(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _sigterm_unwinds():
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:200]}.", suffix=f".tmp{path.suffix}")
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; a result file is meant to be shared
            write(tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                try:
                    os.link(tmp, path)  # fails if path exists: no check-then-replace race
                except FileExistsError:
                    raise exists_error(path) from None
                except OSError:  # file systems without hard links
                    if os.path.lexists(path):
                        raise exists_error(path) from None
                    os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
    return path


def atomic_write_json(path: str | os.PathLike, doc: Any, *, overwrite: bool = False) -> Path:
    """Write ``doc`` as indented JSON atomically (see `atomic_write`)."""

    def write(tmp: Path) -> None:
        text = json.dumps(doc, indent=2, allow_nan=False) + "\n"  # NaN is not JSON; fail before touching disk
        tmp.write_text(text, encoding="utf-8")

    return atomic_write(path, write, overwrite=overwrite)


def write_result(doc: dict[str, Any], path: str | os.PathLike, schema_name: str, *, overwrite: bool = False) -> Path:
    """Validate ``doc`` against the named schema, then write it atomically; nothing is written if invalid."""
    validate(doc, load_schema(schema_name), source=f"result for {path}")
    return atomic_write_json(path, doc, overwrite=overwrite)


def read_result(path: str | os.PathLike, schema_name: str) -> dict[str, Any]:
    """Load a result file and validate it; errors name the file and every missing field. Only a regular file
    under `linattn.tools.harness.jsonfile.MAX_BYTES`, nested at most 64 deep, with finite numbers (see
    `linattn.tools.harness.jsonfile.read_json`)."""
    doc = read_json(path, what="result file")
    validate(doc, load_schema(schema_name), source=str(path))
    return doc


def default_result_path(directory: str | os.PathLike, workload_id: str, run_label: str) -> Path:
    """``<directory>/<workload_id>_<run_label>.json`` after checking both parts are safe file-name labels."""
    return Path(directory) / f"{check_label(workload_id, 'workload_id')}_{check_label(run_label)}.json"
