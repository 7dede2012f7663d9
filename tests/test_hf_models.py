"""Whole tiny models of every family through linattn's transformers patch: logits against HF's own torch code
(prefill and decode through HF's cache), greedy generation, one training step's gradients, and the cache's
recurrent state updated in place by one compiled call per layer and token.

HF's torch functions of the rules compute in float32 even for float64 models, and the models round to float32 in
places of their own (gated norms, ``A_log.float()``), so float32 rounding is the tolerance at this level; the
functions themselves are checked against the float64 definition to 1e-10 in test_hf_functions."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_tiny import V, make_model  # noqa: E402

from linattn.integrations import transformers as lt  # noqa: E402

torch.set_num_threads(1)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


def run(model, ids, split=None):
    """Logits of a full pass, or of a prefill of ``split`` tokens then one token at a time through HF's cache."""
    with torch.no_grad():
        if split is None:
            return model(ids).logits
        out = model(ids[:, :split], use_cache=True)
        cache, logits = out.past_key_values, [out.logits]
        for t in range(split, ids.shape[1]):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits)
        return torch.cat(logits, dim=1)


def generate(model, ids):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=10, do_sample=False, min_new_tokens=10)


@pytest.mark.parametrize("model_type", lt.MODELS)
def test_logits_decode_and_generate_match_hf(model_type):
    ids = torch.randint(3, V, (2, 21), generator=torch.Generator().manual_seed(1))
    model = make_model(transformers, model_type, torch.float32)
    with lt.use_hf_torch_fallback((model_type,)):
        ref, ref_dec, ref_tokens = run(model, ids), run(model, ids, split=14), generate(model, ids[:1, :6])
    with lt.patch((model_type,)):
        full, dec, tokens = run(model, ids), run(model, ids, split=14), generate(model, ids[:1, :6])
    assert rel(full, ref) <= 1e-5 and rel(dec, ref_dec) <= 1e-5  # HF's own Bamba decode differs from its full
    # pass by 1.5e-4 (in float64 too): decode is compared with HF's decode
    assert torch.equal(tokens, ref_tokens)
    model64 = copy.deepcopy(model).double()
    with lt.patch((model_type,)):
        full64, dec64 = run(model64, ids), run(model64, ids, split=14)
    # The models themselves round to float32 in places (gated norms, A_log.float(), the Kimi gate), where a
    # float64 difference of 1e-16 can flip the last float32 bit: float32 rounding is the bound here too.
    assert rel(full64, ref) <= 1e-5 and rel(dec64, ref_dec) <= 1e-5
    if model_type != "bamba":
        assert rel(dec64, full64) <= 1e-6


@pytest.mark.parametrize("model_type", lt.MODELS)
def test_training_step_gradients_match_hf(model_type):
    ids = torch.randint(3, V, (2, 19), generator=torch.Generator().manual_seed(2))
    model = make_model(transformers, model_type, torch.float64).train()
    grads = {}
    for name, ctx in (("hf", lt.use_hf_torch_fallback), ("ours", lt.patch)):
        model.zero_grad()
        with ctx((model_type,)):
            model(ids, labels=ids).loss.backward()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["ours"].keys() == grads["hf"].keys() and grads["hf"]
    worst = max(rel(grads["ours"][n], g) for n, g in grads["hf"].items() if g.abs().max() > 0)
    assert worst <= 1e-5, worst  # HF's functions round to float32 inside (measured: up to 3.2e-6)


@pytest.mark.parametrize("model_type", ["mamba2", "granitemoehybrid", "kimi_linear", "qwen3_5"])
def test_cache_state_is_updated_in_place(model_type, calls):
    """A decode step writes the recurrent state where the cache holds it: same tensor, same memory, every token
    one compiled decode call per recurrent layer (Kimi's per-channel gates too)."""
    model = make_model(transformers, model_type, torch.float32)
    ids = torch.randint(3, V, (1, 12), generator=torch.Generator().manual_seed(3))
    with lt.patch((model_type,)), torch.no_grad():
        out = model(ids[:, :6], use_cache=True)
        cache = out.past_key_values
        layers = [layer for layer in cache.layers if getattr(layer, "recurrent_states", None)]
        states = [layer.recurrent_states[0] for layer in layers]
        memory = [S.data_ptr() for S in states]
        before = [S.clone() for S in states]
        calls.clear()
        for t in range(6, 12):
            cache = model(ids[:, t:t + 1], cache=cache, use_cache=True).past_key_values
        assert [layer.recurrent_states[0] for layer in layers] == states or all(
            a is b for a, b in zip((layer.recurrent_states[0] for layer in layers), states, strict=True))
        assert [S.data_ptr() for S in states] == memory
        assert all(not torch.equal(S, b) for S, b in zip(states, before, strict=True))
    assert len(calls) == 6 * len(states)


def recurrent_layer(model, model_type):
    """The model's first layer that calls its family's rule (or, for LFM2, its convolution) at call time."""
    name = next(iter(lt.FAMILIES[lt.FAMILY_OF[model_type]][1]))
    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        code = getattr(getattr(forward, "__wrapped__", forward), "__code__", None)
        while forward is not None and code is not None and name not in code.co_names and hasattr(forward,
                                                                                               "__wrapped__"):
            forward = forward.__wrapped__
            code = getattr(forward, "__code__", None)
        if code is not None and name in code.co_names:
            return module
    raise AssertionError(f"no layer of {model_type} calls {name}")


@pytest.mark.parametrize("model_type", ["mamba2", "falcon_h1", "kimi_linear", "qwen3_5", "lfm2"])
@pytest.mark.parametrize("packing", ["cu_seq_lens_q", "seq_idx"])
def test_packed_layer_equals_each_sequence_alone(model_type, packing):
    """A layer called on packed sequences (HF's keyword arguments) gives each sequence what it gives alone, the
    convolution and the state restarting at every boundary, forward and backward (float64; the layers' gated
    norms round to float32, which bounds the agreement: a leak across a boundary would be of order 1)."""
    if packing == "seq_idx" and lt.FAMILY_OF[model_type] != "mamba2":
        pytest.skip("seq_idx is Mamba's")
    layer = recurrent_layer(make_model(transformers, model_type, torch.float64), model_type)
    lengths = [3, 1, 9, 5]
    hidden = layer.hidden_size if hasattr(layer, "hidden_size") else 24
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(1, sum(lengths), hidden, dtype=torch.float64, generator=gen, requires_grad=True)
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    kw = {packing: cu if packing != "seq_idx" else
          torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))[None].int()}
    with lt.patch((model_type,)):
        y = layer(x, **kw)
        y = y[0] if isinstance(y, tuple) else y
        alone = [layer(x[:, a:b]) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
        ref = torch.cat([o[0] if isinstance(o, tuple) else o for o in alone], dim=1)
    assert rel(y, ref) <= 1e-6
    w = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    (gx,) = torch.autograd.grad((y * w).sum(), x)
    (gx_ref,) = torch.autograd.grad((ref * w).sum(), x)
    assert rel(gx, gx_ref) <= 1e-6
