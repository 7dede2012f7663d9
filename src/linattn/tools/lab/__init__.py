"""``linattn lab``: PASS/FAIL checks that prove the mechanism on random inputs.

`checks` holds the checks (each builds its float64 inputs from a seed and compares the public API with a float64
loop, a closed formula or another form); `cli` is the command. The public names are re-exported here.
"""

from linattn.tools.lab.checks import (
    BFLOAT16_TOL,
    CHECKS,
    EXACT_TOL,
    FLOAT32_TOL,
    CheckResult,
    check_bfloat16,
    check_chunk_gradients,
    check_delta_chunk,
    check_delta_overshoot_diverges,
    check_delta_unit_key_convergence,
    check_float32,
    check_gated_delta_chunk,
    check_gated_scan_coefficients,
    check_normalizer_repeated_value,
    check_prefill_then_decode,
    check_recurrent_vs_chunk,
    check_recurrent_vs_dense,
    check_recurrent_vs_scan,
    check_segments_compose,
    check_worked_example_delta,
    check_worked_example_gate,
    check_worked_example_kernel,
    compare,
    max_rel_error,
    run_checks,
)
from linattn.tools.lab.cli import command

__all__ = [
    "BFLOAT16_TOL", "CHECKS", "CheckResult", "EXACT_TOL", "FLOAT32_TOL", "check_bfloat16", "check_chunk_gradients",
    "check_delta_chunk", "check_delta_overshoot_diverges", "check_delta_unit_key_convergence", "check_float32",
    "check_gated_delta_chunk", "check_gated_scan_coefficients", "check_normalizer_repeated_value",
    "check_prefill_then_decode", "check_recurrent_vs_chunk", "check_recurrent_vs_dense", "check_recurrent_vs_scan",
    "check_segments_compose", "check_worked_example_delta", "check_worked_example_gate",
    "check_worked_example_kernel", "command", "compare", "max_rel_error", "run_checks",
]
