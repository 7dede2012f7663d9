"""linattn.nn's decode step: outside autograd a ``linattn.Decoder`` kept on the cache updates it in place (the same
object back) and equals the functional path and the float64 reference for every rule, with and without the short
convolution, grouped value heads, batch > 1; one compiled call per layer per token; ``clone()`` branches; under
autograd the functional path keeps its gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import reference_call, rel_err

import linattn
from linattn import State, decode
from linattn import nn as lnn

pytest.importorskip("numba")
torch.set_num_threads(1)

MIXERS = [("accumulate", {}), ("gated", {}), ("gated", {"per_channel_gate": False}), ("delta", {}),
          ("gated_delta", {}), ("gated_delta", {"per_channel_gate": True})]
IDS = ["accumulate", "gla", "gated_per_head", "delta", "gated_deltanet", "kda"]


def make_layer(rule, kwargs, conv_size=4, seed=0, **extra):
    torch.manual_seed(seed)
    return lnn.LinearAttention(24, 2, 8, rule=rule, num_v_heads=4, v_head_dim=6, chunk_size=4, conv_size=conv_size,
                               **kwargs, **extra)


def reference_forward(layer, x, monkeypatch):
    """The layer's full forward in float64 with its linear attention computed by ``linattn.reference``."""
    ref_layer = copy.deepcopy(layer).double()

    def through_reference(q, k, v, *, initial_state=None, backend=None, **kw):
        o, S, z = reference_call(q, k, v, initial_state=initial_state, **kw)
        return torch.from_numpy(o), State(torch.from_numpy(S), None if z is None else torch.from_numpy(z))

    with monkeypatch.context() as mp, torch.no_grad():
        mp.setattr(linattn, "linear_attention", through_reference)
        return ref_layer(x.double())[0]


@pytest.mark.parametrize("conv_size", [0, 4])
@pytest.mark.parametrize(("rule", "kwargs"), MIXERS, ids=IDS)
def test_in_place_decode_equals_functional_path_and_reference(calls, monkeypatch, rule, kwargs, conv_size):
    layer = make_layer(rule, kwargs, conv_size)
    x = torch.randn(2, 9, 24, generator=torch.Generator().manual_seed(1))
    split = 4
    # Functional: parameters require grad, so autograd records and every step returns a new cache.
    y, cache = layer(x[:, :split])
    ys_fn = [y]
    for t in range(split, 9):
        before = cache.state.S.detach().clone()
        y, new = layer(x[:, t:t + 1], cache)
        assert new is not cache and torch.equal(cache.state.S, before)  # the old cache is left as it was
        ys_fn.append(y)
        cache = new
    assert not calls  # autograd records: the functional path
    # In place: outside autograd the same cache object comes back, its state updated where it lies.
    with torch.no_grad():
        y, cache_ip = layer(x[:, :split])
        ys_ip = [y]
        for t in range(split, 9):
            y, back = layer(x[:, t:t + 1], cache_ip)
            assert back is cache_ip
            if t == split:
                memory = cache_ip.state.S.data_ptr(), None if conv_size == 0 else cache_ip.conv.data_ptr()
            assert (cache_ip.state.S.data_ptr(), None if conv_size == 0 else cache_ip.conv.data_ptr()) == memory
            ys_ip.append(y)
    assert len(calls) == 9 - split  # one compiled call per token (batch 2, grouped heads), Kimi's gates too
    y_fn, y_ip = torch.cat(ys_fn, dim=1).detach(), torch.cat(ys_ip, dim=1)
    assert rel_err(y_ip, y_fn) < 1e-5
    assert rel_err(cache_ip.state.S, cache.state.S.detach()) < 1e-5
    if conv_size:
        assert torch.equal(cache_ip.conv, cache.conv.detach())
    assert rel_err(y_ip, reference_forward(layer, x, monkeypatch)) < 2e-4


def test_lm_decode_reaches_the_kernel_once_per_layer_per_token_and_keeps_the_tokens(calls):
    torch.manual_seed(3)
    model = lnn.CausalLM(50, hidden_size=32, num_layers=4, num_heads=2, head_dim=16,
                         mixers=lnn.hybrid_pattern(4, "gated_delta"), num_v_heads=4)
    ids = torch.randint(0, 50, (2, 6))
    gen = model.generate(ids, 7)
    assert len(calls) == 3 * 7  # three linear layers, seven steps (the last step's logits are not used)
    # The functional path (autograd records) picks the same tokens.
    logits, cache = model(ids)
    tokens = [ids]
    for _ in range(7):
        token = logits[:, -1:].argmax(-1)
        tokens.append(token)
        logits, cache = model(token, cache)
    assert torch.equal(gen, torch.cat(tokens, dim=1))
    assert len(calls) == 3 * 7


def test_clone_branches_a_generation(calls):
    layer = make_layer("gated_delta", {})
    x = torch.randn(1, 8, 24, generator=torch.Generator().manual_seed(4))
    a, b = x[:, 6:7], x[:, 7:8]
    with torch.no_grad():
        _, cache = layer(x[:, :6])
        layer(a, cache)  # the decoder is built and kept on the cache
        branch = cache.clone()
        assert decode.DECODERS.get(branch) is None and branch.state.S.data_ptr() != cache.state.S.data_ptr()
        assert torch.equal(branch.state.S, cache.state.S) and torch.equal(branch.conv, cache.conv)
        y_a, _ = layer(a, cache)
        y_b, back = layer(b, branch)
        assert back is branch
        # Each branch equals its own prefix run from scratch.
        _, fresh = layer(x[:, :6])
        layer(a, fresh)
        y_b_fresh, _ = layer(b, fresh)
        assert torch.equal(y_b, y_b_fresh) and not torch.equal(y_a, y_b)
        deep = copy.deepcopy(cache)  # copy and pickle take the tensors, not the decoder
        assert decode.DECODERS.get(deep) is None and torch.equal(deep.state.S, cache.state.S)
        assert torch.equal(layer(b, deep)[0], layer(b, cache)[0])


@pytest.mark.parametrize(("rule", "kwargs"), MIXERS, ids=IDS)
def test_decode_under_autograd_keeps_the_gradients(rule, kwargs):
    """Prefill then token-by-token decode with grad gives the gradients of the full forward (float64)."""
    layer = make_layer(rule, kwargs, seed=5).double()
    x = torch.randn(2, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    w = torch.randn(2, 7, 24, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    params = list(layer.parameters())
    full = torch.autograd.grad((layer(x)[0] * w).sum(), params)
    y, cache = layer(x[:, :3])
    ys = [y]
    for t in range(3, 7):
        y, cache = layer(x[:, t:t + 1], cache)
        ys.append(y)
    stepped = torch.autograd.grad((torch.cat(ys, dim=1) * w).sum(), params)
    for (name, _), g_full, g_step in zip(layer.named_parameters(), full, stepped, strict=True):
        assert (g_step - g_full).abs().max() <= 1e-9 * max(1.0, float(g_full.abs().max())), name


def test_replaced_state_layer_or_memory_rebuilds_the_decoder(calls):
    """A decoder follows the cache: a state object or layer put in its place, a state in another dtype, one from
    inference mode decoded outside it, one that requires grad: each decodes right (in place, from a copy where the
    memory cannot be written)."""
    layer = make_layer("gated_delta", {}, seed=8)
    x = torch.randn(1, 8, 24, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        _, expected = layer(x[:, :5])
        want = [layer(x[:, t:t + 1], expected)[0] for t in range(5, 8)]
        _, cache = layer(x[:, :5])
        first = decode.DECODERS.get(cache)
        assert torch.equal(layer(x[:, 5:6], cache)[0], want[0])
        dec = decode.DECODERS[cache][1]
        cache.state = State(cache.state.S.clone())  # replaced by hand (no record): a new decoder on it
        assert torch.equal(layer(x[:, 6:7], cache)[0], want[1])
        assert decode.DECODERS[cache][1] is not dec and first is None
        other = make_layer("gated_delta", {}, seed=8)  # an equal layer object, on a clone: decodes it right
        assert torch.equal(other(x[:, 7:8], cache.clone())[0], want[2])
    with torch.inference_mode():
        _, frozen = layer(x[:, :5])
    with torch.no_grad():
        assert frozen.state.S.is_inference()
        assert torch.equal(layer(x[:, 5:6], frozen)[0], want[0])  # decoded from a copy it can write
        assert not frozen.state.S.is_inference()
        _, mixed = layer(x[:, :5])
    with torch.inference_mode():  # a first step under inference mode, the next ones outside it
        assert torch.equal(layer(x[:, 5:6], mixed)[0], want[0])
        assert mixed.conv.is_inference()
    with torch.no_grad():
        assert torch.equal(layer(x[:, 6:7], mixed)[0], want[1])
        assert not mixed.conv.is_inference() and not mixed.state.S.is_inference()
        _, leaf = layer(x[:, :5])
        leaf.state = State(leaf.state.S.clone().requires_grad_(), rule="gated_delta", feature_map="l2",
                           normalized=False)
        assert torch.equal(layer(x[:, 5:6], leaf)[0], want[0])
    wide = make_layer("gated_delta", {}, seed=8, state_dtype=torch.float64)
    with torch.no_grad():
        _, c64 = wide(x[:, :5])
        c32 = c64.clone()
        y64 = wide(x[:, 5:6], c64)[0]
        c32.state = c32.state.to(torch.float32)  # decoded in the layer's state_dtype, as step would
        assert (wide(x[:, 5:6], c32)[0] - y64).abs().max() <= 1e-6
        assert c32.state.dtype == torch.float64


@pytest.mark.parametrize(("rule", "kwargs"), [MIXERS[1], MIXERS[4], MIXERS[5]], ids=["gla", "gated_deltanet", "kda"])
def test_bf16_layer_decodes_in_one_kernel_call_per_token(calls, rule, kwargs):
    """A bfloat16 layer (its cache's state float32): each decode step is one call of the kernel's bfloat16 entry
    on the layer's bfloat16 tokens, and agrees with the functional path (autograd recording): outputs to bfloat16
    rounding, states to float32 rounding."""
    layer = make_layer(rule, kwargs).to(torch.bfloat16)
    x = torch.randn(2, 7, 24, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y, cache = layer(x[:, :4])
    ys_fn = [y]
    for t in range(4, 7):
        y, cache = layer(x[:, t:t + 1], cache)
        ys_fn.append(y)
    assert not calls and cache.state.S.dtype == torch.float32
    with torch.no_grad():
        y, cache_ip = layer(x[:, :4])
        ys_ip = [y]
        for t in range(4, 7):
            y, back = layer(x[:, t:t + 1], cache_ip)
            assert back is cache_ip
            ys_ip.append(y)
    assert len(calls) == 3 and all(len(c) == 21 and c[18] for c in calls)  # decode_bf16, told which are bfloat16
    y_fn, y_ip = torch.cat(ys_fn, dim=1).detach(), torch.cat(ys_ip, dim=1)
    assert y_ip.dtype == torch.bfloat16
    # both steps accumulate in float32 and round o once (measured: outputs equal, states 5e-8 apart)
    assert rel_err(y_ip.float(), y_fn.float()) < 2**-8
    assert rel_err(cache_ip.state.S, cache.state.S.detach()) < 1e-5
