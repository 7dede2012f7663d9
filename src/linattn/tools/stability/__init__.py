"""``linattn stability``: low-precision error against float64, epsilon and state rescaling.

`measure` computes (pure functions returning dicts), `report` holds the result's schema and the printed table,
`plots` draws a result, `cli` is the command. The public names are re-exported here.
"""

from linattn.tools.stability.cli import command
from linattn.tools.stability.measure import (
    DTYPES,
    REFERENCE_CHUNK,
    REFERENCE_FORM,
    REFERENCE_TOL,
    case_grid,
    common_grid,
    epsilon_inputs,
    epsilon_tradeoff,
    error_stats,
    make_inputs,
    reference_check,
    rescale_state,
    rescaling_check,
    run_segmented,
    stability_sweep,
    token_rel_change,
)
from linattn.tools.stability.plots import plot
from linattn.tools.stability.report import RESULT_SCHEMA, summary, worst_by_length

__all__ = [
    "DTYPES", "REFERENCE_CHUNK", "REFERENCE_FORM", "REFERENCE_TOL", "RESULT_SCHEMA", "case_grid", "command",
    "common_grid", "epsilon_inputs", "epsilon_tradeoff", "error_stats", "make_inputs", "plot", "reference_check",
    "rescale_state", "rescaling_check", "run_segmented", "stability_sweep", "summary", "token_rel_change",
    "worst_by_length",
]
