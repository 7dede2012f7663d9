"""The one way the tools draw: matplotlib without a display (Agg), saved atomically, the figure always closed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from linattn.tools.harness.results import atomic_write


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (imported on first use: the tools start fast without a plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | os.PathLike, *, overwrite: bool = False, dpi: int = 100,
                **savefig: Any) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix unless ``format=`` says) through `atomic_write`,
    then close it: an existing file is refused unless ``overwrite``, and an interrupted save leaves nothing
    behind."""
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, **savefig), overwrite=overwrite)
    finally:
        pyplot().close(fig)
