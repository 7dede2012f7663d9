"""The short causal convolution: the compiled CPU path (float32) against the torch form in float64, values and
gradients of the input, the weight and the history, packed boundaries, double backward, other dtypes."""

from __future__ import annotations

import pytest
import torch

from linattn.kernels import cpu_conv
from linattn.nn import causal_conv
from linattn.nn.conv import conv_torch


def _inputs(B, T, C, K, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g, dtype=dtype)
    w = torch.randn(C, K, generator=g, dtype=dtype)
    h = torch.randn(B, K - 1, C, generator=g, dtype=dtype)
    return x, w, h


def _reference(x, w, h, offs=None):
    """Float64 torch form with gradients; returns (y, the tensors whose .grad to read)."""
    x64, w64, h64 = (t.detach().double().requires_grad_() for t in (x, w, h))
    return conv_torch(torch.cat([h64, x64], 1), w64, offs), (x64, w64, h64)


def _grads(x, w, h, gy, cu=None):
    ts = [t.detach().clone().requires_grad_() for t in (x, w, h)]
    y, tail = causal_conv(ts[0], ts[1], ts[2], cu)
    y.backward(gy)
    return y, tail, [t.grad for t in ts]


@pytest.mark.parametrize("B,T,C,K", [(1, 1, 5, 4), (2, 7, 13, 3), (3, 37, 40, 4), (2, 5, 7, 1), (2, 2, 9, 4),
                                     (1, 130, 96, 4)])
def test_compiled_matches_float64(B, T, C, K, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_conv, "forward", _counting(cpu_conv.forward, calls))
    x, w, h = _inputs(B, T, C, K)
    gy = torch.randn(B, T, C)
    y, tail, grads = _grads(x, w, h, gy)
    assert calls, "float32 CPU input did not reach the compiled kernel"
    ref, leaves = _reference(x, w, h)
    ref.backward(gy.double())
    assert (y.double() - ref).abs().max() < 1e-5 * ref.abs().max()
    for got, leaf in zip(grads, leaves, strict=True):
        if leaf.numel():
            assert (got.double() - leaf.grad).abs().max() <= 2e-5 * max(1.0, float(leaf.grad.abs().max()))
    assert torch.equal(tail, torch.cat([h, x], 1)[:, T:])


def _counting(fn, calls):
    def wrapped(*args):
        calls.append(1)
        return fn(*args)
    return wrapped


@pytest.mark.parametrize("lengths", [[5, 1, 0, 9], [1, 1, 1], [2, 3], [0, 4, 0]])
def test_packed_restarts_at_every_sequence(lengths):
    K, C = 4, 11
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    T = int(cu[-1])
    x, w, _ = _inputs(1, T, C, K, seed=3)
    gy = torch.randn(1, T, C)
    y, _, (gx, gw, _) = _grads(x, w, torch.zeros(1, K - 1, C), gy, cu)
    gw_sum = torch.zeros_like(w, dtype=torch.float64)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if a == b:
            continue
        ref, (x64, w64, _) = _reference(x[:, a:b], w, torch.zeros(1, K - 1, C))
        ref.backward(gy[:, a:b].double())
        assert (y[:, a:b].double() - ref).abs().max() < 1e-5
        assert (gx[:, a:b].double() - x64.grad).abs().max() < 1e-5
        gw_sum += w64.grad
    assert (gw.double() - gw_sum).abs().max() < 1e-4


def test_double_backward_matches_torch_form():
    x, w, h = _inputs(2, 9, 6, 4, seed=5)
    ts = [t.clone().requires_grad_() for t in (x, w, h)]
    y, _ = causal_conv(*ts)
    gx, gw = torch.autograd.grad((y ** 2).sum(), (ts[0], ts[1]), create_graph=True)
    hv = torch.autograd.grad(gx.sum() + gw.sum(), ts)
    ref, leaves = _reference(x, w, h)
    rgx, rgw = torch.autograd.grad((ref ** 2).sum(), leaves[:2], create_graph=True)
    rhv = torch.autograd.grad(rgx.sum() + rgw.sum(), leaves)
    assert (gx.double() - rgx).abs().max() < 1e-4
    for a, b in zip(hv, rhv, strict=True):
        assert (a.double() - b).abs().max() <= 1e-4 * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_other_dtypes_take_the_torch_form(dtype, monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_conv, "forward", _counting(cpu_conv.forward, calls))
    x, w, h = _inputs(2, 6, 5, 4, seed=7, dtype=dtype)
    y, _ = causal_conv(x, w, h)
    assert not calls
    assert torch.equal(y, conv_torch(torch.cat([h, x], 1), w, None))


def test_torch_func_grad_takes_the_torch_form():
    """Under torch.func (grad here; vmap, jacrev alike) the float32 CPU convolution runs its torch form: the
    compiled pass reads raw memory, which the transform's wrapped tensors lack. Same gradients as autograd."""
    gen = torch.Generator().manual_seed(5)
    x, w = torch.randn(2, 13, 6, generator=gen), torch.randn(6, 4, generator=gen)

    def loss(x_, w_):
        return causal_conv(x_, w_)[0].pow(2).sum()

    gx, gw = torch.func.grad(loss, argnums=(0, 1))(x, w)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss(xr, wr).backward()
    assert torch.allclose(gx, xr.grad, rtol=1e-5, atol=1e-6) and torch.allclose(gw, wr.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rule", ["accumulate", "gated", "delta", "gated_delta"])
def test_torch_func_grad_through_a_layer(rule):
    """torch.func.functional_call + grad through a float32 LinearAttention over two chunks (convolution, feature
    map, gates, the chunk carry): the parameters' gradients equal autograd's."""
    from linattn.nn import LinearAttention

    torch.manual_seed(0)
    layer = LinearAttention(16, 2, 8, rule=rule)
    x = torch.randn(2, 75, 16)

    def loss(params):
        return torch.func.functional_call(layer, params, (x,))[0].pow(2).sum()

    got = torch.func.grad(loss)({k: p.detach() for k, p in layer.named_parameters()})
    loss(dict(layer.named_parameters())).backward()
    for name, p in layer.named_parameters():
        err = (got[name] - p.grad).abs().max() / p.grad.abs().max().clamp_min(1e-6)
        assert err < 1e-4, (name, float(err))


def test_update_refusal_reads_the_token_too(monkeypatch):
    """One decode token through the compiled update: its value against the torch form; a token the update cannot
    take (another dtype than the window, or requiring grad) is refused by the one refusal (backends.cpu.conv_refusal)
    that also reads the window, weight and bias: None under "auto" (nothing written), the reason under "cpu"."""
    from linattn.backends import cpu as cpu_backend
    from linattn.nn.conv import conv_update

    gen = torch.Generator().manual_seed(3)
    B, C, W, K = 2, 5, 4, 3
    window, w, b = torch.randn(B, C, W, generator=gen), torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    x = torch.randn(B, C, generator=gen)
    want = conv_torch(torch.cat([window, x[..., None]], -1)[..., -K:].transpose(1, 2).double(), w.double(), None,
                      b.double())[:, -1]
    before = window.clone()
    got = conv_update(x, window, w, b, "silu", backend="cpu")
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert torch.equal(window, torch.cat([before[..., 1:], x[..., None]], -1))
    assert cpu_backend.conv_refusal(x.double(), w, b, window) == "it takes float32, float64 inputs of one dtype"
    for bad, why in ((x.double(), "inputs of one dtype"), (x.clone().requires_grad_(), "has no backward")):
        before = window.clone()
        assert conv_update(bad, window, w, b, "silu") is None
        assert torch.equal(window, before)
        with pytest.raises(ValueError, match=f"backend='cpu' cannot run this call: .*{why}"):
            conv_update(bad, window, w, b, "silu", backend="cpu")


def _no_grad_reference(x, w, h, b, silu, offs=None):
    hist = torch.zeros(x.shape[0], w.shape[1] - 1, x.shape[2], dtype=torch.float64) if h is None else h.double()
    return conv_torch(torch.cat([hist, x.double()], 1), w.double(), offs, None if b is None else b.double(), silu)


@pytest.mark.parametrize("B,T,C,K", [(1, 1, 5, 4), (2, 2, 9, 4), (3, 3, 1, 4), (2, 7, 13, 3), (1, 130, 97, 4),
                                     (2, 5, 7, 1), (1, 0, 4, 4)])
@pytest.mark.parametrize("silu", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("with_history", [True, False])
def test_inference_pass_matches_float64(B, T, C, K, silu, with_bias, with_history, monkeypatch):
    """Outside autograd the compiled pass reads x in place, the history apart and fuses the SiLU: values and the
    new history against the float64 torch form, at sizes below and around the kernel width."""
    calls = []
    monkeypatch.setattr(cpu_conv, "forward", _counting(cpu_conv.forward, calls))
    x, w, h = _inputs(B, T, C, K, seed=B * 100 + T)
    b = torch.randn(C) if with_bias else None
    h = h if with_history else None
    with torch.no_grad():
        y, tail = causal_conv(x, w, h, bias=b, activation="silu" if silu else None)
    assert (not T or calls) and y.shape == (B, T, C) and y.is_contiguous()
    ref = _no_grad_reference(x, w, h, b, silu)
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
    hist = torch.zeros(B, K - 1, C) if h is None else h
    assert torch.equal(tail, torch.cat([hist, x], 1)[:, T:])


@pytest.mark.parametrize("layout", ["channel_slice", "sliced", "channel_strided"])
def test_inference_pass_reads_strided_inputs(layout):
    """Inputs whose channels are adjacent in memory (a slice of wider rows, as q, k, v split from one projection;
    a window along time) are read where they lie; channels apart in memory are copied once. Values as for a
    contiguous copy."""
    B, T, C, K = 2, 11, 6, 4
    g = torch.Generator().manual_seed(21)
    if layout == "channel_slice":  # token stride is not C
        x = torch.randn(B, T, C + 7, generator=g)[:, :, 2:2 + C]
    elif layout == "sliced":  # a window of a longer buffer: batch stride is not T * C
        x = torch.randn(B, T + 5, C, generator=g)[:, 3:3 + T]
    else:  # channels apart: the copy path
        x = torch.randn(B, C, T, generator=g).transpose(1, 2)
    w, b = torch.randn(C, K, generator=g), torch.randn(C, generator=g)
    with torch.no_grad():
        y, _ = causal_conv(x, w, bias=b)
    ref = _no_grad_reference(x.contiguous(), w, None, b, True)
    assert (y.double() - ref).abs().max() <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("lengths", [[5, 1, 0, 9], [1, 1, 1], [2, 3], [0, 4, 0], [70, 1, 129]])
def test_inference_pass_restarts_at_packed_boundaries(lengths, monkeypatch):
    """Packed sequences outside autograd, on three threads (the token ranges split inside sequences): each
    sequence as if alone."""
    from linattn.backends import cpu as cpu_backend

    monkeypatch.setattr(cpu_backend, "available_threads", lambda: 3)
    K, C = 4, 11
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    T = int(cu[-1])
    x, w, _ = _inputs(1, T, C, K, seed=4)
    b = torch.randn(C)
    with torch.no_grad():
        y, _ = causal_conv(x, w, None, cu, bias=b)
    for a, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if a == e:
            continue
        ref = _no_grad_reference(x[:, a:e], w, None, b, True)
        assert (y[:, a:e].double() - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))


def test_inference_pass_on_threads_equals_one_thread(monkeypatch):
    """The token ranges on several threads give the bits of one thread (each token's sum in the same order)."""
    from linattn.backends import cpu as cpu_backend

    x, w, h = _inputs(2, 300, 33, 4, seed=9)
    with torch.no_grad():
        monkeypatch.setattr(cpu_backend, "available_threads", lambda: 1)
        one, _ = causal_conv(x, w, h)
        monkeypatch.setattr(cpu_backend, "available_threads", lambda: 4)
        many, _ = causal_conv(x, w, h)
    assert torch.equal(one, many)


def test_silu_saturates_and_propagates_nan():
    """SiLU at large magnitudes (the kernel's exp clamps its argument) and NaN, as torch computes them."""
    C, K = 8, 1
    x = torch.tensor([[[-1e4, -200.0, -88.0, -20.0, 20.0, 100.0, 1e4, float("nan")]]])
    w = torch.ones(C, K)
    with torch.no_grad():
        y, _ = causal_conv(x, w)
    ref = torch.nn.functional.silu(x.double())
    assert torch.isnan(y[0, 0, -1])
    assert (y[..., :-1].double() - ref[..., :-1]).abs().max() <= 1e-30 + 1e-6 * ref[..., :-1].abs().max()
