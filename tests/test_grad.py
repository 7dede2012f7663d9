"""Gradients: gradcheck of the chunk form (the training path) in float64, and every form's gradients against the
recurrent form's on a random loss (including gates near 0 and near 1 and a last chunk shorter than the others)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck

import linattn
from linattn import State

RULES = ("accumulate", "gated", "delta", "gated_delta")


def make(rule: str, *, B=1, T=5, H=2, D=3, Dv=2, per_channel=False, g_range=(-2.0, -0.1), feature_map=None, seed=0):
    """Leaf tensors (float64, requires_grad) for one call: q, k, v and the rule's g, beta, initial S (and z)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, lo=0.0, hi=1.0):
        return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    normalized = rule in ("accumulate", "gated")
    if normalized:  # positive features keep the denominator away from 0
        q, k = rand(B, T, H, D, lo=0.1), rand(B, T, H, D, lo=0.1)
    else:  # moderate key norms keep the delta write contracting
        q, k = rand(B, T, H, D, lo=-1.0), rand(B, T, H, D, lo=-0.5, hi=0.5)
    inputs = {"q": q, "k": k, "v": rand(B, T, H, Dv, lo=-1.0)}
    if rule in ("gated", "gated_delta"):
        # Away from 0 so that gradcheck's perturbation never makes a gate positive.
        inputs["g"] = rand(B, T, H, *((D,) if per_channel else ()), lo=g_range[0], hi=g_range[1])
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = rand(B, T, H, lo=0.1, hi=1.0)
    inputs["S0"] = rand(B, H, D, Dv, lo=-1.0)
    if normalized:
        inputs["z0"] = rand(B, H, D, lo=0.5, hi=1.5)
    return inputs


def run(rule: str, form: str, inputs: dict, chunk_size: int = 2, **kwargs):
    """o and the final state S (and z) of one call, as a tuple of tensors for autograd."""
    state = State(inputs["S0"], inputs.get("z0"))
    o, final = linattn.linear_attention(
        inputs["q"], inputs["k"], inputs["v"], rule=rule, form=form, g=inputs.get("g"), beta=inputs.get("beta"),
        initial_state=state, output_final_state=True, chunk_size=chunk_size, **kwargs,
    )
    return (o, final.S) if final.z is None else (o, final.S, final.z)


GRADCHECK_CASES = [("accumulate", False), ("gated", False), ("gated", True), ("delta", False), ("gated_delta", False)]


@pytest.mark.parametrize("rule,per_channel", GRADCHECK_CASES, ids=[f"{r}{'-per-channel' * p}" for r, p in
                                                                   GRADCHECK_CASES])
def test_chunk_form_gradcheck(rule, per_channel):
    """Analytic gradients of the chunk form (T = 5 in chunks of 2) wrt every input, initial state included."""
    inputs = make(rule, per_channel=per_channel)
    names = list(inputs)

    def fn(*tensors):
        return run(rule, "chunk", dict(zip(names, tensors, strict=True)), eps=0.0)

    assert gradcheck(fn, tuple(inputs.values()), eps=1e-6, atol=1e-8, rtol=1e-6)


def grads(rule: str, form: str, inputs: dict, weights: tuple, **kwargs) -> dict:
    leaves = {name: x.detach().clone().requires_grad_() for name, x in inputs.items()}
    outs = run(rule, form, leaves, **kwargs)
    loss = sum((out * w).sum() for out, w in zip(outs, weights, strict=True))
    values = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves, values, strict=True))


CASES = [
    (rule, per_channel, g_range)
    for rule in RULES
    for per_channel in ((False, True) if rule == "gated" else (False,))
    for g_range in (((-30.0, -5.0), (-1e-3, -1e-4)) if rule in ("gated", "gated_delta") else ((-1.0, -0.1),))
]


@pytest.mark.parametrize("rule,per_channel,g_range", CASES)
@pytest.mark.parametrize("feature_map", [None, "elu1"])
def test_every_form_gradients_match_recurrent(rule, per_channel, g_range, feature_map):
    """T = 29 with chunks of 8 (a short last chunk); gates near 0 and near 1; all inputs' gradients, to 1e-10."""
    inputs = make(rule, B=2, T=29, H=2, D=4, Dv=3, per_channel=per_channel, g_range=g_range, seed=1)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        shapes = [out.shape for out in run(rule, "recurrent", inputs, feature_map=feature_map)]
    weights = tuple(torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes)
    expected = grads(rule, "recurrent", inputs, weights, feature_map=feature_map)
    for form in linattn.supported_forms(rule):
        if form == "recurrent":
            continue
        got = grads(rule, form, inputs, weights, chunk_size=8, feature_map=feature_map)
        for name, value in got.items():
            assert torch.isfinite(value).all(), f"{rule}/{form}: non-finite gradient for {name}"
            scale = max(1.0, expected[name].abs().max().item())
            err = (value - expected[name]).abs().max().item() / scale
            assert err <= 1e-10, f"{rule}/{form}: gradient of {name} differs from recurrent by {err:.3g}"
