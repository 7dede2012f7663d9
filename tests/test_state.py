"""linattn.State: every public method, the record of what made a state, and the misuse it lets step refuse."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State
from linattn.state import is_joint

B, T, H, D, DV = 2, 5, 3, 4, 6


def inputs(lead=(B, T, H), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*lead, D, generator=gen), torch.randn(*lead, D, generator=gen), torch.randn(*lead, DV,
                                                                                                   generator=gen)


def made(rule="accumulate", feature_map="elu1", **kw) -> State:
    q, k, v = inputs()
    if rule in ("gated", "gated_delta"):
        kw["g"] = torch.full((B, T, H), -0.2)
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.full((B, T, H), 0.5)
        k = F.normalize(k, dim=-1)
    return linattn.linear_attention(q, k, v, rule=rule, feature_map=feature_map, output_final_state=True, **kw)[1]


# ---------------------------------------------------------------------------------------------------------------
# The record


@pytest.mark.parametrize("rule", linattn.RULES)
def test_states_made_by_linattn_record_rule_map_and_normalization(rule):
    fmap = None if rule in ("delta", "gated_delta") else "relu1"
    s = made(rule, fmap)
    assert (s.rule, s.feature_map, s.normalized) == (rule, "identity" if fmap is None else fmap, s.z is not None)
    assert s.normalized == (rule in ("accumulate", "gated"))
    q, k, v = (x[:, 0] for x in inputs())
    extra = {"g": torch.full((B, H), -0.2)} if rule in ("gated", "gated_delta") else {}
    if rule in ("delta", "gated_delta"):
        extra["beta"] = torch.full((B, H), 0.5)
    for start in (None, s):
        _, s2 = linattn.step(q, F.normalize(k, dim=-1), v, start, rule=rule, feature_map=fmap, **extra)
        assert (s2.rule, s2.feature_map, s2.normalized) == (s.rule, s.feature_map, s.normalized)


def test_feature_map_names():
    name = linattn.feature_maps.feature_map_name
    assert name(None) == name("identity") == name(linattn.feature_maps.identity) == "identity"
    assert name(linattn.feature_maps.elu1) == "elu1"

    def phi(x):
        return x.relu() + 1

    assert name(phi) == f"{__name__}.test_feature_map_names.<locals>.phi"
    assert name(functools.partial(phi)) == f"partial({name(phi)})"
    assert name(torch.nn.ReLU()) == "torch.nn.modules.activation.ReLU"


def test_a_callable_map_matches_its_own_state_by_name_even_when_rebuilt():
    """A lambda rebuilt at each decode step is the same map: its qualified name is recorded, not its identity."""
    q, k, v = inputs()
    maps = [lambda x: F.elu(x) + 1 for _ in range(2)]
    _, s = linattn.linear_attention(q, k, v, feature_map=maps[0], output_final_state=True)
    o, s2 = linattn.step(q[:, 0], k[:, 0], v[:, 0], s, feature_map=maps[1])
    assert s2.feature_map == s.feature_map and torch.isfinite(o).all()
    with pytest.raises(ValueError, match=r"state was made with feature_map '.*<lambda>' but this call uses 'elu1'"):
        linattn.step(q[:, 0], k[:, 0], v[:, 0], s, feature_map="elu1")


@pytest.mark.parametrize("fn", ["linear_attention", "step"])
def test_a_state_of_another_rule_or_map_is_refused_naming_both(fn):
    q, k, v = inputs()
    s = made("accumulate", "elu1")

    def call(**kw):
        if fn == "step":
            kw = {n: (x[:, 0] if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
            return linattn.step(q[:, 0], k[:, 0], v[:, 0], s, **kw)
        return linattn.linear_attention(q, k, v, initial_state=s, **kw)

    name = "state" if fn == "step" else "initial_state"
    with pytest.raises(ValueError, match=rf"^{name} was made by rule 'accumulate' but this call uses rule='gated'"):
        call(rule="gated", g=torch.full((B, T, H), -0.1), feature_map="elu1")
    with pytest.raises(ValueError, match=rf"^{name} was made with feature_map 'elu1' but this call uses 'relu1'"):
        call(feature_map="relu1")
    with pytest.raises(ValueError, match=r"feature_map 'elu1' but this call uses 'identity'"):
        call()
    call(feature_map="elu1")  # the same rule and map: fine
    # Carried over on purpose: a hand-built State has no record and is trusted.
    o, _ = linattn.linear_attention(q, k, v, rule="gated", g=torch.full((B, T, H), -0.1), feature_map="elu1",
                                    initial_state=State(s.S, s.z))
    assert torch.isfinite(o).all()


def test_none_and_identity_are_the_same_map():
    q, k, v = inputs()
    _, s = linattn.linear_attention(q, k, v, output_final_state=True)
    o1, _ = linattn.linear_attention(q, k, v, feature_map="identity", initial_state=s)
    o2, _ = linattn.linear_attention(q, k, v, feature_map=linattn.feature_maps.identity, initial_state=s)
    assert torch.equal(o1, o2)


def test_width_errors_name_the_feature_map_width():
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"key width 4 must be the feature width 21 that feature_map 'taylor2' "
                                         r"gives for inputs of width 4"):
        linattn.linear_attention(q, k, v, feature_map="taylor2", initial_state=State.zeros(B, H, D, DV))
    with pytest.raises(ValueError, match=r"value width 7 must be v's width 6"):
        linattn.linear_attention(q, k, v, initial_state=State.zeros(B, H, D, DV + 1))
    with pytest.raises(ValueError, match=r"batch and heads \(2, 4\) must be q's \(B, H\) = \(2, 3\)"):
        linattn.step(q[:, 0], k[:, 0], v[:, 0], State.zeros(B, H + 1, D, DV))


def test_missing_z_says_the_rules_default_asked_for_it():
    q, k, v = inputs()
    with pytest.raises(ValueError, match=r"state.z is None but normalize=True needs the normalizer z: rule 'gated' "
                                         r"normalizes by default \(normalize=None means True"):
        linattn.step(q[:, 0], k[:, 0], v[:, 0], State(torch.zeros(B, H, D, DV)), rule="gated",
                     g=torch.zeros(B, H))
    o, _ = linattn.step(q[:, 0], k[:, 0], v[:, 0], State(torch.zeros(B, H, D, DV)), normalize=False)
    assert torch.equal(o, torch.zeros_like(o) + o)  # and normalize=False reads it


# ---------------------------------------------------------------------------------------------------------------
# Public methods


def test_clone_is_a_real_copy_that_keeps_the_record_and_the_joint_buffer():
    s = made()
    c = s.clone()
    assert c is not s and c.S is not s.S and c.z is not s.z
    assert c.S.data_ptr() != s.S.data_ptr() and c.z.data_ptr() != s.z.data_ptr()
    assert torch.equal(c.S, s.S) and torch.equal(c.z, s.z)
    assert (c.rule, c.feature_map, c.normalized) == (s.rule, s.feature_map, s.normalized)
    assert is_joint(c.S, c.z)  # so step(inplace=True) updates it where it lies
    before = s.S.clone(), s.z.clone()
    c.S.add_(1.0)
    c.z.add_(1.0)
    assert torch.equal(s.S, before[0]) and torch.equal(s.z, before[1])
    c2 = State(s.S, None).clone()
    assert c2.z is None and c2.S.data_ptr() != s.S.data_ptr() and torch.equal(c2.S, s.S)


def test_clone_keeps_gradients_flowing_and_separate_tensors_separate():
    S = torch.randn(B, H, D, DV, requires_grad=True)
    z = torch.rand(B, H, D, requires_grad=True)
    c = State(S, z).clone()
    (c.S.sum() + 2 * c.z.sum()).backward()
    assert torch.equal(S.grad, torch.ones_like(S)) and torch.equal(z.grad, 2 * torch.ones_like(z))


def test_detach_cuts_the_graph_shares_memory_and_keeps_the_record():
    q, k, v = (x.requires_grad_() for x in inputs())
    _, s = linattn.linear_attention(q, k, v, feature_map="elu1", output_final_state=True)
    assert s.S.requires_grad and s.z.requires_grad
    d = s.detach()
    assert d is not s and not d.S.requires_grad and not d.z.requires_grad
    assert d.S.data_ptr() == s.S.data_ptr() and torch.equal(d.S, s.S) and torch.equal(d.z, s.z)
    assert (d.rule, d.feature_map, d.normalized) == ("accumulate", "elu1", True)


def test_to_converts_keeps_the_record_and_returns_self_memory_when_nothing_changes():
    s = made()
    s64 = s.to(torch.float64)
    assert s64.dtype == torch.float64 and s64.z.dtype == torch.float64
    assert torch.equal(s64.S, s.S.double()) and torch.equal(s64.z, s.z.double())
    assert (s64.rule, s64.feature_map, s64.normalized) == (s.rule, s.feature_map, s.normalized)
    assert is_joint(s64.S, s64.z)
    same = s.to(torch.float32)
    assert same.S.data_ptr() == s.S.data_ptr()  # as Tensor.to: nothing to do, no copy
    meta = s.to("meta")
    assert meta.device.type == "meta" and meta.S.shape == s.S.shape and meta.rule == s.rule
    assert State(s.S.clone()).to(dtype=torch.float16).S.dtype == torch.float16


@pytest.mark.parametrize("normalizer", [True, False])
def test_zeros(normalizer):
    s = State.zeros(B, H, D, DV, normalizer=normalizer, dtype=torch.float64)
    assert s.S.shape == (B, H, D, DV) and s.dtype == torch.float64 and s.device == torch.device("cpu")
    assert not s.S.any()
    assert (s.z is not None) == normalizer
    if normalizer:
        assert s.z.shape == (B, H, D) and not s.z.any() and is_joint(s.S, s.z)
    assert (s.rule, s.feature_map, s.normalized) == (None, None, None)
    assert State.zeros(np.int64(1), 1, 1, 1).S.shape == (1, 1, 1, 1)
    assert State.zeros(0, H, D, DV).nbytes == 0


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((-1, H, D, DV), {}, ValueError, r"State.zeros: batch must be >= 0, got -1"),
    ((B, -2, D, DV), {}, ValueError, r"heads must be >= 0, got -2"),
    ((B, H, -1, DV), {}, ValueError, r"key_dim must be >= 0"),
    ((B, H, D, -1), {}, ValueError, r"value_dim must be >= 0"),
    ((B, H, 2.0, DV), {}, TypeError, r"key_dim must be an int, got float"),
    ((True, H, D, DV), {}, TypeError, r"batch must be an int, got bool"),
    ((B, H, D, DV), {"dtype": torch.int32}, TypeError, r"dtype must be a floating torch.dtype"),
    ((B, H, D, DV), {"normalizer": None}, TypeError, r"normalizer must be a bool"),
])
def test_zeros_rejects(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        State.zeros(*args, **kwargs)


def test_nbytes_dtype_device():
    s = State.zeros(B, H, D, DV)
    assert s.nbytes == (B * H * D * DV + B * H * D) * 4
    assert State(torch.zeros(B, H, D, DV, dtype=torch.bfloat16)).nbytes == B * H * D * DV * 2
    assert made().nbytes == (B * H * D * DV + B * H * D) * 4
    assert s.dtype == torch.float32 and s.device == torch.device("cpu")
    assert State.zeros(1, 1, 2, 2, device="meta").device.type == "meta"


def test_repr_shows_shapes_dtype_device_bytes_and_record_not_values():
    s = made("gated", "relu1")
    r = repr(s)
    assert r == ("State(S=[2, 3, 4, 6] float32, z=[2, 3, 4] float32, device=cpu, nbytes=672, rule='gated', "
                 "feature_map='relu1', normalized=True)")
    big = State.zeros(1, 8, 256, 256)
    assert len(repr(big)) < 120 and "tensor" not in repr(big) and "nbytes=2,105,344" in repr(big)
    assert repr(State(torch.zeros(1, 1, 2, 3, dtype=torch.float64))).startswith("State(S=[1, 1, 2, 3] float64, z=None")
    assert "requires_grad=True" in repr(State(torch.zeros(1, 1, 1, 1, requires_grad=True)))
    assert str(s) == r


def test_equality_is_identity():
    s = made()
    assert s == s and s != s.clone() and len({s, s}) == 1


@pytest.mark.parametrize("S,z,exc,match", [
    (torch.zeros(B, H, D, DV, dtype=torch.int64), None, TypeError, r"State.S must be a real floating-point tensor"),
    (torch.zeros(B, H, D, DV, dtype=torch.complex64), None, TypeError, r"got torch.complex64"),
    (torch.zeros(B, H, D, DV), [0.0], TypeError, r"State.z must be a torch.Tensor or None"),
])
def test_state_rejects_non_floating(S, z, exc, match):
    with pytest.raises(exc, match=match):
        State(S, z)


def test_state_rejects_bad_record():
    with pytest.raises(TypeError, match=r"State.rule must be a str or None, got int"):
        State(torch.zeros(1, 1, 1, 1), rule=1)
    with pytest.raises(TypeError, match=r"State.feature_map must be a str or None"):
        State(torch.zeros(1, 1, 1, 1), feature_map=len)
    with pytest.raises(TypeError, match=r"State.normalized must be a bool or None"):
        State(torch.zeros(1, 1, 1, 1), normalized=1)


# ---------------------------------------------------------------------------------------------------------------
# step(inplace=True): the caller's state is updated, or refused, never left stale


def _step(state, feature_map="elu1", **kw):
    q, k, v = (x[:, 0] for x in inputs(seed=3))
    return linattn.step(q, k, v, state, feature_map=feature_map, **kw)


def test_inplace_updates_a_state_made_by_linattn_where_it_lies():
    for s in (made(), made().clone(), State.zeros(B, H, D, DV)):
        expected_o, expected = _step(s.clone())
        ptr = s.S.data_ptr()
        o, s2 = _step(s, inplace=True)
        assert s2.S.data_ptr() == ptr and torch.equal(s.S, expected.S) and torch.equal(s.z, expected.z)
        assert torch.equal(o, expected_o)


def test_inplace_writes_back_into_separate_user_tensors():
    S, z = torch.rand(B, H, D, DV), torch.rand(B, H, D) + 1
    s = State(S, z)
    q, k, v = (x[:, 0] for x in inputs(seed=3))
    o_ref, S_ref, z_ref = reference_call(q[:, None], k[:, None], v[:, None], initial_state=s, feature_map="elu1")
    o, s2 = _step(s, inplace=True)
    assert s2.S is S and s2.z is z  # the caller's own tensors
    assert rel_err(S, S_ref) < 1e-6 and rel_err(z, z_ref) < 1e-6 and rel_err(o, o_ref[:, 0]) < 1e-6
    # A transposed (non-contiguous) S without z: updated where it lies too.
    St = torch.rand(B, H, DV, D).transpose(-1, -2)
    o, s3 = _step(State(St), normalize=False, inplace=True)
    assert s3.S is St


def test_inplace_refuses_what_it_cannot_update_safely():
    s = made()
    with pytest.raises(ValueError, match=r"inplace=True: state.S has overlapping .* e.g. from expand\(\)"):
        _step(State(s.S[:1].expand(s.S.shape), s.z[:1].expand(s.z.shape)), inplace=True)
    with pytest.raises(ValueError, match=r"inplace=True: state.S has overlapping"):
        _step(State(torch.zeros(1, 1, D, DV).expand(B, H, D, DV)), normalize=False, inplace=True)
    with pytest.raises(ValueError, match=r"inplace=True: the state requires grad"):
        _step(State(s.S.clone().requires_grad_(), s.z.clone()), inplace=True)
    with torch.inference_mode():
        inference = s.clone()
    with pytest.raises(ValueError, match=r"inplace=True: the state holds inference tensors"):
        _step(inference, inplace=True)
    with torch.inference_mode():  # inside inference mode it is fine
        o, s2 = _step(inference, inplace=True)
    assert s2.S.data_ptr() == inference.S.data_ptr() and torch.isfinite(o).all()
    with pytest.raises(TypeError, match=r"inplace must be a bool \(True or False\), got int"):
        _step(s, inplace=1)


# ---------------------------------------------------------------------------------------------------------------
# The layout warning, NaN gates, the meta device


def test_head_first_layout_warns_at_the_callers_line():
    q, k, v = inputs(lead=(1, 8, 200))  # [B, H, T, D] with H = 8, T = 200, passed as [B, T, H, D]
    with pytest.warns(UserWarning, match=r"fewer tokens than heads, and more heads than models have, suggests "
                                         r"\[B, H, T, D\]") as record:
        linattn.linear_attention(q, k, v)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        linattn.linear_attention(*inputs(lead=(1, 3, 64)))  # a short chunk of a prefill with many heads: fine
        linattn.linear_attention(*inputs(lead=(1, 1, 128)))  # one token, 128 heads (as DeepSeek-V3)
        linattn.linear_attention(*inputs(lead=(1, 200, 8)))
        linattn.linear_attention(*inputs())


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_nan_gate_is_an_error_and_minus_inf_is_not(rule):
    q, k, v = inputs()
    kw = {"beta": torch.full((B, T, H), 0.5)} if rule == "gated_delta" else {}
    g = torch.full((B, T, H), -0.1)
    g[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"g must be <= 0 \(alpha = exp\(g\) <= 1\); it holds NaN"):
        linattn.linear_attention(q, k, v, rule=rule, g=g, **kw)
    with pytest.raises(ValueError, match=r"it holds NaN"):
        linattn.step(q[:, 0], k[:, 0], v[:, 0], rule=rule, g=g[:, 2], **{n: x[:, 0] for n, x in kw.items()})
    g[1, 2, 0] = float("-inf")  # a full reset: allowed (the recurrent form is the definition)
    o, _ = linattn.linear_attention(q, k, v, rule=rule, g=g, form="recurrent", **kw)
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("rule", ["accumulate", "delta"])
def test_meta_tensors_run_for_ungated_rules(rule):
    q, k, v = (x.to("meta") for x in inputs())
    kw = {"beta": torch.full((B, T, H), 0.5, device="meta")} if rule == "delta" else {}
    for form in linattn.supported_forms(rule):
        o, s = linattn.linear_attention(q, k, v, rule=rule, form=form, output_final_state=True, **kw)
        assert o.device.type == "meta" and o.shape == v.shape and s.S.shape == (B, H, D, DV)
    o, s = linattn.step(q[:, 0], k[:, 0], v[:, 0], s, rule=rule, **{n: x[:, 0] for n, x in kw.items()})
    assert o.shape == (B, H, DV) and s.device.type == "meta"


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_meta_gates_are_a_clear_error(rule):
    q, k, v = (x.to("meta") for x in inputs())
    kw = {"beta": torch.full((B, T, H), 0.5, device="meta")} if rule == "gated_delta" else {}
    with pytest.raises(ValueError, match=rf"g is on the meta device: rule '{rule}' reads the gate's values"):
        linattn.linear_attention(q, k, v, rule=rule, g=torch.zeros(B, T, H, device="meta"), **kw)
