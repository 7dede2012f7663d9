"""HF's one-token ``causal_conv1d_update`` on linattn's one compiled call (`linattn.nn.conv.fast_update`): against
HF's own (undecorated) torch function and the float64 definition at awkward sizes (odd channels, kernels of 1 to
5, windows as long as the kernel, one shorter and longer, batch > 1, with and without bias, SiLU or none,
float32 and bfloat16, a strided token), the window updated where it lies; and the calls it hands to the checked
path (which still agrees with HF)."""

from __future__ import annotations

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_tiny import modeling  # noqa: E402

from linattn.integrations import transformers as lt  # noqa: E402
from linattn.kernels import cpu_conv  # noqa: E402
from linattn.nn import conv as nn_conv  # noqa: E402

F64, BF16 = torch.float64, torch.bfloat16


def hf_update():
    return inspect.unwrap(lt.original(modeling("mamba2"), "causal_conv1d_update"))


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One bfloat16 ulp at each |x| (8 significant bits), the smallest normal's below."""
    a = x.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def definition(x, window, w, b, activation, dtype):
    """The update in float64 from the inputs' values: the taps over the window's last K - 1 entries and x, the
    bias, then SiLU; in bfloat16 the sum is rounded to bfloat16 before the SiLU (as a bfloat16 convolution
    returns it), the result rounded again."""
    K = w.shape[-1]
    xs = torch.cat([window, x], -1).double()[..., -K:]
    y = (xs * w.double()).sum(-1, keepdim=True) + (0 if b is None else b.double()[:, None])
    if dtype == BF16:
        y = y.to(BF16).double()
    if activation is not None:
        y = torch.nn.functional.silu(y)
    return y


def inputs(B, C, K, W, bias, dtype, seed, x_layout="view"):
    gen = torch.Generator().manual_seed(seed)
    if x_layout == "view":  # HF's: a projection's [B, T, C] slice, transposed
        x = torch.randn(B, 3, C, generator=gen).transpose(1, 2)
    else:  # channels 6 apart
        x = torch.randn(B, C, 6, generator=gen)[..., ::2]
    w = torch.randn(C, K, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    window = torch.randn(B, C, W, generator=gen)
    return [t if t is None else t.to(dtype) for t in (x, window, w, b)]


CASES = [(1, 1, 4, 4), (2, 7, 4, 4), (3, 37, 3, 3), (2, 5, 2, 2), (1, 9, 5, 5), (2, 11, 4, 3), (1, 6, 2, 6),
         (2, 3, 1, 1), (1, 130, 4, 4)]


@pytest.mark.parametrize("B,C,K,W", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", ["silu", None, "swish"])
def test_update_agrees_with_hf_and_the_definition(B, C, K, W, dtype, bias, activation):
    x, window, w, b = inputs(B, C, K, W, bias, dtype, seed=B * 1000 + C * 10 + K)
    hf_window = window.clone()
    ptr, version = window.data_ptr(), window._version
    with torch.no_grad():
        for t in range(3):
            tok = x[..., t:t + 1]
            want_def = definition(tok, window, w, b, activation, dtype)
            assert nn_conv.fast_update(tok, window.clone(), w, b, activation is not None) is not None  # the fast path
            got = lt.causal_conv1d_update(tok, window, w, b, activation)
            want = hf_update()(tok, hf_window, w, b, activation)
            assert got.shape == want.shape == (B, C, 1) and got.dtype == want.dtype == dtype
            assert torch.equal(window, hf_window)  # the window: the same values, exactly
            if dtype == BF16:  # both sum in float32 and round once: at most one bfloat16 ulp apart
                assert ((got.double() - want.double()).abs() <= bf16_ulp(want)).all()
                assert ((got.double() - want_def).abs() <= bf16_ulp(want_def)).all()
            else:
                scale = want_def.abs().max().clamp_min(1.0)
                assert (got.double() - want.double()).abs().max() <= 1e-6 * scale
                assert (got.double() - want_def).abs().max() <= 1e-6 * scale
    assert window.data_ptr() == ptr and window._version > version  # in place, and autograd told


def test_bf16_matches_hfs_rounding_at_scale():
    """At a real layer's width (bfloat16 checkpoints) the rounding is HF's: sum to bfloat16, then SiLU rounded;
    nearly every value bit-equal to HF's (a float32 sum in another order may straddle a rounding boundary)."""
    x, window, w, b = inputs(2, 5376, 4, 4, True, BF16, seed=5)
    hf_window = window.clone()
    with torch.no_grad():
        got = lt.causal_conv1d_update(x[..., :1], window, w, b, "silu")
        want = hf_update()(x[..., :1], hf_window, w, b, "silu")
    assert ((got.double() - want.double()).abs() <= bf16_ulp(want)).all()
    assert (got != want).float().mean() < 0.01
    assert torch.equal(window, hf_window)


@pytest.mark.parametrize("layout", ["view", "strided"])
def test_token_read_where_it_lies(layout):
    x, window, w, b = inputs(3, 13, 4, 4, True, torch.float32, seed=7, x_layout=layout)
    assert x.stride(1) == (1 if layout == "view" else 6)
    want = hf_update()(x[..., :1], window.clone(), w, b, "silu")
    got = nn_conv.fast_update(x[..., :1], window, w, b, True)
    assert got is not None and (got - want).abs().max() <= 1e-6 * want.abs().max()


def _refused(case, x, window, w, b):
    """The arguments of a call the fast path hands to the checked path, by name."""
    if case == "float64":
        return x.double(), window.double(), w.double(), b.double()
    if case == "mixed dtypes":
        return x, window.to(BF16), w, b
    if case == "window not contiguous":
        return x, torch.randn(window.shape[::-1]).transpose(0, 2), w, b
    if case == "window too short":
        return x, window[..., :1].contiguous(), w, b
    if case == "two tokens":
        return torch.cat([x, x], -1), window, w, b
    if case == "weight needs grad":
        return x, window, w.clone().requires_grad_(), b
    if case == "bias of another size":
        return x, window, w, b[:-1]
    if case == "token inside the window":
        return window[..., -1:], window, w, b
    raise AssertionError(case)


REFUSED = ["float64", "mixed dtypes", "window not contiguous", "window too short", "two tokens", "weight needs grad",
           "bias of another size", "token inside the window"]


@pytest.mark.parametrize("case", REFUSED)
def test_unusual_calls_go_to_the_checked_path_untouched(case):
    """What the one call does not take: None from the fast path with nothing written; the adapter's checked path
    then gives HF's result (or HF's error)."""
    x, window, w, b = _refused(case, *inputs(2, 6, 3, 3, True, torch.float32, seed=9))
    before = window.clone()
    assert nn_conv.fast_update(x[..., :1] if case != "two tokens" else x, window, w, b, True) is None
    assert torch.equal(window, before)
    if case == "window too short":  # HF's own function returns an empty [B, C, 0] there: nothing to compare
        return
    hf_window = window.detach().clone()
    try:
        want = hf_update()(x, hf_window, w, b, "silu")
    except RuntimeError as exc:  # HF's own error: the adapter's path fails too
        with pytest.raises(Exception):  # noqa: B017
            lt.causal_conv1d_update(x, window, w, b, "silu")
        assert "size" in str(exc) or "dtype" in str(exc) or "type" in str(exc)
        return
    got = lt.causal_conv1d_update(x, window, w, b, "silu")
    assert got.dtype == want.dtype and (got.double() - want.double()).abs().max() <= 1e-2 * want.abs().max()
    assert torch.equal(window.detach().to(hf_window.dtype), hf_window)
    if case == "weight needs grad":
        assert got.requires_grad  # autograd sees the torch form


def test_inference_window_outside_inference_mode_is_refused():
    x, window, w, b = inputs(1, 4, 4, 4, True, torch.float32, seed=2)
    with torch.inference_mode():
        frozen = window.clone()
    assert nn_conv.fast_update(x[..., :1], frozen, w, b, True) is None
    with torch.inference_mode():
        assert nn_conv.fast_update(x[..., :1], frozen, w, b, True) is not None


def test_kernel_rolls_every_window_length():
    """The kernel's own contract on raw addresses: the unrolled builds (W = K = 3, 4) and the general loop agree
    with the definition, the window shifted by one with x last."""
    for K, W in ((3, 3), (4, 4), (4, 3), (2, 5), (5, 5)):
        x, window, w, b = inputs(2, 9, K, W, True, torch.float32, seed=K * 10 + W)
        tok = x[..., :1]
        want = definition(tok, window, w, b, "silu", torch.float32)
        rolled = torch.cat([window[..., 1:], tok], -1)
        out = torch.empty(2, 9, 1)
        cpu_conv.update_hf(tok.data_ptr(), tok.stride(0), tok.stride(1), window.data_ptr(), 2, 9, W, w.data_ptr(),
                           K, b.data_ptr(), out.data_ptr(), 1, 0)
        assert torch.equal(window, rolled)
        assert (out.double() - want).abs().max() <= 1e-6 * want.abs().max()
