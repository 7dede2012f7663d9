"""The memory planner: what a fixed state costs against a growing KV cache, for whole hybrid models.

`formulas` holds the byte arithmetic (no torch), `configs` reads model configs and the shipped presets into a
`LayerPlan`, `report` prices a plan at a list of lengths, and `cli` is `linattn memory`. The public names of the
first three are re-exported here.
"""

from linattn.tools.memory.configs import list_presets, load_config, load_preset, plan_from_config
from linattn.tools.memory.formulas import (
    DTYPE_BYTES,
    MAX_LAYERS,
    MAX_SEQ_LEN,
    MAX_SIZE,
    AttentionCache,
    LayerPlan,
    LinearMixer,
    canonical_dtype,
    conv_state_bytes,
    crossover_length,
    dtype_bytes,
    format_bytes,
    kv_cache_bytes,
    plan_from_shapes,
    state_bytes,
)
from linattn.tools.memory.report import curve, memory_report

__all__ = [
    "DTYPE_BYTES", "MAX_LAYERS", "MAX_SEQ_LEN", "MAX_SIZE", "AttentionCache", "LayerPlan", "LinearMixer",
    "canonical_dtype", "conv_state_bytes", "crossover_length", "curve", "dtype_bytes", "format_bytes",
    "kv_cache_bytes", "list_presets", "load_config", "load_preset", "memory_report", "plan_from_config",
    "plan_from_shapes", "state_bytes",
]
