"""Every bad input gets a ValueError or TypeError whose message names the argument, never a silent broadcast."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import linattn
from linattn import State, reference

B, T, H, D, DV = 2, 5, 3, 4, 6


def qkv(dtype=torch.float32, T=T, D=D):
    gen = torch.Generator().manual_seed(0)
    q = torch.rand(B, T, H, D, generator=gen).to(dtype)
    return q, q.clone(), torch.rand(B, T, H, DV, generator=gen).to(dtype)


def g_(shape=(B, T, H), value=-0.5):
    return torch.full(shape, value)


def beta_(shape=(B, T, H)):
    return torch.full(shape, 0.5)


def call(q=None, k=None, v=None, **kwargs):
    q0, k0, v0 = qkv()
    return linattn.linear_attention(q0 if q is None else q, k0 if k is None else k, v0 if v is None else v, **kwargs)


# (description, kwargs of call(), exception, regex the message must match)
SEQUENCE_CASES = [
    ("q not 4-D", dict(q=torch.rand(B, T, D)), ValueError, r"q must be \[B, T, H, D\], got shape \(2, 5, 4\)"),
    ("k 5-D", dict(k=torch.rand(B, T, H, D, 1)), ValueError, r"k must be \[B, T, H, D\]"),
    ("v 3-D", dict(v=torch.rand(B, T, DV)), ValueError, r"v must be \[B, T, H, D\]"),
    ("q/k width differ", dict(k=torch.rand(B, T, H, D + 1)), ValueError, r"q and k must have the same shape"),
    ("q/k heads differ", dict(k=torch.rand(B, T, H + 1, D)), ValueError, r"q and k .*\(2, 5, 4, 4\)"),
    ("v length differs", dict(v=torch.rand(B, T + 1, H, DV)), ValueError, r"v must match q"),
    ("v batch differs", dict(v=torch.rand(1, T, H, DV)), ValueError, r"v must match q"),
    ("empty sequence", dict(q=torch.rand(B, 0, H, D), k=torch.rand(B, 0, H, D), v=torch.rand(B, 0, H, DV)),
     ValueError, r"T = 0"),
    ("empty value width", dict(v=torch.rand(B, T, H, 0)), ValueError, r"no empty dimension"),
    ("int q", dict(q=torch.ones(B, T, H, D, dtype=torch.int64), k=torch.ones(B, T, H, D, dtype=torch.int64),
                   v=torch.ones(B, T, H, DV, dtype=torch.int64)), TypeError, r"q must be a floating-point"),
    ("mixed dtypes", dict(v=torch.rand(B, T, H, DV, dtype=torch.float64)), TypeError, r"q, k, v must share one dtype"),
    ("numpy q", dict(q=np.ones((B, T, H, D))), TypeError, r"q must be a torch.Tensor"),
    ("mixed devices", dict(v=torch.rand(B, T, H, DV, device="meta")), ValueError, r"one device"),
    ("unknown rule", dict(rule="softmax"), ValueError, r"rule: unknown rule 'softmax'"),
    ("unknown form", dict(form="fast"), ValueError, r"form: .*'fast'.*supported forms"),
    ("delta has no parallel form", dict(rule="delta", form="parallel", beta=beta_()), ValueError,
     r"form: rule 'delta' has no form 'parallel'; supported forms: recurrent, chunk"),
    ("gated_delta has no scan form", dict(rule="gated_delta", form="scan", g=g_(), beta=beta_()), ValueError,
     r"supported forms: recurrent, chunk"),
    ("unknown feature map", dict(feature_map="softmax"), ValueError, r"feature_map: unknown name 'softmax'"),
    ("feature map of wrong type", dict(feature_map=3), TypeError, r"feature_map must be"),
    ("unknown eps_mode", dict(eps_mode="max"), ValueError, r"eps_mode: unknown mode 'max'"),
    ("negative eps", dict(eps=-1e-6), ValueError, r"eps must be a number >= 0"),
    ("nan eps", dict(eps=float("nan")), ValueError, r"eps must be a number >= 0"),
    ("scale of wrong type", dict(scale="1"), TypeError, r"scale must be a float"),
    ("chunk_size 0", dict(chunk_size=0), ValueError, r"chunk_size must be a positive int, got 0"),
    ("chunk_size float", dict(chunk_size=8.0), TypeError, r"chunk_size must be a positive int, got float"),
    ("normalize not bool", dict(normalize=1), TypeError, r"normalize must be a bool"),
    ("form unhashable", dict(form=[]), TypeError, r"form must be a str, one of recurrent, chunk"),
    ("form not a str", dict(form=None), TypeError, r"form must be a str.*got NoneType"),
    ("rule not a str", dict(rule=["gated"]), TypeError, r"rule must be a str, one of accumulate, .*got list"),
    ("feature map unhashable", dict(feature_map={}), TypeError, r"feature_map must be None, a name or a callable"),
    ("feature map returns a non-tensor", dict(feature_map=lambda x: x.tolist()), TypeError,
     r"feature_map '.*<lambda>' must return a torch.Tensor, got list"),
    ("feature map returns rank - 1", dict(feature_map=lambda x: x.sum(-1)), ValueError,
     r"must map \[\.\.\., D\] to \[\.\.\., r\] token by token, but for input \(2, 1, 3, 4\) it returned \(2, 1, 3\)"),
    ("feature map returns width 0", dict(feature_map=lambda x: x[..., :0]), ValueError,
     r"feature_map '.*' returned features of width 0"),
    ("feature map changes dtype", dict(feature_map=lambda x: x.half()), TypeError,
     r"returned torch.float16 features for torch.float32 input; it must keep the dtype"),
    ("chunk_size None", dict(chunk_size=None), TypeError, r"chunk_size must be a positive int, got NoneType"),
    ("chunk_size beyond any sequence", dict(chunk_size=2**63), ValueError, r"chunk_size must be at most 2\*\*63 - 1"),
    ("output_final_state not bool", dict(output_final_state="yes"), TypeError,
     r"output_final_state must be a bool \(True or False\), got str"),
    ("eps infinite", dict(eps=float("inf")), ValueError, r"eps must be a number >= 0 and finite"),
    ("scale NaN", dict(scale=float("nan")), ValueError, r"scale must be a finite number, got nan"),
    ("eps_mode not a str", dict(eps_mode=["add"]), TypeError, r"eps_mode must be a str"),
    ("NaN gate", dict(rule="gated", g=g_(value=float("nan"))), ValueError, r"g must be <= 0 .* it holds NaN"),
    ("meta gate", dict(q=torch.rand(B, T, H, D, device="meta"), k=torch.rand(B, T, H, D, device="meta"),
                       v=torch.rand(B, T, H, DV, device="meta"), rule="gated", g=torch.zeros(B, T, H, device="meta")),
     ValueError, r"g is on the meta device"),
    ("state_dtype not a dtype", dict(state_dtype="float64"), TypeError, r"state_dtype must be"),
    ("positive gate", dict(rule="gated", g=g_(value=0.1)), ValueError, r"g must be <= 0"),
    ("gate missing", dict(rule="gated"), ValueError, r"g: rule 'gated' needs a log-gate"),
    ("gate for accumulate", dict(g=g_()), ValueError, r"g: rule 'accumulate' has no gate"),
    ("gate for delta", dict(rule="delta", g=g_(), beta=beta_()), ValueError, r"g: rule 'delta' has no gate"),
    ("gate shape not broadcast", dict(rule="gated", g=g_((B, T, 1))), ValueError, r"g must have shape"),
    ("gate per channel wrong width", dict(rule="gated", g=g_((B, T, H, D + 1))), ValueError, r"g must have shape"),
    ("per-channel gate wrong width for gated_delta", dict(rule="gated_delta", g=g_((B, T, H, D + 1)), beta=beta_()),
     ValueError, r"g must have shape \[2, 5, 3\] or \[2, 5, 3, 4\] for rule 'gated_delta'"),
    ("v heads not a multiple", dict(v=torch.rand(B, T, H + 1, DV)), ValueError, r"multiple of q's H heads"),
    ("int gate", dict(rule="gated", g=torch.zeros(B, T, H, dtype=torch.int64)), TypeError, r"g must be a floating"),
    ("gate not a tensor", dict(rule="gated", g=-0.5), TypeError, r"g must be a torch.Tensor"),
    ("gate on another device", dict(rule="gated", g=torch.zeros(B, T, H, device="meta")), ValueError, r"g is on meta"),
    ("beta missing", dict(rule="delta"), ValueError, r"beta: rule 'delta' needs a write strength"),
    ("beta for gated", dict(rule="gated", g=g_(), beta=beta_()), ValueError, r"beta: rule 'gated' has no write"),
    ("beta shape", dict(rule="delta", beta=beta_((B, T, 1))), ValueError, r"beta must have shape \[2, 5, 3\]"),
    ("beta per channel", dict(rule="delta", beta=beta_((B, T, H, 1))), ValueError, r"beta must have shape"),
    ("normalize with delta", dict(rule="delta", beta=beta_(), normalize=True), ValueError,
     r"normalize=True: rule 'delta' defines no normalizer"),
    ("normalize with gated_delta", dict(rule="gated_delta", g=g_(), beta=beta_(), normalize=True), ValueError,
     r"normalize=True"),
    ("initial_state not a State", dict(initial_state=torch.zeros(B, H, D, DV)), TypeError,
     r"initial_state must be a linattn.State"),
    ("initial_state S shape", dict(initial_state=State(torch.zeros(B, H, D, DV + 1), torch.zeros(B, H, D))),
     ValueError, r"initial_state.S must be \[B, H, Dk, Dv\] = \(2, 3, 4, 6\), got \(2, 3, 4, 7\)"),
    ("initial_state z missing", dict(initial_state=State(torch.zeros(B, H, D, DV))), ValueError,
     r"initial_state.z is None"),
    ("initial_state z without normalizer", dict(normalize=False, initial_state=State.zeros(B, H, D, DV)),
     ValueError, r"initial_state.z is set"),
    ("initial_state width after feature map", dict(feature_map="taylor2", initial_state=State.zeros(B, H, D, DV)),
     ValueError, r"initial_state.S must be \[B, H, Dk, Dv\] = \(2, 3, 21, 6\)"),
    ("sparse gate", dict(rule="gated", g=g_().to_sparse()), ValueError,
     r"g must be a dense \(strided\) tensor, got layout torch.sparse_coo"),
    ("sparse beta", dict(rule="delta", beta=beta_().to_sparse()), ValueError, r"beta must be a dense \(strided\)"),
    ("sparse q", dict(q=torch.rand(B, T, H, D).to_sparse()), ValueError, r"q must be a dense \(strided\) tensor"),
    ("sparse v", dict(v=torch.rand(B, T, H, DV).to_sparse()), ValueError, r"v must be a dense \(strided\) tensor"),
    ("sparse initial_state", dict(normalize=False, initial_state=State(torch.zeros(B, H, D, DV).to_sparse())),
     ValueError, r"initial_state.S must be a dense \(strided\) tensor"),
]


@pytest.mark.parametrize("kwargs,exc,match", [c[1:] for c in SEQUENCE_CASES], ids=[c[0] for c in SEQUENCE_CASES])
def test_linear_attention_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)


def _gates(dtype, bad=None, where=(0, 3, 1)):
    g = torch.full((B, T, H), -0.25, dtype=dtype)
    if bad is not None:
        g[where] = bad
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad, match", [(None, None), (0.0, None), (0.5, "largest value 0.5"),
                                        (float("nan"), "it holds NaN"), (float("inf"), "largest value inf")])
@pytest.mark.parametrize("view", ["contiguous", "transposed", "requires_grad"])
def test_gate_value_check_on_every_path(dtype, bad, match, view):
    """The g <= 0 check reads float32/float64 CPU gates through NumPy and others through torch: the same verdict
    and message either way, for any layout, with or without autograd; a single bad entry anywhere is found."""
    g = _gates(dtype, bad)
    if view == "transposed":  # same values, non-contiguous strides
        g = g.transpose(1, 2).contiguous().transpose(1, 2)
    if view == "requires_grad":
        g.requires_grad_(True)
    kw = dict(rule="gated", g=g)
    if match is None:
        o, _ = call(**kw)
        assert torch.isfinite(o).all()
    else:
        with pytest.raises(ValueError, match=r"g must be <= 0 .*" + match):
            call(**kw)


def test_gate_value_check_falls_back_to_torch():
    """Gates NumPy cannot view (a negative-bit view, which ``.numpy()`` refuses) are checked by torch."""
    from linattn import checks

    good, bad = (torch._neg_view(_gates(torch.float32, x).neg()) for x in (None, 0.5))
    with pytest.raises(RuntimeError):
        good.numpy()
    assert checks._all_nonpositive(good) and not checks._all_nonpositive(bad)


@pytest.mark.parametrize("dtype, torch_reduces", [(torch.float32, False), (torch.float64, False),
                                                   (torch.bfloat16, True)])
def test_gate_value_check_skips_torch_for_float_cpu_gates(dtype, torch_reduces, monkeypatch):
    """float32/float64 CPU gates are checked without a torch reduction (which would wake torch's OpenMP threads
    right before a compiled kernel); other dtypes keep torch's."""
    from linattn import checks

    def refuse(*a, **kw):
        raise AssertionError("torch reduction")

    monkeypatch.setattr(torch.Tensor, "all", refuse)
    g = _gates(dtype)
    if torch_reduces:
        with pytest.raises(AssertionError, match="torch reduction"):
            checks.check_gate_and_beta("gated", g, None, (B, T, H), D, g.device)
    else:
        checks.check_gate_and_beta("gated", g, None, (B, T, H), D, g.device)
        with pytest.raises(ValueError, match="largest value 0.5"):
            checks.check_gate_and_beta("gated", _gates(dtype, 0.5), None, (B, T, H), D, g.device)


@pytest.mark.parametrize("form", ["recurrent", "chunk", "parallel", "scan"])
def test_every_form_validates(form):
    """Validation is shared, not per form: a few errors through each form."""
    with pytest.raises(ValueError, match="q and k must have the same shape"):
        call(k=torch.rand(B, T, H, D + 1), form=form)
    with pytest.raises(ValueError, match="g must be <= 0"):
        call(rule="gated", g=g_(value=1e-3), form=form)
    with pytest.raises(ValueError, match="chunk_size"):
        call(form=form, chunk_size=-1)


def step_call(q=None, k=None, v=None, state=None, **kwargs):
    q0 = torch.rand(B, H, D)
    return linattn.step(q0 if q is None else q, q0 if k is None else k, torch.rand(B, H, DV) if v is None else v,
                        state, **kwargs)


STEP_CASES = [
    ("sequence q", dict(q=torch.rand(B, 1, H, D)), ValueError, r"q must be \[B, H, D\], got shape \(2, 1, 3, 4\)"),
    ("k width", dict(k=torch.rand(B, H, D + 1)), ValueError, r"q and k must have the same shape \[B, H, D\]"),
    ("v heads", dict(v=torch.rand(B, H + 1, DV)), ValueError, r"v must match q"),
    ("int q", dict(q=torch.ones(B, H, D, dtype=torch.int32)), TypeError, r"q must be a floating-point"),
    ("mixed dtypes", dict(v=torch.rand(B, H, DV, dtype=torch.float64)), TypeError, r"share one dtype"),
    ("state shape", dict(state=State.zeros(B, H, D + 1, DV)), ValueError, r"state.S must be \[B, H, Dk, Dv\]"),
    ("state without z", dict(state=State(torch.zeros(B, H, D, DV))), ValueError, r"state.z is None"),
    ("state not a State", dict(state=torch.zeros(B, H, D, DV)), TypeError, r"must be a linattn.State"),
    ("gate shape", dict(rule="gated", g=torch.full((B, H, 1), -0.1)), ValueError, r"g must have shape \[2, 3\]"),
    ("sequence gate", dict(rule="gated", g=g_()), ValueError, r"g must have shape"),
    ("positive gate", dict(rule="gated", g=torch.full((B, H), 0.5)), ValueError, r"g must be <= 0"),
    ("beta missing", dict(rule="delta"), ValueError, r"beta: rule 'delta' needs"),
    ("beta shape", dict(rule="delta", beta=torch.full((B, H, 1), 0.5)), ValueError, r"beta must have shape \[2, 3\]"),
    ("unknown rule", dict(rule="deltanet"), ValueError, r"rule: unknown rule"),
    ("negative eps", dict(eps=-1.0), ValueError, r"eps must be"),
    ("unknown eps_mode", dict(eps_mode="floor"), ValueError, r"eps_mode"),
    ("inplace not bool", dict(inplace=None), TypeError, r"inplace must be a bool"),
    ("state of another rule", dict(state=State(torch.zeros(B, H, D, DV), torch.zeros(B, H, D), rule="gated")),
     ValueError, r"state was made by rule 'gated' but this call uses rule='accumulate'"),
    ("state of another feature map", dict(state=State(torch.zeros(B, H, D, DV), torch.zeros(B, H, D),
                                                      feature_map="relu1")),
     ValueError, r"state was made with feature_map 'relu1' but this call uses 'identity'"),
    ("state_dtype False", dict(state_dtype=False), TypeError, r"state_dtype must be a floating torch.dtype"),
    ("sparse gate", dict(rule="gated", g=torch.full((B, H), -0.1).to_sparse()), ValueError,
     r"g must be a dense \(strided\) tensor, got layout torch.sparse_coo; pass g.to_dense\(\)"),
    ("sparse k", dict(k=torch.rand(B, H, D).to_sparse()), ValueError, r"k must be a dense \(strided\) tensor"),
    ("sparse state.z", dict(state=State(torch.zeros(B, H, D, DV), torch.zeros(B, H, D).to_sparse())), ValueError,
     r"state.z must be a dense \(strided\) tensor"),
    ("inplace with another dtype", dict(state=State.zeros(B, H, D, DV, dtype=torch.float64), state_dtype=torch.float32,
                                        inplace=True), ValueError, r"inplace=True needs the state in torch.float32"),
]


@pytest.mark.parametrize("kwargs,exc,match", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_step_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        step_call(**kwargs)


def test_state_rejects():
    with pytest.raises(ValueError, match=r"State.S must be \[B, H, Dk, Dv\]"):
        State(torch.zeros(H, D, DV))
    with pytest.raises(ValueError, match=r"State.z must be \[B, H, Dk\] = \(2, 3, 4\)"):
        State(torch.zeros(B, H, D, DV), torch.zeros(B, H, D + 1))
    with pytest.raises(ValueError, match=r"State.z .* must match S"):
        State(torch.zeros(B, H, D, DV), torch.zeros(B, H, D, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"State.S must be a torch.Tensor"):
        State(np.zeros((B, H, D, DV)))


def test_supported_forms_rejects_unknown_rule():
    with pytest.raises(ValueError, match=r"rule: unknown rule 'linear'"):
        linattn.supported_forms("linear")


# ---------------------------------------------------------------------------------------------------------------
# The reference.


@pytest.mark.parametrize("x,match", [
    (np.ones(3), r"x must be a 2-D array \[T, D\], got shape \(3,\)"),
    (np.ones((2, 3, 4)), r"x must be a 2-D array .*\(2, 3, 4\)"),
    (np.ones((0, 3)), r"x must be non-empty, got shape \(0, 3\)"),
    (np.ones((3, 0)), r"x must be non-empty"),
])
def test_positive_feature_map_rejects(x, match):
    with pytest.raises(ValueError, match=match):
        reference.positive_feature_map(x)


def test_positive_feature_map_rejects_non_numeric():
    with pytest.raises(TypeError, match=r"x must be a real numeric array, got dtype bool"):
        reference.positive_feature_map(np.ones((2, 2), dtype=bool))


@pytest.mark.parametrize("args,match", [
    ((np.ones((4, 2)), np.ones((4, 3)), np.ones((4, 1))), r"queries and keys must have the same shape"),
    ((np.ones((4, 2)), np.ones((3, 2)), np.ones((4, 1))), r"queries and keys must have the same shape"),
    ((np.ones(4), np.ones(4), np.ones((4, 1))), r"queries must be a 2-D array"),
    ((np.ones((4, 2)), np.ones((4, 2, 1)), np.ones((4, 1))), r"keys must be a 2-D array"),
    ((np.ones((4, 2)), np.ones((4, 2)), np.ones(4)), r"values must be a 2-D array"),
    ((np.ones((4, 2)), np.ones((4, 2)), np.ones((5, 1))), r"values must have the same length T"),
    ((np.ones((0, 2)), np.ones((0, 2)), np.ones((0, 1))), r"queries must be non-empty, got shape \(0, 2\)"),
])
def test_linear_attention_scan_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        reference.linear_attention_scan(*args)


def ref_call(**kwargs):
    q = kwargs.pop("q", np.ones((B, T, H, D)))
    k = kwargs.pop("k", np.ones((B, T, H, D)))
    v = kwargs.pop("v", np.ones((B, T, H, DV)))
    return reference.linear_attention(q, k, v, **kwargs)


REFERENCE_CASES = [
    (dict(q=np.ones((B, T, D))), ValueError, r"q must be \[B, T, H, D\]"),
    (dict(k=np.ones((B, T, H, D + 1))), ValueError, r"q and k must have the same shape"),
    (dict(v=np.ones((B, T + 1, H, DV))), ValueError, r"v must match q"),
    (dict(q=np.ones((B, 0, H, D)), k=np.ones((B, 0, H, D)), v=np.ones((B, 0, H, DV))), ValueError, r"T = 0"),
    (dict(q=np.ones((B, T, H, D), dtype=complex)), TypeError, r"q must be a real numeric array"),
    (dict(rule="softmax"), ValueError, r"rule: unknown rule"),
    (dict(feature_map="exp"), ValueError, r"feature_map: unknown name"),
    (dict(eps=-1.0), ValueError, r"eps must be a number >= 0"),
    (dict(eps_mode="max"), ValueError, r"eps_mode"),
    (dict(rule="gated"), ValueError, r"g: rule 'gated' needs"),
    (dict(rule="gated", g=np.full((B, T, H), 0.5)), ValueError, r"g must be <= 0"),
    (dict(rule="gated", g=np.zeros((B, T, 1))), ValueError, r"g must have shape"),
    (dict(rule="gated_delta", g=np.zeros((B, T, H, D + 1)), beta=np.ones((B, T, H))), ValueError, r"g must have shape"),
    (dict(g=np.zeros((B, T, H))), ValueError, r"g: rule 'accumulate' has no gate"),
    (dict(rule="delta"), ValueError, r"beta: rule 'delta' needs"),
    (dict(rule="delta", beta=np.ones((B, T))), ValueError, r"beta must have shape"),
    (dict(beta=np.ones((B, T, H))), ValueError, r"beta: rule 'accumulate' has no write"),
    (dict(rule="delta", beta=np.ones((B, T, H)), normalize=True), ValueError, r"normalize=True"),
    (dict(initial_S=np.zeros((B, H, D, DV))), ValueError, r"initial_z is None"),
    (dict(initial_S=np.zeros((B, H, D + 1, DV)), initial_z=np.zeros((B, H, D + 1))), ValueError,
     r"initial_S must be \[B, H, Dk, Dv\]"),
    (dict(initial_S=np.zeros((B, H, D, DV)), initial_z=np.zeros((B, H))), ValueError, r"initial_z must be"),
    (dict(normalize=False, initial_S=np.zeros((B, H, D, DV)), initial_z=np.zeros((B, H, D))), ValueError,
     r"initial_z is set"),
]


@pytest.mark.parametrize("kwargs,exc,match", REFERENCE_CASES, ids=[c[2] for c in REFERENCE_CASES])
def test_reference_linear_attention_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ref_call(**kwargs)
