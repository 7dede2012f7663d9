"""The one-call decode path of ``linattn.step`` (kernels/cpu_decode.py) against the float64 reference.

Each case prefills a few tokens (giving a state linattn made, with its record), then decodes the rest one token
at a time and compares every output and the final state with the reference over the whole sequence. A spy on
the compiled entry proves which path ran: the plain case must take it, everything else must not (and still be
right). Sizes are awkward: odd widths, Dk != Dv, B and H > 1, grouped value heads; gates near 0, near 1, -inf.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State

pytest.importorskip("numba")
from linattn.kernels import cpu_decode  # noqa: E402

TOL = 2e-4  # float32 state, a dozen tokens (docs/testing.md: the token loop reaches ~1e-6)


@pytest.fixture
def calls(monkeypatch):
    """Count calls of the compiled decode entry (it still runs)."""
    seen = []
    real = cpu_decode.decode

    def spy(*args):
        seen.append(args)
        return real(*args)

    monkeypatch.setattr(cpu_decode, "decode", spy)
    return seen


def inputs(rule, *, gate="head", B=2, T=11, H=3, G=1, D=5, Dv=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H * G, Dv, generator=gen)
    kw = {}
    if rule in ("gated", "gated_delta"):
        shape = (B, T, H * G) if gate == "head" else (B, T, H * G, D)
        g = F.logsigmoid(torch.randn(*shape, generator=gen) * 3)
        if T > 8:  # near 1, near 0, a full reset: all while decoding
            g[:, 4], g[:, 6], g[:, 8] = -1e-4, -30.0, -torch.inf
        kw["g"] = g
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(B, T, H * G, generator=gen) * 1.5
    return q, k, v, kw


def decode(q, k, v, kw, *, prefill=3, inplace=True, **opts):
    """Prefill ``prefill`` tokens, decode the rest; the outputs of every token and the final state."""
    head = {n: x[:, :prefill] for n, x in kw.items()}
    o0, state = linattn.linear_attention(q[:, :prefill], k[:, :prefill], v[:, :prefill], output_final_state=True,
                                         **head, **opts)
    outs = [o0]
    for t in range(prefill, q.shape[1]):
        tok = {n: x[:, t].contiguous() for n, x in kw.items()}
        o, state = linattn.step(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(), state,
                                inplace=inplace, **tok, **opts)
        outs.append(o.unsqueeze(1))
    return torch.cat(outs, dim=1), state


def check_against_reference(q, k, v, kw, o, state, **opts):
    o_ref, S_ref, z_ref = reference_call(q, k, v, **kw, **opts)
    assert rel_err(o, o_ref) < TOL
    assert rel_err(state.S, S_ref) < TOL
    if z_ref is not None:
        assert rel_err(state.z, z_ref) < TOL


CASES = [  # rule, gate kind, feature map, value heads per query head
    ("accumulate", None, "elu1", 1),
    ("accumulate", None, "relu1", 2),
    ("gated", "head", "elu1", 1),
    ("gated", "channel", "relu1", 2),
    ("delta", None, "l2", 1),
    ("delta", None, "identity", 3),
    ("gated_delta", "head", "l2", 2),
    ("gated_delta", "head", None, 1),
]


@pytest.mark.parametrize("rule,gate,fmap,G", CASES)
@pytest.mark.parametrize("inplace", [True, False])
def test_plain_decode_takes_one_call_and_matches_reference(calls, rule, gate, fmap, G, inplace):
    q, k, v, kw = inputs(rule, gate=gate, G=G)
    if fmap == "identity" or fmap is None:  # a delta rule without a map needs unit keys to stay bounded
        k = F.normalize(k, dim=-1)
    o, state = decode(q, k, v, kw, rule=rule, feature_map=fmap, inplace=inplace)
    assert len(calls) == q.shape[1] - 3
    check_against_reference(q, k, v, kw, o, state, rule=rule, feature_map=fmap)


@pytest.mark.parametrize("eps_mode,scale,eps", [("add", 0.3, 1e-3), ("clamp", 0.7, 0.5), ("clamp", -0.2, 1e-6)])
def test_scale_and_eps_conventions(calls, eps_mode, scale, eps):
    q, k, v, kw = inputs("gated", B=1, H=2, D=4, Dv=3)
    opts = dict(rule="gated", feature_map="elu1", scale=scale, eps=eps, eps_mode=eps_mode)
    o, state = decode(q, k, v, kw, **opts)
    assert calls
    check_against_reference(q, k, v, kw, o, state, **opts)


def test_in_place_returns_the_state_it_updated_and_copy_leaves_it(calls):
    q, k, v, kw = inputs("accumulate", B=1, T=4)
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True, feature_map="elu1")
    before = state.S.clone(), state.z.clone()
    q, k, v = q[:, 3], k[:, 3], v[:, 3]  # B = 1: one token is contiguous
    o1, copy = linattn.step(q, k, v, state, feature_map="elu1")
    assert torch.equal(state.S, before[0]) and torch.equal(state.z, before[1])  # inplace=False: a new state
    assert copy.rule == "accumulate" and copy.feature_map == "elu1" and copy.normalized is True
    o2, same = linattn.step(q, k, v, state, feature_map="elu1", inplace=True)
    assert same is state and torch.equal(o1, o2)
    assert torch.equal(state.S, copy.S) and torch.equal(state.z, copy.z)
    assert len(calls) == 2


@pytest.mark.parametrize("bad", [float("nan"), 0.25])
def test_bad_gate_names_g_and_leaves_the_state(calls, bad):
    q, k, v, kw = inputs("gated_delta", B=1, T=4, H=2)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True, rule="gated_delta",
                                        feature_map="l2", g=kw["g"][:, :3], beta=kw["beta"][:, :3])
    before = state.S.clone()
    g = kw["g"][:, 3].clone()
    g[0, 1] = bad
    with pytest.raises(ValueError, match="g must be <= 0"):
        linattn.step(q[:, 3], k[:, 3], v[:, 3], state, rule="gated_delta", feature_map="l2", g=g,
                     beta=kw["beta"][:, 3].contiguous(), inplace=True)
    assert len(calls) == 1  # the kernel saw the gate first, wrote nothing, and the full path named it
    assert torch.equal(state.S, before)


def fall_through_cases():
    """Calls the one-call path must leave to the full path, each still correct."""
    yield "bfloat16 inputs", dict(dtype=torch.bfloat16), {}
    yield "taylor2 map", {}, dict(feature_map="taylor2")
    yield "per-channel gates on a delta rule", dict(rule="gated_delta", gate="channel"), {}
    yield "strided q", dict(strided=True), {}
    yield "a state without a record", dict(bare=True), {}
    yield "an int scale", {}, dict(scale=1)


@pytest.mark.parametrize("name,how,opts", list(fall_through_cases()), ids=[c[0] for c in fall_through_cases()])
def test_other_calls_take_the_full_path_and_stay_right(calls, name, how, opts):
    rule = how.get("rule", "gated")
    q, k, v, kw = inputs(rule, gate=how.get("gate", "head"), B=2, T=5, H=2, D=3, Dv=4)
    opts = {"rule": rule, "feature_map": "l2" if "delta" in rule else "elu1", **opts}
    _, state = linattn.linear_attention(q[:, :4], k[:, :4], v[:, :4], output_final_state=True,
                                        **{n: x[:, :4] for n, x in kw.items()}, **opts)
    if how.get("bare"):
        state = State(state.S, state.z)
    tq = q[:, 4]
    if how.get("strided"):
        tq = torch.randn(2, 2, 6)[..., ::2]
        tq.copy_(q[:, 4])
    dtype = how.get("dtype", torch.float32)
    tok = {n: x[:, 4].contiguous().to(dtype) for n, x in kw.items()}
    o, state = linattn.step(tq.to(dtype), k[:, 4].to(dtype), v[:, 4].to(dtype), state, **tok, **opts)
    assert calls == []
    o_ref, S_ref, _ = reference_call(q.to(dtype), k.to(dtype), v.to(dtype), **{n: x.to(dtype) for n, x in kw.items()},
                                     **opts)
    assert rel_err(o[:, None], o_ref[:, 4:]) < (2e-2 if dtype == torch.bfloat16 else TOL)
    assert rel_err(state.S, S_ref) < (2e-2 if dtype == torch.bfloat16 else TOL)


def test_torch_backend_and_grad_never_take_it(calls):
    q, k, v, kw = inputs("accumulate", B=1, T=4)
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True)
    linattn.step(q[:, 3], k[:, 3], v[:, 3], state, backend="torch")
    linattn.step(q[:, 3].requires_grad_(), k[:, 3], v[:, 3], state)
    assert calls == []


def test_inference_state_outside_inference_mode_is_still_refused(calls):
    q, k, v, _ = inputs("accumulate", B=1, T=4)
    with torch.inference_mode():
        _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True)
    with pytest.raises(ValueError, match="inference"):
        linattn.step(q[:, 3], k[:, 3], v[:, 3], state, inplace=True)
    assert calls == []
