"""Fresh output buffers (:mod:`linattn.buffers`): torch's own allocations, the large ones advised onto huge pages,
released with the tensor; and every output of the compiled paths (and every input they read) stays an ordinary,
resizable tensor."""

from __future__ import annotations

import gc
import os

import pytest
import torch

import linattn
from linattn import State, buffers
from linattn.nn import causal_conv


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(3, 5), (0, 7), (2, 1024, 1024), (9, 1024, 1024), (7, 333, 1111)])
def test_empty_is_a_plain_contiguous_tensor(shape, dtype, monkeypatch):
    advised = []
    if buffers.hugepage_capable():
        real = buffers._madvise
        monkeypatch.setattr(buffers, "_madvise", lambda *a: advised.append(a) or real(*a))
    x = buffers.empty(shape, dtype)
    assert x.shape == shape and x.dtype == dtype and x.is_contiguous() and x.device.type == "cpu"
    x.fill_(3)
    assert bool((x == 3).all())
    assert x.untyped_storage().resizable()  # torch's allocation, huge pages or not
    nbytes = x.numel() * x.element_size()
    if nbytes >= buffers.MIN_BYTES and buffers.hugepage_capable():
        ((at, length, advice),) = advised  # the 2 MiB-aligned pages inside the buffer, advised once
        assert at % buffers.HUGE_PAGE == 0 and length % buffers.HUGE_PAGE == 0 and advice == buffers._ADVISE
        assert x.data_ptr() <= at and at + length <= x.data_ptr() + nbytes and length >= nbytes - 2 * buffers.HUGE_PAGE
    else:
        assert not advised
    x.resize_(x.numel() + 10)  # and it resizes


@pytest.mark.skipif(not buffers.hugepage_capable(), reason="no madvise here")
def test_large_buffers_are_released_with_their_tensor():
    """2 GiB in 32 buffers of 64 MiB, each written and dropped: resident memory comes back each time."""
    gc.collect()
    before = rss_bytes()
    for _ in range(32):
        x = buffers.empty((16 << 20,))
        x.fill_(1.0)
        del x
        assert rss_bytes() - before < 32 << 20


def test_works_when_the_advice_is_refused_or_missing(monkeypatch):
    """An advice the kernel rejects, or a platform without madvise, still gives a working tensor."""
    shape = (buffers.MIN_BYTES // 4 + (4 << 20),)
    monkeypatch.setattr(buffers, "_ADVISE", -12345)
    if buffers.hugepage_capable():
        y = buffers.empty(shape)
        y.fill_(2.0)
        assert y.shape == shape and bool((y == 2.0).all()) and y.untyped_storage().resizable()
    monkeypatch.setattr(buffers, "_madvise", None)
    assert not buffers.hugepage_capable()
    z = buffers.empty(shape)
    assert z.shape == shape and z.untyped_storage().resizable()


def test_array_views_memory_without_pinning_it():
    """buffers.array reads and writes the tensor's memory, any strides, and leaves the tensor resizable (x.numpy()
    marks the storage never resizable)."""
    x = torch.arange(12.0).view(3, 4)
    a = buffers.array(x.t())
    assert a.shape == (4, 3) and a.tolist() == x.t().tolist()
    a[1, 2] = -1.0
    assert x[2, 1] == -1.0
    x.resize_(100)
    assert buffers.array(torch.empty(0, 3)).shape == (0, 3)


def grown(t: torch.Tensor) -> None:
    """Fails where the storage cannot grow (torch: "Trying to resize storage that is not resizable")."""
    t.detach().resize_(2 * t.numel() + 5)


@pytest.mark.parametrize("min_bytes", [None, 1 << 21, float("inf")])
@pytest.mark.parametrize("rule", ["accumulate", "gated_delta"])
def test_outputs_and_inputs_stay_resizable(rule, min_bytes, monkeypatch):
    """Outputs of the compiled prefill (o, the final state), of step and of the Decoder, and the inputs they read,
    grow with resize_ and take torch.cat(..., out=o): with huge-page buffers (MIN_BYTES at 2 MiB, so the 4 MiB
    output is one), without them (inf), and at the default."""
    if min_bytes is not None:
        monkeypatch.setattr(buffers, "MIN_BYTES", min_bytes)
    gen = torch.Generator().manual_seed(0)
    B, T, H, D, Dv = 1, 512, 16, 8, 128  # o: 4 MiB of float32
    normalized = rule == "accumulate"
    kw = {"feature_map": "elu1"} if normalized else {"feature_map": "l2"}

    def fresh():
        x = {n: torch.randn(B, T, H, d, generator=gen) for n, d in (("q", D), ("k", D), ("v", Dv))}
        if rule == "gated_delta":
            x["g"] = -torch.rand(B, T, H, generator=gen)
            x["beta"] = torch.rand(B, T, H, generator=gen)
        return x

    for backend in ("auto", "cpu"):
        x = fresh()
        cu = torch.tensor([0, 100, T])
        for packed in (None, cu):
            xs = x if packed is None else {n: t.clone() for n, t in x.items()}
            o, s = linattn.linear_attention(xs["q"], xs["k"], xs["v"], rule=rule, g=xs.get("g"),
                                            beta=xs.get("beta"), output_final_state=True, backend=backend,
                                            cu_seqlens=packed, **kw)
            o_copy = o.clone()
            torch.cat([o_copy[:, :1], o_copy[:, :1]], dim=1, out=o.resize_(0))  # grows o's storage again
            assert o.shape == (B, 2, H, Dv) and torch.equal(o[:, 1], o_copy[:, 0])
            for t in (o, s.S, *((s.z,) if normalized else ()), *xs.values(), cu):
                grown(t)
        # one token: step (in place and not) and the Decoder, outputs and states
        tok = {n: t[:, 0].contiguous() for n, t in fresh().items()}
        for inplace in (False, True):
            state = State.zeros(B, H, D, Dv, normalizer=normalized)
            o, s = linattn.step(tok["q"], tok["k"], tok["v"], state, rule=rule, g=tok.get("g"),
                                beta=tok.get("beta"), inplace=inplace, backend=backend, **kw)
            for t in (o, s.S, *tok.values()):
                grown(t)
        tok = {n: t[:, 0].contiguous() for n, t in fresh().items()}
        dec = linattn.Decoder(State.zeros(B, H, D, Dv, normalizer=normalized), rule=rule, backend=backend, **kw)
        o = dec(tok["q"], tok["k"], tok["v"], g=tok.get("g"), beta=tok.get("beta"))
        o2 = dec(tok["q"], tok["k"], tok["v"], g=tok.get("g"), beta=tok.get("beta"))
        torch.cat([o2, o2, o2], out=o.resize_(0))
        for t in (o, dec.state.S, *tok.values()):
            grown(t)


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_gradients_of_the_compiled_backward_and_the_convolution_stay_resizable(rule):
    """The compiled backward writes its gradients into torch's own tensors (not NumPy's), and so does the compiled
    short convolution: every gradient grows with resize_, and equals the torch form's."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, D = 2, 37, 3, 8
    leaves = {n: torch.randn(B, T, H, D, generator=gen, requires_grad=True) for n in ("q", "k", "v")}
    kw = {"g": (-torch.rand(B, T, H, generator=gen)).requires_grad_(True)}
    if rule == "gated_delta":
        kw["beta"] = torch.rand(B, T, H, generator=gen).requires_grad_(True)
    inputs = [*leaves.values(), *kw.values()]
    grads = {}
    for backend in ("cpu", "torch"):
        fmap = "elu1" if rule == "gated" else "l2"  # (l2 under a normalizer is ill-conditioned at float32)
        o, _ = linattn.linear_attention(*leaves.values(), rule=rule, feature_map=fmap, backend=backend, **kw)
        grads[backend] = torch.autograd.grad(o.square().sum(), inputs)
    for got, want in zip(grads["cpu"], grads["torch"], strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)
        grown(got)
    x = torch.randn(2, 9, 6, generator=gen, requires_grad=True)
    w = torch.randn(6, 4, generator=gen, requires_grad=True)
    y, _ = causal_conv(x, w, backend="cpu")
    for g in torch.autograd.grad(y.square().sum(), (x, w)):
        grown(g)
    grown(y)
