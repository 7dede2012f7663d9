"""The float64 reference against docs/mechanism.md's worked examples, and every torch form against them.

The examples use small integers and halves, so float64 gets them exactly (up to the last bit where a division
or an exp of a log is involved): the bound is 1e-14 relative, far below anything a wrong formula would give.
All torch calls use ``scale=1.0`` (features as given), ``eps=0`` (exact division) and float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import linattn
from linattn import State, reference
from linattn.feature_maps import FEATURE_MAPS

FORMS = {
    "accumulate": ("recurrent", "parallel", "chunk", "scan"),
    "gated": ("recurrent", "parallel", "chunk", "scan"),
    "delta": ("recurrent", "chunk"),
    "gated_delta": ("recurrent", "chunk"),
}
CHUNK_SIZES = {"chunk": (1, 2, 64)}  # T = 3: one token per chunk, a short last chunk, one partial chunk
CASES = [(rule, form, c) for rule, forms in FORMS.items() for form in forms for c in CHUNK_SIZES.get(form, (64,))]
EXACT = 1e-14


def t64(values, shape) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(shape)


# ---------------------------------------------------------------------------------------------------------------
# The examples, as (q, k, v, kwargs) in the [B, T, H, D] layout with B = H = 1.


def accumulate_example():
    """mechanism §1: phi(k) = [1,0], [0,1], [1,1]; v = 2, 4, 3; phi(q) = [2, 1] -> S = [5, 7], z = [2, 2], y = 17/6."""
    k = t64([[1, 0], [0, 1], [1, 1]], (1, 3, 1, 2))
    q = t64([[2, 1]] * 3, (1, 3, 1, 2))
    v = t64([2, 4, 3], (1, 3, 1, 1))
    # Token by token with phi(q) = [2, 1]: num 4, 8, 17 over den 2, 3, 6.
    expected_o = [2.0, 8 / 3, 17 / 6]
    return q, k, v, {}, expected_o


def gated_example(per_channel: bool):
    """docs/mechanism.md §2: features 1, v = 2, 4, 8, alpha = 0.5: S = 2, 5, 10.5; z = 1, 1.5, 1.75; y = 2, 10/3, 6."""
    ones = torch.ones(1, 3, 1, 1, dtype=torch.float64)
    g = torch.full((1, 3, 1, 1) if per_channel else (1, 3, 1), math.log(0.5), dtype=torch.float64)
    return ones, ones.clone(), t64([2, 4, 8], (1, 3, 1, 1)), {"g": g}, [2.0, 10 / 3, 6.0]


def delta_example(gated: bool):
    """docs/mechanism.md §3: unit key, v = 5, beta = 0.5, S from 2: S = 3.5, 4.25, 4.625 (y = S with a unit query)."""
    ones = torch.ones(1, 3, 1, 1, dtype=torch.float64)
    kwargs = {"beta": torch.full((1, 3, 1), 0.5, dtype=torch.float64)}
    if gated:  # alpha = 1 (g = 0) leaves the delta rule unchanged
        kwargs["g"] = torch.zeros(1, 3, 1, dtype=torch.float64)
    return ones, ones.clone(), torch.full((1, 3, 1, 1), 5.0, dtype=torch.float64), kwargs, [3.5, 4.25, 4.625]


def example(rule: str):
    return {
        "accumulate": accumulate_example,
        "gated": lambda: gated_example(False),
        "delta": lambda: delta_example(False),
        "gated_delta": lambda: delta_example(True),
    }[rule]()


def initial_state(rule: str) -> State | None:
    if rule in ("delta", "gated_delta"):
        return State(torch.full((1, 1, 1, 1), 2.0, dtype=torch.float64))
    return None


def np_kwargs(kwargs: dict) -> dict:
    return {name: x.numpy() for name, x in kwargs.items()}


# ---------------------------------------------------------------------------------------------------------------
# The reference alone.


def test_reference_accumulate_worked_example():
    q, k, v, kw, expected = accumulate_example()
    o, S, z = reference.linear_attention(q.numpy(), k.numpy(), v.numpy(), scale=1.0, eps=0)
    np.testing.assert_array_equal(S.ravel(), [5.0, 7.0])
    np.testing.assert_array_equal(z.ravel(), [2.0, 2.0])
    np.testing.assert_allclose(o.ravel(), expected, rtol=EXACT, atol=0)
    assert o.ravel()[-1] == 17 / 6


@pytest.mark.parametrize("per_channel", [False, True])
def test_reference_gated_worked_example(per_channel):
    q, k, v, kw, expected = gated_example(per_channel)
    states, norms = [], []
    for t in (1, 2, 3):  # the state after each token: run each prefix
        _, S, z = reference.linear_attention(
            q[:, :t].numpy(), k[:, :t].numpy(), v[:, :t].numpy(), rule="gated", g=kw["g"][:, :t].numpy(),
            scale=1.0, eps=0,
        )
        states.append(S.item())
        norms.append(z.item())
    o, _, _ = reference.linear_attention(q.numpy(), k.numpy(), v.numpy(), rule="gated", scale=1.0, eps=0,
                                         **np_kwargs(kw))
    np.testing.assert_allclose(states, [2.0, 5.0, 10.5], rtol=EXACT, atol=0)
    np.testing.assert_allclose(norms, [1.0, 1.5, 1.75], rtol=EXACT, atol=0)
    np.testing.assert_allclose(o.ravel(), expected, rtol=EXACT, atol=0)


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_reference_delta_worked_example(rule):
    q, k, v, kw, expected = delta_example(rule == "gated_delta")
    o, S, z = reference.linear_attention(q.numpy(), k.numpy(), v.numpy(), rule=rule, scale=1.0,
                                         initial_S=np.full((1, 1, 1, 1), 2.0), **np_kwargs(kw))
    np.testing.assert_array_equal(o.ravel(), expected)  # dyadic numbers: exact
    assert S.item() == 4.625 and z is None


def test_delta_unit_key_error_shrinks_by_one_minus_beta():
    """For one key, each write multiplies the error (v - S^T k) by (1 - beta |k|^2); beyond 2 it grows."""
    T = 12
    for beta, norm in ((0.5, 1.0), (0.3, 1.7), (1.2, 1.2), (1.5, 1.3)):
        k = np.zeros((1, T, 1, 3))
        k[..., 1] = norm
        v = np.full((1, T, 1, 2), 4.0)
        # With q = k the output is the read m_t = S_t^T k, and v - m_t = (1 - beta |k|^2) (v - m_{t-1}), m_0 = 0.
        o, _, _ = reference.linear_attention(k, k, v, rule="delta", beta=np.full((1, T, 1), beta), scale=1.0)
        factor = 1 - beta * norm**2
        np.testing.assert_allclose(4.0 - o[0, :, 0, 0], 4.0 * factor ** np.arange(1, T + 1), rtol=1e-12, atol=1e-13)
        if beta * norm**2 > 2:  # overshoot: the error grows instead of shrinking
            assert abs(4.0 - o[0, -1, 0, 0]) > 4.0 * 10


def test_positive_feature_map_values_and_shape():
    x = np.array([[-2.0, 0.0, 0.5], [3.0, -0.1, 1e-9]])
    phi = reference.positive_feature_map(x)
    assert phi.shape == x.shape and phi.dtype == np.float64
    np.testing.assert_array_equal(phi, [[1.0, 1.0, 1.5], [4.0, 1.0, 1.0 + 1e-9]])
    assert (phi > 0).all()


def test_linear_attention_scan_by_hand():
    # phi(k) = [2, 1], [1, 2]; phi(q) = [1, 1]; v = 3, 6.  t=1: S = [6, 3], z = [2, 1] -> 9/3.
    # t=2: S = [12, 15], z = [3, 3] -> 27/6.
    outputs, S, z = reference.linear_attention_scan(np.zeros((2, 2)), [[1, 0], [0, 1]], [[3.0], [6.0]])
    np.testing.assert_allclose(outputs.ravel(), [3.0, 4.5], rtol=EXACT)
    np.testing.assert_array_equal(S, [[12.0], [15.0]])
    np.testing.assert_array_equal(z, [3.0, 3.0])


def test_scan_equals_general_reference_with_relu1():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(7, 3)), rng.normal(size=(7, 3)), rng.normal(size=(7, 2))
    outputs, S, z = reference.linear_attention_scan(q, k, v)
    o2, S2, z2 = reference.linear_attention(q[None, :, None], k[None, :, None], v[None, :, None],
                                            feature_map="relu1", scale=1.0, eps=0)
    np.testing.assert_allclose(outputs, o2[0, :, 0], rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(S, S2[0, 0], rtol=1e-14)
    np.testing.assert_allclose(z, z2[0, 0], rtol=1e-14)


def test_repeated_pair_keeps_output_at_value():
    """docs/mechanism.md "Why z": one key/value pair repeated m times reads back v, whatever m."""
    q = np.tile(np.array([0.3, -1.0]), (50, 1))
    v = np.tile(np.array([2.5, -7.0]), (50, 1))
    outputs, _, z = reference.linear_attention_scan(q, q, v)
    np.testing.assert_allclose(outputs, v, rtol=1e-13)
    np.testing.assert_allclose(z, 50 * reference.positive_feature_map(q[:1])[0])


@pytest.mark.parametrize("name", sorted(FEATURE_MAPS))
def test_numpy_feature_maps_match_torch(name):
    x = torch.linspace(-4, 4, 2 * 3 * 5, dtype=torch.float64).reshape(2, 3, 5)
    np.testing.assert_allclose(reference.FEATURE_MAPS[name](x.numpy()), FEATURE_MAPS[name](x).numpy(),
                               rtol=1e-15, atol=1e-15)


def test_taylor2_kernel_is_second_order_exp():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=4), rng.normal(size=4)
    s = q @ k / 2.0  # q.k / sqrt(D), D = 4
    assert reference.taylor2(q).shape == (1 + 4 + 16,)
    assert reference.taylor2(q) @ reference.taylor2(k) == pytest.approx(1 + s + s * s / 2, rel=1e-14)


def test_reference_gate_zero_and_scale_invariance():
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 5, 3, 4)) for _ in range(3))
    base = reference.linear_attention(q, k, v, feature_map="elu1", eps=0)
    gated = reference.linear_attention(q, k, v, rule="gated", g=np.zeros((2, 5, 3)), feature_map="elu1", eps=0)
    scaled = reference.linear_attention(q, k, v, feature_map="elu1", eps=0, scale=7.0)  # cancels when exact
    for a, b in ((base, gated), (base, scaled)):
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-13)
    beta = rng.uniform(0.1, 1.0, size=(2, 5, 3))
    kn = k / np.linalg.norm(k, axis=-1, keepdims=True)
    d = reference.linear_attention(q, kn, v, rule="delta", beta=beta)
    gd = reference.linear_attention(q, kn, v, rule="gated_delta", beta=beta, g=np.zeros((2, 5, 3)))
    assert d[2] is None and gd[2] is None
    for x, y in zip(d[:2], gd[:2], strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-13)


def test_reference_eps_modes_differ_on_tiny_denominator():
    q = np.full((1, 1, 1, 1), 1e-8)
    v = np.full((1, 1, 1, 1), 3.0)
    o_add, _, _ = reference.linear_attention(q, np.ones_like(q), v, scale=1.0, eps=1e-6, eps_mode="add")
    o_clamp, _, _ = reference.linear_attention(q, np.ones_like(q), v, scale=1.0, eps=1e-6, eps_mode="clamp")
    assert o_add.item() == pytest.approx(3e-8 / (1e-8 + 1e-6), rel=1e-14)
    assert o_clamp.item() == pytest.approx(3e-8 / 1e-6, rel=1e-14)


# ---------------------------------------------------------------------------------------------------------------
# The same examples through the torch API, every form, and through step().


def test_supported_forms_contract():
    for rule, forms in FORMS.items():
        assert set(linattn.supported_forms(rule)) == set(forms)


@pytest.mark.parametrize("rule,form,chunk_size", CASES)
def test_worked_example_every_form(rule, form, chunk_size):
    q, k, v, kw, expected = example(rule)
    o, state = linattn.linear_attention(q, k, v, rule=rule, form=form, scale=1.0, eps=0, chunk_size=chunk_size,
                                        initial_state=initial_state(rule), output_final_state=True, **kw)
    assert o.dtype == torch.float64 and o.shape == v.shape
    np.testing.assert_allclose(o.numpy().ravel(), expected, rtol=EXACT, atol=0)
    S = state.S.numpy().ravel()
    if rule == "accumulate":
        np.testing.assert_allclose(S, [5.0, 7.0], rtol=EXACT)
        np.testing.assert_allclose(state.z.numpy().ravel(), [2.0, 2.0], rtol=EXACT)
    elif rule == "gated":
        np.testing.assert_allclose(S, [10.5], rtol=EXACT)
        np.testing.assert_allclose(state.z.numpy().ravel(), [1.75], rtol=EXACT)
    else:
        np.testing.assert_allclose(S, [4.625], rtol=EXACT)
        assert state.z is None


@pytest.mark.parametrize("form", FORMS["gated"])
def test_gated_worked_example_state_after_each_token(form):
    for per_channel in (False, True):
        q, k, v, kw, _ = gated_example(per_channel)
        got_S, got_z = [], []
        for t in (1, 2, 3):
            _, state = linattn.linear_attention(q[:, :t], k[:, :t], v[:, :t], rule="gated", form=form, scale=1.0,
                                                eps=0, g=kw["g"][:, :t], chunk_size=2, output_final_state=True)
            got_S.append(state.S.item())
            got_z.append(state.z.item())
        np.testing.assert_allclose(got_S, [2.0, 5.0, 10.5], rtol=EXACT)
        np.testing.assert_allclose(got_z, [1.0, 1.5, 1.75], rtol=EXACT)


@pytest.mark.parametrize("rule", list(FORMS))
def test_worked_example_token_by_token_step(rule):
    q, k, v, kw, expected = example(rule)
    state = initial_state(rule)
    outs = []
    for t in range(3):
        o, state = linattn.step(q[:, t], k[:, t], v[:, t], state, rule=rule, scale=1.0, eps=0,
                                **{name: x[:, t] for name, x in kw.items()})
        outs.append(o.item())
    np.testing.assert_allclose(outs, expected, rtol=EXACT, atol=0)


def test_numpy_twins_of_the_tests_callable_maps_match_torch():
    """The callables test_forms passes as feature maps: their NumPy twins in the reference compute the same map."""
    from test_forms import l2_map, softplus_map

    x = torch.linspace(-60, 60, 4 * 7, dtype=torch.float64).reshape(4, 7)
    for torch_map, numpy_map in ((softplus_map, reference.softplus), (l2_map, reference.l2_normalize)):
        assert torch_map.numpy_twin is numpy_map
        np.testing.assert_allclose(numpy_map(x.numpy()), torch_map(x).numpy(), rtol=1e-15, atol=1e-300)
