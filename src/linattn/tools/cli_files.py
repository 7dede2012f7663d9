"""Moved to :mod:`linattn.tools.harness.cli`; this name stays importable for the tools that still use it."""

from linattn.tools.harness.cli import FILE, FilePath, check_outputs, write  # noqa: F401
