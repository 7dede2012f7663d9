"""Every rule in every form against the float64 NumPy reference, on random shapes, gates, chunk sizes and scales.

Errors are measured as ``max |o - o_ref| / max(1, max |o_ref|)`` (absolute for outputs of order one, relative for
large ones), the same for the final state. The reference always runs in float64 on the very inputs the torch call
saw (after rounding them to the input dtype), so only the kernel's own arithmetic is measured.

Tolerances follow the arithmetic (docs/testing.md has the derivation and the measurements): for inputs and output
in a dtype of unit roundoff ``u_io`` and a state accumulated in a dtype of roundoff ``u_acc``,

    tol = 2 u_io + 8 u_acc (kappa sqrt(T) + |G|max)

``2 u_io``: the output is rounded once to the input dtype (float64 inputs: u_io = 0). ``sqrt(T)``: sums of T
terms. ``kappa``: the size of the terms summed over the size of the result: 1 for normalized rules with
positive features (nothing cancels), the cancellation in phi(q).phi(k) for the Taylor map (its features can be
negative). ``|G|max``: the largest cumulative log-gate; a difference G_i - G_j of two such sums
carries an absolute error ~ |G| u_acc, which the exponent turns into a relative error. For signed outputs (delta
rules, ``normalize=False``) kappa is |phi(q)| |phi(k)| |v| over the output's size. Over 2,400
random cases per dtype of this module's distribution (T = 2 to 70, every form; scripts/tolerance_survey.py) the
worst error was 0.49 of this tolerance for float64, float32, bfloat16 inputs and float32 inputs with a float64
state alike.

Delta rules are drawn with keys of norm 0.3 or 1 and beta in (0, 1.5), so beta |k|^2 < 2 (the write converges);
gates are drawn near 0 (g down to -30, alpha ~ 1e-13), near 1 (g ~ -1e-4) and across the whole range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import n_examples, np64, numpy_twin, reference_call, rel_err
from hypothesis import given, settings

import linattn
from linattn import State, reference
from linattn.feature_maps import resolve_feature_map, taylor2

pytestmark = pytest.mark.usefixtures("torch_forms")  # these check the torch forms themselves

RULES = ("accumulate", "gated", "delta", "gated_delta")
NORMALIZED_RULES = ("accumulate", "gated")
U = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
GATE_RANGES = {"near_zero": (5.0, 30.0), "near_one": (1e-4, 1e-3), "wide": (1e-4, 30.0)}  # -g drawn log-uniform


@numpy_twin(reference.softplus)
def softplus_map(x: torch.Tensor) -> torch.Tensor:
    """A user-supplied callable: positive features, for the normalized rules.

    (torch's default threshold=20 returns x itself above 20, off by log1p(exp(-20)) ~ 2e-9 from softplus; 50 puts
    that below float64 resolution, so the NumPy twin computes the same function.)
    """
    return F.softplus(x, threshold=50.0)


@numpy_twin(reference.l2_normalize)
def l2_map(x: torch.Tensor) -> torch.Tensor:
    """A user-supplied callable for the delta rules: unit-norm keys, as DeltaNet normalizes them."""
    return x / x.norm(dim=-1, keepdim=True)


@dataclass
class Case:
    rule: str
    B: int
    H: int
    T: int
    Dk: int
    Dv: int
    chunk_size: int
    feature_map: object
    per_channel: bool
    gate_range: str
    key_norm: float
    input_scale: float
    with_initial: bool
    eps: float
    eps_mode: str
    seed: int
    group: int = 1  # value heads per q/k head (grouped value heads: v, g, beta and the state have H * group)

    def feature_width(self) -> int:
        return 1 + self.Dk + self.Dk**2 if self.feature_map == "taylor2" else self.Dk


@st.composite
def cases(draw, rule: str) -> Case:
    normalized = rule in NORMALIZED_RULES
    per_channel = rule in ("gated", "gated_delta") and draw(st.booleans())  # GLA / Kimi Delta Attention
    maps = [None, "relu1", "elu1", "identity", "taylor2", softplus_map] if normalized else [None, "identity", l2_map]
    if per_channel and normalized:
        # Taylor features have negative components: only phi(q).phi(k) > 0 is guaranteed, and a different decay per
        # feature channel breaks that sum, so q^T z can reach 0 and the output is undefined (inf/NaN) in every form.
        maps.remove("taylor2")
    feature_map = draw(st.sampled_from(maps))
    return Case(
        rule=rule,
        B=draw(st.integers(1, 3)),
        H=draw(st.integers(1, 3)),
        T=draw(st.integers(1, 70)),
        Dk=draw(st.integers(1, 4 if feature_map == "taylor2" else 9)),
        Dv=draw(st.integers(1, 9)),
        chunk_size=draw(st.sampled_from([1, 3, 8, 16, 64])),
        feature_map=feature_map,
        per_channel=per_channel,
        gate_range=draw(st.sampled_from(sorted(GATE_RANGES))),
        key_norm=draw(st.sampled_from([0.3, 1.0])),
        input_scale=draw(st.sampled_from([0.1, 1.0, 5.0])),
        with_initial=draw(st.booleans()),
        eps=draw(st.sampled_from([0.0, 1e-6])),
        eps_mode=draw(st.sampled_from(["add", "clamp"])),
        seed=draw(st.integers(0, 2**31 - 1)),
        group=draw(st.sampled_from([1, 1, 2, 3])),
    )


def make_inputs(case: Case, dtype: torch.dtype = torch.float64) -> tuple[tuple, dict]:
    """(q, k, v) and the keyword arguments of ``linattn.linear_attention`` for ``case``, in ``dtype``."""
    gen = torch.Generator().manual_seed(case.seed)
    shape = (case.B, case.T, case.H, case.Dk)
    normalized = case.rule in NORMALIZED_RULES

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64)

    if normalized and case.feature_map in (None, "identity"):
        # q, k are the features: keep them positive so the denominator q^T z is too.
        q = torch.rand(*shape, generator=gen, dtype=torch.float64) * case.input_scale
        k = torch.rand(*shape, generator=gen, dtype=torch.float64) * case.input_scale
    else:
        q, k = randn(*shape) * case.input_scale, randn(*shape) * case.input_scale
    if not normalized and case.feature_map is not l2_map:
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-12) * case.key_norm
    HV = case.H * case.group
    v = randn(case.B, case.T, HV, case.Dv) * case.input_scale
    kwargs = {"rule": case.rule, "feature_map": case.feature_map, "chunk_size": case.chunk_size}
    if normalized:
        kwargs.update(eps=case.eps, eps_mode=case.eps_mode)
    r = case.feature_width()
    if case.rule in ("gated", "gated_delta"):
        lo, hi = GATE_RANGES[case.gate_range]
        gshape = (case.B, case.T, HV) + ((r,) if case.per_channel else ())
        u = torch.rand(*gshape, generator=gen, dtype=torch.float64)
        kwargs["g"] = -torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
    if case.rule in ("delta", "gated_delta"):
        kwargs["beta"] = torch.rand(case.B, case.T, HV, generator=gen, dtype=torch.float64) * 1.5
    if case.with_initial:
        S0 = randn(case.B, HV, r, case.Dv)
        z0 = torch.rand(case.B, HV, r, generator=gen, dtype=torch.float64) + 0.5 if normalized else None
        if normalized and case.feature_map == "taylor2":
            # Taylor features have negative components: only phi(q).phi(k) > 0 is guaranteed, so a positive z0 can
            # still give q^T z0 <= 0. A z0 that is a sum of key features, as a real state's is, keeps q^T z0 > 0.
            # (Any value head's z0 is read by its q/k head's queries, so every head gets such a sum.)
            z0 = taylor2(randn(case.B, HV, 3, case.Dk) * case.input_scale).sum(dim=-2)
        kwargs["initial_state"] = State(S0, z0)
    cast = {name: x.to(dtype) for name, x in kwargs.items() if isinstance(x, torch.Tensor)}
    kwargs.update(cast)
    return (q.to(dtype), k.to(dtype), v.to(dtype)), kwargs


def tolerance(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kwargs: dict, o_ref,
              state_dtype: torch.dtype | None = None) -> float:
    """2 u_io + 8 u_acc (kappa sqrt(T) + |G|max) for ``case`` on these inputs (see the module docstring)."""
    acc = state_dtype or (torch.float64 if q.dtype == torch.float64 else torch.float32)
    u_io = 0.0 if q.dtype == torch.float64 else U[q.dtype]
    normalized = kwargs.get("normalize", case.rule in NORMALIZED_RULES)
    fmap = resolve_feature_map(case.feature_map)
    fq, fk = (x.double() if fmap is None else fmap(x.double()) for x in (q, k))
    qk = float(fq.norm(dim=-1).max() * fk.norm(dim=-1).max())  # the largest |phi(q).phi(k)| can be
    if normalized and case.feature_map == "taylor2":
        # a weight phi(q).phi(k) = 1 + s + s^2/2 >= 1/2 is a sum of terms of size <= 1 + r + r^2/2, r = |q||k|/sqrt(D)
        r = float(q.double().norm(dim=-1).max() * k.double().norm(dim=-1).max()) / math.sqrt(case.Dk)
        kappa = 2 * (1 + r + r * r / 2)
    elif normalized:
        kappa = 1.0  # positive weights: the output is an average of the values, nothing cancels
    else:
        # o = S^T q, a signed sum: terms up to |phi(q)| |phi(k)| |v| (or |phi(q)| |S_0|) against the output's size
        state = kwargs.get("initial_state")
        v_max = max(float(v.double().abs().max()), 0.0 if state is None else float(state.S.double().abs().max()))
        kappa = max(1.0, max(qk, float(fq.norm(dim=-1).max())) * v_max / max(1.0, float(np.abs(o_ref).max())))
    g = kwargs.get("g")
    G = 0.0 if g is None else float(g.double().cumsum(dim=1).abs().max())
    return 2 * u_io + 8 * U[acc] * (kappa * math.sqrt(case.T) + G)


def check_all_forms(case: Case, dtype: torch.dtype, **extra) -> None:
    (q, k, v), kwargs = make_inputs(case, dtype)
    kwargs.update(extra)
    o_ref, S_ref, z_ref = reference_call(q, k, v, **kwargs)
    tol = tolerance(case, q, k, v, kwargs, o_ref, kwargs.get("state_dtype"))
    for form in linattn.supported_forms(case.rule):
        o, state = linattn.linear_attention(q, k, v, form=form, output_final_state=True, **kwargs)
        assert o.dtype == v.dtype and o.shape == v.shape
        errors = {"o": rel_err(o, o_ref), "S": rel_err(state.S, S_ref)}
        if z_ref is None:
            assert state.z is None
        else:
            errors["z"] = rel_err(state.z, z_ref)
        worst = max(errors.values())
        assert worst <= tol, f"{case.rule}/{form} {dtype}: errors {errors} > {tol:.2e} for {case}"


# ---------------------------------------------------------------------------------------------------------------
# Random cases.


@pytest.mark.parametrize("rule", RULES)
@settings(max_examples=n_examples(30))
@given(data=st.data())
def test_every_form_matches_reference_float64(rule, data):
    check_all_forms(data.draw(cases(rule)), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("rule", RULES)
@settings(max_examples=n_examples(8))
@given(data=st.data())
def test_every_form_low_precision_within_tolerance(rule, dtype, data):
    case = data.draw(cases(rule))
    if dtype == torch.bfloat16:
        # bfloat16 keeps 8 bits: exclude exact division by tiny denominators, which no tolerance can bound.
        case.eps, case.eps_mode = 1e-6, "add"
    check_all_forms(case, dtype)


@pytest.mark.parametrize("rule", RULES)
@settings(max_examples=n_examples(6))
@given(data=st.data())
def test_state_dtype_float64_with_float32_inputs(rule, data):
    case = data.draw(cases(rule))
    check_all_forms(case, torch.float32, state_dtype=torch.float64)
    (q, k, v), kwargs = make_inputs(case, torch.float32)
    o, state = linattn.linear_attention(q, k, v, output_final_state=True, state_dtype=torch.float64, **kwargs)
    assert o.dtype == torch.float32 and state.S.dtype == torch.float64


@pytest.mark.parametrize("rule", RULES)
@settings(max_examples=n_examples(15))
@given(data=st.data(), split=st.floats(0.0, 1.0), inplace=st.booleans())
def test_prefill_chunk_then_step_equals_one_pass(rule, data, split, inplace):
    case = data.draw(cases(rule))
    (q, k, v), kwargs = make_inputs(case)
    o_full, s_full = linattn.linear_attention(q, k, v, form="chunk", output_final_state=True, **kwargs)
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    tol = tolerance(case, q, k, v, kwargs, o_ref)
    P = min(int(split * case.T), case.T - 1)  # prefill P tokens (maybe none), decode the rest one by one
    per_token = {name: kwargs.pop(name) for name in ("g", "beta") if name in kwargs}
    kwargs.pop("chunk_size")
    state = kwargs.pop("initial_state", None)
    outs = []
    if P:
        o_pre, state = linattn.linear_attention(q[:, :P], k[:, :P], v[:, :P], form="chunk", initial_state=state,
                                                output_final_state=True, chunk_size=case.chunk_size,
                                                **{n: x[:, :P] for n, x in per_token.items()}, **kwargs)
        outs.append(o_pre)
    for t in range(P, case.T):
        o_t, state = linattn.step(q[:, t], k[:, t], v[:, t], state, inplace=inplace and state is not None,
                                  **{n: x[:, t] for n, x in per_token.items()}, **kwargs)
        outs.append(o_t[:, None])
    o = torch.cat(outs, dim=1)
    assert rel_err(o, np64(o_full)) <= tol and rel_err(state.S, np64(s_full.S)) <= tol
    assert rel_err(o, o_ref) <= tol and rel_err(state.S, S_ref) <= tol
    if s_full.z is not None:
        assert rel_err(state.z, np64(s_full.z)) <= tol


# ---------------------------------------------------------------------------------------------------------------
# Fixed cases, so every option is covered on every run whatever hypothesis draws.


def fixed_case(rule: str, feature_map, **changes) -> Case:
    base = dict(rule=rule, B=2, H=2, T=37, Dk=3, Dv=5, chunk_size=8, feature_map=feature_map, per_channel=False,
                gate_range="wide", key_norm=1.0, input_scale=1.0, with_initial=True, eps=1e-6, eps_mode="add",
                seed=7)
    base.update(changes)
    return Case(**base)


@pytest.mark.parametrize("feature_map", ["relu1", "elu1", "identity", "taylor2", softplus_map, None],
                         ids=["relu1", "elu1", "identity", "taylor2", "callable", "none"])
@pytest.mark.parametrize("rule", NORMALIZED_RULES)
def test_feature_maps_every_form(rule, feature_map):
    check_all_forms(fixed_case(rule, feature_map), torch.float64)
    if rule == "gated":
        check_all_forms(fixed_case(rule, feature_map, per_channel=True), torch.float64)


@pytest.mark.parametrize("feature_map", ["identity", l2_map, "taylor2"], ids=["identity", "callable", "taylor2"])
@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_delta_feature_maps_every_form(rule, feature_map):
    # taylor2 keys are not unit-norm: a small input scale keeps beta |phi(k)|^2 moderate over 37 tokens.
    scale = 0.3 if feature_map == "taylor2" else 1.0
    check_all_forms(fixed_case(rule, feature_map, input_scale=scale), torch.float64)


@pytest.mark.parametrize("rule", NORMALIZED_RULES)
def test_eps_add_and_clamp_are_different_functions_in_every_form(rule):
    """A tiny query scale makes q^T z << eps: 'add' and 'clamp' then give different outputs, each as defined."""
    case = fixed_case(rule, "relu1")
    (q, k, v), kwargs = make_inputs(case)
    tol = tolerance(case, q, k, v, kwargs, None)
    kwargs.update(eps=1e-6, scale=1e-9)
    kwargs.pop("eps_mode")
    results = {}
    for mode in ("add", "clamp"):
        o_ref, _, _ = reference_call(q, k, v, eps_mode=mode, **kwargs)
        for form in linattn.supported_forms(rule):
            o, _ = linattn.linear_attention(q, k, v, form=form, eps_mode=mode, **kwargs)
            assert rel_err(o, o_ref) <= tol, (mode, form)
        results[mode] = o_ref
    assert rel_err(results["add"], results["clamp"]) > 1e-3


@pytest.mark.parametrize("rule", NORMALIZED_RULES)
def test_normalize_false_every_form(rule):
    case = fixed_case(rule, "elu1", with_initial=False)
    check_all_forms(case, torch.float64, normalize=False)
    (q, k, v), kwargs = make_inputs(case)
    o, state = linattn.linear_attention(q, k, v, normalize=False, output_final_state=True, **kwargs)
    assert state.z is None
    # Unnormalized outputs grow with the history; normalized ones stay at the scale of v.
    o_norm, _ = linattn.linear_attention(q, k, v, **kwargs)
    assert o.abs().max() > 3 * o_norm.abs().max()
    initial = State(torch.randn(2, 2, 3, 5, dtype=torch.float64))
    check_all_forms(case, torch.float64, normalize=False, initial_state=initial)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rule", RULES)
def test_output_dtype_is_value_dtype(rule, dtype):
    (q, k, v), kwargs = make_inputs(fixed_case(rule, "identity" if rule in ("delta", "gated_delta") else "elu1"),
                                    dtype)
    for form in linattn.supported_forms(rule):
        o, state = linattn.linear_attention(q, k, v, form=form, output_final_state=True, **kwargs)
        assert o.dtype == dtype and torch.isfinite(o).all()
        assert state.S.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    o, state = linattn.step(q[:, 0], k[:, 0], v[:, 0], rule=rule, feature_map=kwargs["feature_map"],
                            **{n: kwargs[n][:, 0] for n in ("g", "beta") if n in kwargs})
    assert o.dtype == dtype


@pytest.mark.parametrize("dtype,x", [(torch.float64, -40.0), (torch.float32, -20.0), (torch.bfloat16, -12.0)],
                         ids=["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("feature_map", ["relu1", "elu1", "taylor2"])
def test_one_token_reads_back_its_value(feature_map, dtype, x):
    """Normalized attention over a single token returns that token's value for any key (eps = 0).

    A strictly positive map must stay positive in every dtype: computing elu(x) + 1 as (exp(x) - 1) + 1 cancels
    to 0 for very negative x, and 0 / 0 then replaces the value.
    """
    k = torch.full((1, 1, 2, 3), x, dtype=dtype)
    v = torch.tensor([1.5, -2.0, 0.25, 3.0], dtype=dtype).reshape(1, 1, 2, 2)
    o, _ = linattn.linear_attention(torch.zeros_like(k), k, v, feature_map=feature_map, eps=0.0)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    assert rel_err(o, np64(v)) <= tol, f"{feature_map}: one token read back {o.flatten().tolist()}"


@pytest.mark.parametrize("rule", RULES)
def test_nan_reaches_later_tokens_and_spares_earlier_chunks(rule):
    """A NaN value at token t makes every output from t on NaN; outputs before t stay finite in the token-causal
    forms (recurrent, scan), and before t's chunk in the chunk form (inside a chunk the masked product 0 * NaN is
    NaN). The parallel form is one chunk of length T."""
    T, C, bad = 12, 4, 6
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.rand(1, T, 2, 3, generator=gen) for _ in range(3))
    v[0, bad] = float("nan")
    kwargs = {"g": torch.full((1, T, 2), -0.1)} if rule in ("gated", "gated_delta") else {}
    if rule in ("delta", "gated_delta"):
        kwargs["beta"] = torch.full((1, T, 2), 0.5)
    for form in linattn.supported_forms(rule):
        o, state = linattn.linear_attention(q, k, v, rule=rule, form=form, chunk_size=C, output_final_state=True,
                                            **kwargs)
        nan = torch.isnan(o).any(dim=(0, 2, 3))
        assert nan[bad:].all() and torch.isnan(state.S).any(), form
        clean_before = {"chunk": bad // C * C, "parallel": 0}.get(form, bad)
        assert not nan[:clean_before].any(), f"{rule}/{form}: NaN at token {bad} reached earlier outputs"


@pytest.mark.parametrize(
    ("rule", "form"),
    [(rule, form) for rule in linattn.RULES for form in linattn.supported_forms(rule)],
)
def test_final_state_owns_only_its_own_memory(rule, form):
    """The returned state must not be a view into per-chunk or per-token buffers that it would keep alive."""
    B, T, H, D = 1, 37, 2, 4
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(B, T, H, D, generator=gen) for _ in range(3))
    extra = {}
    if rule in ("gated", "gated_delta"):
        extra["g"] = -torch.rand(B, T, H, generator=gen)
    if rule in ("delta", "gated_delta"):
        extra["beta"] = torch.rand(B, T, H, generator=gen)
    _, state = linattn.linear_attention(q, k, v, rule=rule, form=form, output_final_state=True, chunk_size=8, **extra)
    for t in (state.S, state.z):
        if t is not None:
            assert t.untyped_storage().nbytes() <= state.nbytes
