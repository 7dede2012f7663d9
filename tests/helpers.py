"""Shared test helpers: run the float64 NumPy reference on torch inputs, compare with a relative measure."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from linattn import State, reference


def np64(x: torch.Tensor | None) -> np.ndarray | None:
    return None if x is None else x.detach().to(torch.float64).cpu().numpy()


def reference_call(q, k, v, *, initial_state: State | None = None, feature_map=None, **kwargs):
    """The reference on the same inputs as ``linattn.linear_attention`` (torch-only arguments dropped).

    A callable feature map must carry its NumPy twin (see :func:`numpy_twin`): the reference never runs torch code,
    so a bug in a torch map cannot hide in the ground truth.
    """
    for name in ("form", "chunk_size", "output_final_state", "state_dtype"):
        kwargs.pop(name, None)
    if callable(feature_map):
        twin = getattr(feature_map, "numpy_twin", None)
        if twin is None:
            raise TypeError(f"feature map {feature_map!r} has no NumPy twin; decorate it with @numpy_twin(...)")
        feature_map = twin

    for name in ("g", "beta"):
        kwargs[name] = np64(kwargs.get(name))
    if initial_state is not None:
        kwargs["initial_S"], kwargs["initial_z"] = np64(initial_state.S), np64(initial_state.z)
    return reference.linear_attention(np64(q), np64(k), np64(v), feature_map=feature_map, **kwargs)


def numpy_twin(numpy_map: Callable[[np.ndarray], np.ndarray]):
    """Decorator: attach the float64 NumPy map (from :mod:`linattn.reference`) that the reference computes instead
    of this torch callable."""

    def attach(torch_map):
        torch_map.numpy_twin = numpy_map
        return torch_map

    return attach


def rel_err(actual, expected) -> float:
    """max |actual - expected| over max(1, max |expected|): absolute for small outputs, relative for large."""
    a = np64(actual) if isinstance(actual, torch.Tensor) else np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    if e.size == 0:
        return 0.0
    return float(np.max(np.abs(a - e)) / max(1.0, float(np.max(np.abs(e)))))


def n_examples(n: int) -> int:
    """Hypothesis example count: ``n`` by default (fast CI), ten times more under HYPOTHESIS_PROFILE=thorough."""
    return 10 * n if os.environ.get("HYPOTHESIS_PROFILE") == "thorough" else n


def kernel_inputs(rule, gate, B=2, T=37, Hq=3, group=1, Dk=5, Dv=7, gates="mixed", dtype=torch.float32, seed=0):
    """Inputs for the compiled-kernel tests: ``Hq`` query/key heads, ``Hq * group`` value heads, gates per head or
    per key channel (``gates="mixed"`` plants one near 1, one near 0 and a -inf reset at fixed tokens)."""
    gen = torch.Generator().manual_seed(seed)
    H = Hq * group
    q, k = torch.randn(B, T, Hq, Dk, generator=gen), torch.randn(B, T, Hq, Dk, generator=gen)
    v = torch.randn(B, T, H, Dv, generator=gen)
    kw = {"rule": rule}
    if rule in ("delta", "gated_delta"):
        k = F.normalize(k, dim=-1)
        kw["beta"] = torch.rand(B, T, H, generator=gen) * 1.5
    else:
        q, k = F.elu(q) + 1, F.elu(k) + 1  # positive features: the normalizer stays away from 0
    if gate is not None:
        shape = (B, T, H) if gate == "head" else (B, T, H, Dk)
        g = F.logsigmoid(torch.randn(*shape, generator=gen) * 3)
        if gates == "mixed":  # near 1, near 0 and -inf (a full reset) at fixed tokens, random elsewhere
            g[:, 3], g[:, 9], g[:, T // 2] = -1e-4, -30.0, -torch.inf
        kw["g"] = g
    return q.to(dtype), k.to(dtype), v.to(dtype), kw


def check_state_and_output(o, S, ref, tol):
    """Output and final state within ``tol`` (relative) of a reference ``(o, S, z)``."""
    o_ref, S_ref, z_ref = ref
    assert rel_err(o, o_ref) < tol
    assert rel_err(S.S, S_ref) < tol
    if z_ref is not None:
        assert rel_err(S.z, z_ref) < tol
