"""Reading a JSON file a user points at, without surprises: a regular file of bounded size, bounded nesting and
only finite numbers, or a ``ValueError`` that says which of these it is not.

Used by ``linattn bench show`` (result files) and ``linattn memory --config`` (model configs). Plain ``json.load``
would block forever on a FIFO, read a device until memory runs out, recurse into ``RecursionError`` on
``[[[[...]]]]`` and accept ``NaN``/``Infinity``/``1e999`` as floats that poison every later sum.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 16 * 2**20  # far above any result file or config.json (a few KiB to a few hundred KiB)
MAX_DEPTH = 64  # real configs and results nest 4-6 deep


def _reject_constant(name: str) -> Any:
    raise ValueError(f"holds the non-finite number {name}, which is not JSON")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e999 parses to inf
        raise ValueError(f"holds the number {text}, too large for a float (it would be infinite)")
    return x


def _depth(doc: Any) -> int:
    """Deepest nesting of lists and dicts, computed without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            x = list(x.values())
        elif not isinstance(x, list):
            continue
        deepest = max(deepest, d)
        stack.extend((y, d + 1) for y in x if isinstance(y, (dict, list)))
    return deepest


def read_json(path: str | os.PathLike, *, what: str = "file", max_bytes: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """Parse the JSON in ``path``. Raises ``FileNotFoundError`` if it does not exist and ``ValueError`` (message
    starting with ``what`` and the path) if it is not a regular file, is larger than ``max_bytes``, is not
    UTF-8 JSON, nests deeper than ``max_depth`` or holds NaN, Infinity or a number that overflows a float."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    if "\0" in str(p):
        raise ValueError(f"{what}: the path contains a NUL byte")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below then refuses it.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise FileNotFoundError(f"{where} does not exist") from None
    except OSError as e:
        raise ValueError(f"{where} cannot be read: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else (
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise ValueError(f"{where} is {kind}; expected a regular JSON file")
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > max_bytes:
            raise ValueError(f"{where} is {st.st_size:,} bytes, over the limit of {max_bytes:,}")
        data = fh.read(max_bytes + 1)  # the file may grow after fstat
    if len(data) > max_bytes:
        raise ValueError(f"{where} is over the limit of {max_bytes:,} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{where} nests lists or objects too deeply (limit {max_depth})") from None
    except ValueError as e:  # non-finite numbers, or an integer over Python's digit limit
        raise ValueError(f"{where} {e}") from None
    if _depth(doc) > max_depth:
        raise ValueError(f"{where} nests lists or objects too deeply (limit {max_depth})")
    return doc
