"""The chunk form runs long sequences in slabs of whole chunks, carrying the state between them.

At test sizes every sequence fits in one slab, so these tests shrink the slab to a few chunks and check that the
result (outputs, final state, gradients) equals the float64 reference and the single-slab run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
import linattn.prefill as prefill
from linattn import State

pytestmark = pytest.mark.usefixtures("torch_forms")  # these check the torch forms themselves

RULES = ("accumulate", "gated", "delta", "gated_delta")


def inputs(rule: str, per_channel: bool = False, seed: int = 0):
    B, T, H, Dk, Dv = 2, 53, 3, 5, 7  # T is not a multiple of the chunk (4) nor of the slab (8)
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.rand(B, T, H, Dk, generator=gen, dtype=torch.float64), torch.rand(B, T, H, Dk, generator=gen,
                                                                                      dtype=torch.float64)
    v = torch.randn(B, T, H, Dv, generator=gen, dtype=torch.float64)
    kwargs = {"rule": rule, "chunk_size": 4}
    if rule in ("gated", "gated_delta"):
        shape = (B, T, H, Dk) if per_channel else (B, T, H)
        kwargs["g"] = -torch.rand(*shape, generator=gen, dtype=torch.float64) * 3
    if rule in ("delta", "gated_delta"):
        k = F.normalize(k, dim=-1)
        kwargs["beta"] = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
        S0 = State(torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64))
    else:
        S0 = State(torch.randn(B, H, Dk, Dv, generator=gen, dtype=torch.float64),
                   torch.rand(B, H, Dk, generator=gen, dtype=torch.float64))
    return (q, k, v), S0, kwargs


@pytest.fixture
def small_slabs(monkeypatch):
    monkeypatch.setattr(prefill, "slab_tokens", lambda heads, width, chunk_size, elem_bytes: 2 * chunk_size)


@pytest.mark.parametrize(("rule", "per_channel"), [(r, False) for r in RULES] + [("gated", True)])
def test_many_slabs_equal_the_reference(small_slabs, rule, per_channel):
    (q, k, v), S0, kwargs = inputs(rule, per_channel)
    o, state = linattn.linear_attention(q, k, v, initial_state=S0, output_final_state=True, **kwargs)
    o_ref, S_ref, z_ref = reference_call(q, k, v, initial_state=S0, **kwargs)
    assert o.is_contiguous()
    assert rel_err(o, o_ref) < 1e-10 and rel_err(state.S, S_ref) < 1e-10
    if z_ref is not None:
        assert rel_err(state.z, z_ref) < 1e-10


@pytest.mark.parametrize("rule", RULES)
def test_many_slabs_gradients_equal_one_slab(monkeypatch, rule):
    (q, k, v), S0, kwargs = inputs(rule, seed=1)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    extra = {name: kwargs[name].clone().requires_grad_() for name in ("g", "beta") if name in kwargs}

    def grads():
        o, state = linattn.linear_attention(*leaves, initial_state=S0, output_final_state=True,
                                            **{**kwargs, **extra})
        loss = (o * torch.linspace(-1, 1, o.shape[-1], dtype=o.dtype)).sum() + state.S.square().sum()
        return torch.autograd.grad(loss, leaves + list(extra.values()))

    one_slab = grads()
    monkeypatch.setattr(prefill, "slab_tokens", lambda heads, width, chunk_size, elem_bytes: 2 * chunk_size)
    many_slabs = grads()
    for a, b in zip(many_slabs, one_slab, strict=True):
        assert rel_err(a, b) < 1e-10


def test_slab_tokens_are_whole_chunks_within_budget():
    # B*H = 8 heads, Dk + Dv = 128, float32, chunks of 64: 4 MiB / (8 * 128 * 4 * 64) = 16 chunks
    assert prefill.slab_tokens(8, 128, 64, 4) == 16 * 64
    assert prefill.slab_tokens(8, 129, 64, 4) == 15 * 64  # whole chunks only, rounded down
    assert prefill.slab_tokens(4096, 128, 64, 4) == 64  # never less than one chunk
