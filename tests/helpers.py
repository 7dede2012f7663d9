"""Shared test helpers: run the float64 NumPy reference on torch inputs, compare with a relative measure."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import torch

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
