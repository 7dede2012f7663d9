"""Accumulating linear attention, S_t = S_{t-1} + k_t v_t^T (Katharopoulos et al., 2020), in every form.

It is the gated rule with every gate a = 1, so it runs the kernels of `linattn.ops.gated` with ``g=None``;
those skip all decay work in that case (the chunk carry becomes a cumulative sum). The normalizer z is handled
once for all forms in `linattn.api` as an extra value column of ones.
"""

from linattn.ops.gated import chunk, parallel, recurrent, scan, step

FORMS = {"recurrent": recurrent, "chunk": chunk, "parallel": parallel, "scan": scan}

__all__ = ["FORMS", "step"]
