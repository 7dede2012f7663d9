"""One module per update rule, each holding all of its forms side by side.

Every module exposes ``FORMS: dict[name, fn]`` and ``step``. Kernels see tensors already validated, mapped to
features and cast to the accumulation dtype, in the internal layout ``[B, H, T, D]`` (any strides):

    fn(q, k, v, *, g, beta, initial_state, chunk_size, scale) -> (o [B, H, T, Dv], S [B, H, Dk, Dv])
    step(q, k, v, *, g, beta, state, inplace) -> (o [B, H, Dv], S)        # q already scaled

Kernels compute the unnormalized read o_t = S_t^T (scale q_t); the normalizer z rides along as an extra value
column of ones (see ``linattn.api``), so no kernel needs to know about it. The chunk forms return a
half-precision state in float32 (the running sum is carried in float32); ``linattn.api`` casts it at the end.
Shared pieces of the chunk forms, and the one division by the normalizer, live in ``linattn.ops.common``.
"""

# The rule and epsilon-mode names, defined here once: the API, the backends and the tools import them (the NumPy
# reference keeps its own copy on purpose, sharing no code with what it checks).
RULES = ("accumulate", "gated", "delta", "gated_delta")
GATED_RULES = ("gated", "gated_delta")  # take a log-gate g
DELTA_RULES = ("delta", "gated_delta")  # take a write strength beta; define no normalizer z
EPS_MODES = ("add", "clamp")  # den + eps, max(den, eps): see linattn.ops.common.normalized_read
