"""Delta rule (DeltaNet), S_t = S_{t-1} + b_t k_t (v_t - S_{t-1}^T k_t)^T, in every form.

It is the gated delta rule with every gate a = 1, so it runs the kernels of `linattn.ops.gated_delta` with
``g=None``, which skip all decay work in that case.
"""

from linattn.ops.gated_delta import chunk, recurrent, step

FORMS = {"recurrent": recurrent, "chunk": chunk}

__all__ = ["FORMS", "step"]
