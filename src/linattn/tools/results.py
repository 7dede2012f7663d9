"""Moved to :mod:`linattn.tools.harness.results`; this name stays importable for the tools that still use it."""

from linattn.tools.harness.results import *  # noqa: F401,F403
from linattn.tools.harness.results import (  # noqa: F401
    ResultValidationError,
    atomic_write,
    atomic_write_json,
    check_label,
    check_writable,
    default_result_path,
    exists_error,
    load_schema,
    read_result,
    refuse_existing,
    validate,
    write_result,
)
