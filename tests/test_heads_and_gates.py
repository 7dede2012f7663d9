"""Grouped value heads (HV a multiple of H), per-key-channel gates in the delta rule (Kimi Delta Attention) and the
"l2" feature map: every form and ``step`` against repeating q/k by hand and against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from helpers import np64, reference_call, rel_err
from test_grad import run as run_with_state

import linattn
from linattn import State

RULES = linattn.RULES
TOL64 = 1e-10


def inputs(rule, *, B=2, T=37, H=2, group=2, D=5, Dv=3, per_channel=False, g_lo=-3.0, seed=0, l2=True):
    """q, k [B, T, H, D]; v, g, beta and the initial state with H * group heads; all float64."""
    gen = torch.Generator().manual_seed(seed)
    HV = H * group
    q, k = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, HV, Dv, generator=gen, dtype=torch.float64)
    kwargs = {"rule": rule}
    normalized = rule in ("accumulate", "gated")
    if normalized:
        kwargs["feature_map"] = "elu1"
    elif l2:
        kwargs["feature_map"] = "l2"
    if rule in ("gated", "gated_delta"):
        shape = (B, T, HV, D) if per_channel else (B, T, HV)
        kwargs["g"] = g_lo * torch.rand(*shape, generator=gen, dtype=torch.float64)
    if rule in ("delta", "gated_delta"):
        kwargs["beta"] = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    S0 = torch.randn(B, HV, D, Dv, generator=gen, dtype=torch.float64)
    z0 = torch.rand(B, HV, D, generator=gen, dtype=torch.float64) + 0.5 if normalized else None
    kwargs["initial_state"] = State(S0, z0)
    return (q, k, v), kwargs


def forms_and_step(q, k, v, chunk_size=8, **kwargs):
    """{form: (o, state)} for every form of the rule, plus "step": one token at a time through ``linattn.step``."""
    out = {}
    for form in linattn.supported_forms(kwargs["rule"]):
        out[form] = linattn.linear_attention(q, k, v, form=form, chunk_size=chunk_size, output_final_state=True,
                                             **kwargs)
    per_token = {n: kwargs[n] for n in ("g", "beta") if n in kwargs}
    rest = {n: x for n, x in kwargs.items() if n not in per_token and n != "initial_state"}
    state, outs = kwargs.get("initial_state"), []
    for t in range(q.shape[1]):
        o_t, state = linattn.step(q[:, t], k[:, t], v[:, t], state, **{n: x[:, t] for n, x in per_token.items()},
                                  **rest)
        outs.append(o_t)
    out["step"] = (torch.stack(outs, dim=1), state)
    return out


@pytest.mark.parametrize("rule", RULES)
def test_grouped_value_heads_equal_repeating_qk_by_hand(rule):
    (q, k, v), kwargs = inputs(rule, group=3, per_channel=rule == "gated")
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    # By hand: value head j reads q/k head j // group (repeat_interleave, as fla and HF Qwen3-Next).
    q_rep, k_rep = q.repeat_interleave(3, dim=2), k.repeat_interleave(3, dim=2)
    o_ref_rep, S_ref_rep, _ = reference_call(q_rep, k_rep, v, **kwargs)
    assert rel_err(torch.from_numpy(o_ref), o_ref_rep) <= 1e-14 and rel_err(torch.from_numpy(S_ref), S_ref_rep) <= 1e-14
    for name, (o, state) in forms_and_step(q, k, v, **kwargs).items():
        o_rep, state_rep = (linattn.linear_attention(q_rep, k_rep, v, form=name, chunk_size=8, output_final_state=True,
                                                     **kwargs) if name != "step" else (None, None))
        assert o.shape == v.shape and state.S.shape == kwargs["initial_state"].S.shape
        assert rel_err(o, o_ref) <= TOL64 and rel_err(state.S, S_ref) <= TOL64, name
        if o_rep is not None:
            assert rel_err(o, np64(o_rep)) <= TOL64 and rel_err(state.S, np64(state_rep.S)) <= TOL64, name
    # Tiling (head j reads j % H) is a different function: the test can tell the two mappings apart.
    o_tile, _, _ = reference_call(q.repeat(1, 1, 3, 1), k.repeat(1, 1, 3, 1), v, **kwargs)
    assert rel_err(torch.from_numpy(o_tile), o_ref) > 1e-3


@pytest.mark.parametrize("g_lo", [-1e-3, -3.0, -80.0], ids=["near_one", "moderate", "near_zero"])
@pytest.mark.parametrize("group", [1, 2])
def test_kimi_delta_per_channel_gate_every_form_and_step(group, g_lo):
    """S_t = (I - beta k k^T) diag(a_t) S_{t-1} + beta k v^T against the reference's token loop; T = 37 is not a
    multiple of the chunk; the near-zero gates take the chunk form's exact masked path, the others its factored one.
    """
    (q, k, v), kwargs = inputs("gated_delta", group=group, per_channel=True, g_lo=g_lo)
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    for chunk_size in (1, 8, 64):
        for name, (o, state) in forms_and_step(q, k, v, chunk_size=chunk_size, **kwargs).items():
            errs = rel_err(o, o_ref), rel_err(state.S, S_ref)
            assert max(errs) <= TOL64, (name, chunk_size, errs)


def test_kimi_delta_per_channel_gate_resets_and_float32():
    (q, k, v), kwargs = inputs("gated_delta", per_channel=True, seed=3)
    g = kwargs["g"].clone()
    g[:, 10, :, :2] = -float("inf")  # some channels reset, the others keep their memory
    g[:, 20] = -1e30
    kwargs["g"] = g
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    for name, (o, state) in forms_and_step(q, k, v, **kwargs).items():
        assert rel_err(o, o_ref) <= TOL64 and rel_err(state.S, S_ref) <= TOL64, name
    f32 = {n: (x.float() if isinstance(x, torch.Tensor) else x) for n, x in kwargs.items()}
    f32["initial_state"] = kwargs["initial_state"].to(torch.float32)
    for name, (o, state) in forms_and_step(q.float(), k.float(), v.float(), **f32).items():
        assert rel_err(o, o_ref) <= 1e-5 and rel_err(state.S, S_ref) <= 1e-5, name


@pytest.mark.parametrize("g_range", [(-2.0, -0.1), (-90.0, -70.0)], ids=["factored", "masked"])
def test_kimi_delta_gradients_chunk_equal_recurrent(g_range):
    gen = torch.Generator().manual_seed(1)

    def leaf(*shape, lo=-1.0, hi=1.0):
        return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    B, T, H, G, D, Dv = 1, 11, 2, 2, 3, 2
    inp = {"q": leaf(B, T, H, D), "k": leaf(B, T, H, D, lo=-0.5, hi=0.5), "v": leaf(B, T, H * G, Dv),
           "g": leaf(B, T, H * G, D, lo=g_range[0], hi=g_range[1]), "beta": leaf(B, T, H * G, lo=0.1),
           "S0": leaf(B, H * G, D, Dv)}
    weights = [torch.randn(B, T, H * G, Dv, generator=gen, dtype=torch.float64),
               torch.randn(B, H * G, D, Dv, generator=gen, dtype=torch.float64)]
    grads = {}
    for form in ("recurrent", "chunk"):
        outs = run_with_state("gated_delta", form, inp, chunk_size=4)
        loss = sum((o * w).sum() for o, w in zip(outs, weights, strict=True))
        grads[form] = torch.autograd.grad(loss, list(inp.values()))
    for name, a, b in zip(inp, grads["chunk"], grads["recurrent"], strict=True):
        assert torch.isfinite(a).all() and rel_err(a, np64(b)) <= 1e-9, name
    assert grads["chunk"][3].abs().max() > 0 or g_range[0] < -50  # the gate gets a real gradient when it matters


def test_l2_feature_map_values_and_reference():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    y = linattn.FEATURE_MAPS["l2"](x)
    assert torch.allclose(y[0], torch.tensor([0.6, 0.8], dtype=torch.float64) / (1 + 1e-6 / 25) ** 0.5, atol=0)
    assert (y[1] == 0).all()  # the epsilon inside the root keeps a zero vector finite
    (q, k, v), kwargs = inputs("delta", group=1)
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    for name, (o, state) in forms_and_step(q, k, v, **kwargs).items():
        assert rel_err(o, o_ref) <= TOL64 and rel_err(state.S, S_ref) <= TOL64, name
    # the same as normalizing by hand with the formula fla and HF use
    def by_hand(t):
        return t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)
    kw = dict(kwargs, feature_map=None)
    o_hand, _ = linattn.linear_attention(by_hand(q), by_hand(k), v, **kw)
    o, _ = linattn.linear_attention(q, k, v, **kwargs)
    assert rel_err(o, np64(o_hand)) <= 1e-14


def test_kimi_delta_gradients_finite_through_resets():
    """A per-channel reset (g = -inf on some channels) and a huge decay: chunk gradients equal the token loop's."""
    gen = torch.Generator().manual_seed(4)
    B, T, H, D, Dv = 1, 20, 2, 4, 3
    q, k = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen, dtype=torch.float64).requires_grad_()
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64).requires_grad_()
    g = -torch.rand(B, T, H, D, generator=gen, dtype=torch.float64)
    g[:, 5, :, :2] = -float("inf")
    g[:, 12] = -200.0
    g.requires_grad_()
    grads = {}
    for form in ("recurrent", "chunk"):
        o, s = linattn.linear_attention(q, k, v, rule="gated_delta", g=g, beta=beta, feature_map="l2", form=form,
                                        chunk_size=8, output_final_state=True)
        grads[form] = torch.autograd.grad(o.sum() + s.S.sum(), [q, k, v, beta, g])
    for a, b in zip(grads["chunk"], grads["recurrent"], strict=True):
        assert torch.isfinite(a).all() and rel_err(a, np64(b)) <= 1e-10
