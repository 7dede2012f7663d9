"""Tensors that are not plain memory: negative-bit views (``torch._neg_view``, as autograd makes inside some
graphs) read as their values, never as their raw memory, on every path (the compiled prefill, the compiled
decode step, the Decoder, the torch forms)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import State

pytest.importorskip("numba")

B, T, H, D, DV = 2, 7, 2, 4, 3
NAMES = ("q", "k", "v", "g", "beta", "state")


def neg_view(x: torch.Tensor) -> torch.Tensor:
    """The same values as ``x``, held negated in memory behind the negative bit."""
    y = torch._neg_view(-x)
    assert y.is_neg() and torch.equal(y, x)
    return y


def sequence(rule, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, D, generator=gen), "k": F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1),
         "v": torch.randn(B, T, H, DV, generator=gen)}
    if rule in ("gated", "gated_delta"):
        x["g"] = F.logsigmoid(torch.randn(B, T, H, generator=gen) + 1)
    if rule in ("delta", "gated_delta"):
        x["beta"] = torch.rand(B, T, H, generator=gen)
    return {n: t.to(dtype) for n, t in x.items()}


def a_state(rule, seed=1):
    gen = torch.Generator().manual_seed(seed)
    normalized = rule in ("accumulate", "gated")
    return State(torch.randn(B, H, D, DV, generator=gen), torch.rand(B, H, D, generator=gen) if normalized else None)


def fmap(rule):
    return "elu1" if rule in ("accumulate", "gated") else "l2"


def neg_state(state: State) -> State:
    return State(neg_view(state.S), None if state.z is None else neg_view(state.z))


@pytest.mark.parametrize("rule", linattn.RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["auto", "cpu", "torch"])
def test_linear_attention_reads_negative_views_as_values(rule, dtype, backend):
    x, s0 = sequence(rule, dtype), a_state(rule)

    def run(x, s0):
        return linattn.linear_attention(x["q"], x["k"], x["v"], rule=rule, g=x.get("g"), beta=x.get("beta"),
                                        feature_map=fmap(rule), initial_state=s0, output_final_state=True,
                                        backend=backend)

    o_want, s_want = run(x, s0)
    for name in [n for n in NAMES if n in x or n == "state"]:
        y = {n: neg_view(t) if n == name else t for n, t in x.items()}
        o, s = run(y, neg_state(s0) if name == "state" else s0)
        assert torch.allclose(o.float(), o_want.float(), rtol=1e-5, atol=1e-6), (name, (o - o_want).abs().max())
        assert torch.allclose(s.S, s_want.S, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize("rule", ["accumulate", "gated_delta"])
def test_packed_call_reads_negative_views_as_values(rule):
    x, cu = sequence(rule), torch.tensor([0, 3, 3, T])
    x = {n: t[:1] for n, t in x.items()}
    want = linattn.linear_attention(x["q"], x["k"], x["v"], rule=rule, g=x.get("g"), beta=x.get("beta"),
                                    feature_map=fmap(rule), cu_seqlens=cu)[0]
    for name in x:
        y = {n: neg_view(t) if n == name else t for n, t in x.items()}
        o = linattn.linear_attention(y["q"], y["k"], y["v"], rule=rule, g=y.get("g"), beta=y.get("beta"),
                                     feature_map=fmap(rule), cu_seqlens=cu)[0]
        assert torch.allclose(o, want, rtol=1e-5, atol=1e-6), name


def tokens(rule):
    return {n: t[:, 0].contiguous() for n, t in sequence(rule).items()}


@pytest.mark.parametrize("rule", linattn.RULES)
@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("backend", ["auto", "cpu", "torch"])
def test_step_reads_negative_views_as_values(rule, inplace, backend):
    x = tokens(rule)

    def run(x, state):
        return linattn.step(x["q"], x["k"], x["v"], state, rule=rule, g=x.get("g"), beta=x.get("beta"),
                            feature_map=fmap(rule), inplace=inplace, backend=backend)

    o_want, s_want = run(x, a_state(rule))
    for name in [n for n in NAMES if n in x or n == "state"]:
        y = {n: neg_view(t) if n == name else t for n, t in x.items()}
        state = neg_state(a_state(rule)) if name == "state" else a_state(rule)
        o, s = run(y, state)
        assert torch.allclose(o, o_want, rtol=1e-5, atol=1e-6), (name, (o - o_want).abs().max())
        assert torch.allclose(s.S, s_want.S, rtol=1e-5, atol=1e-6), name
        if inplace:  # the caller's state holds the update, read through its own view
            assert s.S is state.S and torch.allclose(state.S, s_want.S, rtol=1e-5, atol=1e-6), name
            if state.z is not None:
                assert torch.allclose(state.z, s_want.z, rtol=1e-5, atol=1e-6), name


def test_joint_state_with_only_s_negative():
    """S a negative view and z a plain view of the same buffer (the layout linattn makes, so a joint [S | z]
    view looks possible): the step reads both as their values and writes both back."""
    state = a_state("accumulate")
    buf = torch.cat([-state.S, state.z.unsqueeze(-1)], dim=-1)
    odd = State(torch._neg_view(buf)[..., :DV], buf[..., DV])
    assert odd.S.is_neg() and not odd.z.is_neg() and torch.equal(odd.S, state.S) and torch.equal(odd.z, state.z)
    x = tokens("accumulate")
    o_want, s_want = linattn.step(x["q"], x["k"], x["v"], state.clone(), feature_map="elu1", inplace=True)
    o, s = linattn.step(x["q"], x["k"], x["v"], odd, feature_map="elu1", inplace=True)
    assert torch.allclose(o, o_want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(odd.S, s_want.S, rtol=1e-5, atol=1e-6) and torch.allclose(odd.z, s_want.z, rtol=1e-5)


@pytest.mark.parametrize("rule", linattn.RULES)
def test_decoder_reads_negative_views_as_values(rule):
    x = tokens(rule)
    want = linattn.Decoder(a_state(rule), rule=rule, feature_map=fmap(rule))
    o_want = [want(x["q"], x["k"], x["v"], g=x.get("g"), beta=x.get("beta")) for _ in range(2)]
    for name in [n for n in NAMES if n in x or n == "state"]:
        y = {n: neg_view(t) if n == name else t for n, t in x.items()}
        state = neg_state(a_state(rule)) if name == "state" else a_state(rule)
        dec = linattn.Decoder(state, rule=rule, feature_map=fmap(rule))
        for t in range(2):
            o = dec(y["q"], y["k"], y["v"], g=y.get("g"), beta=y.get("beta"))
            assert torch.allclose(o, o_want[t], rtol=1e-5, atol=1e-6), (name, t, (o - o_want[t]).abs().max())
        assert torch.allclose(dec.state.S, want.state.S, rtol=1e-5, atol=1e-6), name
        assert torch.allclose(state.S, want.state.S, rtol=1e-5, atol=1e-6), name  # the caller's view too


def test_compiled_backward_reads_a_negative_gradient_as_values():
    """The gradient reaching the compiled prefill's backward may itself be a negative view."""
    x = {n: t.requires_grad_() for n, t in sequence("delta").items()}

    def grads(grad_o):
        o = linattn.linear_attention(x["q"], x["k"], x["v"], rule="delta", beta=x["beta"], feature_map="l2",
                                     backend="cpu")[0]
        return torch.autograd.grad(o, list(x.values()), grad_o)

    w = torch.randn(B, T, H, DV, generator=torch.Generator().manual_seed(3))
    for got, want in zip(grads(neg_view(w)), grads(w), strict=True):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_compiled_convolution_backward_reads_a_negative_gradient_as_values():
    """The nn layers' compiled short convolution: its incoming gradient may be a negative view (it once raised
    "Can't call numpy() on Tensor that has negative bit set")."""
    from linattn.nn import causal_conv
    from linattn.nn.conv import conv_torch

    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 9, 6, generator=gen, requires_grad=True)
    w = torch.randn(6, 4, generator=gen, requires_grad=True)
    gy = torch.randn(2, 9, 6, generator=gen)
    y, _ = causal_conv(x, w)
    got = torch.autograd.grad(y, (x, w), neg_view(gy))
    want = torch.autograd.grad(conv_torch(torch.cat([x.new_zeros(2, 3, 6), x], dim=1), w, None), (x, w), gy)
    for a, e in zip(got, want, strict=True):
        assert torch.allclose(a, e, rtol=1e-5, atol=1e-6)


def test_buffers_read_a_negative_view_as_values_and_refuse_to_write_through_one():
    """`linattn.buffers`: `readable` gives a kernel a negative (or conjugate) view's values; `array`, the view a
    kernel writes through, refuses one by name instead of handing over memory that holds the negated numbers."""
    from linattn import buffers

    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(6))
    assert (buffers.readable(neg_view(x)) == x.numpy()).all()
    assert (buffers.readable(neg_view(x).t()) == x.t().numpy()).all()
    with pytest.raises(ValueError, match="negative or conjugate view"):
        buffers.array(neg_view(x))
    assert buffers.values(x) is x


def test_convolution_update_reads_negative_views_and_leaves_a_negative_window_to_the_caller():
    """The one-token update: a negative token, weight or bias is read as its values; a negative window (which the
    update writes in place) is refused by the update's one refusal: None under "auto", nothing written; the
    reason under "cpu"."""
    from linattn.nn.conv import conv_update

    gen = torch.Generator().manual_seed(7)
    window, w, b, x = (torch.randn(2, 5, 4, generator=gen), torch.randn(5, 3, generator=gen),
                       torch.randn(5, generator=gen), torch.randn(2, 5, generator=gen))
    plain = window.clone()
    want = conv_update(x, plain, w, b, "silu", backend="cpu")
    got_window = window.clone()
    got = conv_update(neg_view(x), got_window, neg_view(w), neg_view(b), "silu", backend="cpu")
    assert torch.equal(got, want) and torch.equal(got_window, plain)
    negative = neg_view(window)
    assert conv_update(x, negative, w, b, "silu") is None and torch.equal(negative, window)
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it updates the window in place"):
        conv_update(x, negative, w, b, "silu", backend="cpu")
