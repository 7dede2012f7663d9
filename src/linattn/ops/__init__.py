"""One module per update rule, each holding all of its forms side by side.

Every module exposes ``FORMS: dict[name, fn]`` and ``step``. Kernels see tensors already validated, mapped to
features, scaled and cast to the accumulation dtype, in the internal layout ``[B, H, T, D]``:

    fn(q, k, v, *, g, beta, initial_state, chunk_size) -> (o [B, H, T, Dv], S [B, H, Dk, Dv])
    step(q, k, v, *, g, beta, state, inplace) -> (o [B, H, Dv], S)

Kernels compute the unnormalized read o_t = S_t^T q_t; the normalizer z rides along as an extra value column of
ones (see ``linattn.api``), so no kernel needs to know about it.
"""
