"""linattn.integrations.transformers against HF's own torch fallback, on a tiny randomly initialized Qwen3-Next
(2 layers: one Gated DeltaNet, one full attention; no download)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_tiny import modeling  # noqa: E402

from linattn import decode  # noqa: E402
from linattn.backends import cpu as cpu_backend  # noqa: E402
from linattn.integrations import transformers as lt  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="module")
def _qwen3_next_file():
    """transformers before 5 binds the rule per layer instance: the patch refuses it (tested with 5.24). Imported
    here, not at collection (seconds)."""
    modeling("qwen3_next")


def make_model(value_heads: int = 4):
    cfg = transformers.Qwen3NextConfig(
        vocab_size=96, hidden_size=48, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=value_heads,
        linear_key_head_dim=16, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=24, shared_expert_intermediate_size=24,
        layer_types=["linear_attention", "full_attention"],
    )
    torch.manual_seed(0)
    m = transformers.Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():  # HF initializes dt_bias to ones and A_log from one draw: vary them per head
        for layer in m.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.dt_bias.normal_(0, 1)
    return m


@pytest.fixture(scope="module")
def model():
    return make_model()


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


def test_full_pass_and_prefill_decode_match_hf_fallback(model):
    ids = torch.randint(0, 96, (2, 75))  # more than one chunk, not a multiple of 64
    with lt.use_hf_torch_fallback():
        ref_full, ref_dec = run(model, ids), run(model, ids, split=67)
    with lt.patch_qwen3_next():
        ours_full, ours_dec = run(model, ids), run(model, ids, split=67)
    scale = ref_full.abs().max()
    assert (ours_full - ref_full).abs().max() <= 1e-5 * scale
    assert (ours_dec - ref_dec).abs().max() <= 1e-5 * scale
    assert (ours_dec - ref_full).abs().max() <= 1e-5 * scale  # and decode agrees with the full pass


def test_patch_is_undone():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    before = m.torch_chunk_gated_delta_rule
    with lt.patch_qwen3_next() as patch:
        assert m.torch_chunk_gated_delta_rule.func is lt.chunk_gated_delta_rule
        assert m.torch_recurrent_gated_delta_rule.func is lt.recurrent_gated_delta_rule
        assert m.torch_chunk_gated_delta_rule.keywords["backend"] == "auto"
        assert patch.active and len(patch.replacements) == 4
    assert m.torch_chunk_gated_delta_rule is before
    with pytest.raises(ValueError, match="models"):
        lt.patch_qwen3_next(models=("llama",))
    for bad in ("qwen3_next", 3, (None,)):
        with pytest.raises(TypeError, match="models"):
            lt.patch_qwen3_next(models=bad)
    with pytest.raises(ValueError, match="backend"):
        lt.patch_qwen3_next(backend="cuda")
    with pytest.raises(ValueError, match="models"):  # a bad name later in the list patches nothing
        lt.patch_qwen3_next(models=("qwen3_next", "llama"))
    assert m.torch_chunk_gated_delta_rule is before


def test_backend_reaches_every_call(monkeypatch):
    """Forced "torch" and "cpu" (the numba kernel) give the same logits, prefill and decode, through the patch and
    through the converted layer, with equal and with grouped value heads."""
    equal_heads = make_model(value_heads=2)
    ids = torch.randint(0, 96, (2, 70))
    runs = {}
    for backend in ("torch", "cpu"):
        with lt.patch_qwen3_next(backend=backend):
            runs[backend] = run(equal_heads, ids), run(equal_heads, ids, split=66)
    scale = runs["torch"][0].abs().max()
    for ours, ref in zip(runs["cpu"], runs["torch"], strict=True):
        assert (ours - ref).abs().max() <= 1e-5 * scale
    hf_layer = equal_heads.model.layers[0].linear_attn
    x = torch.randn(1, 20, 48)
    with torch.no_grad():
        y = {b: lt.gated_deltanet_from_qwen3_next(hf_layer, backend=b)(x)[0] for b in ("torch", "cpu")}
    assert (y["cpu"] - y["torch"]).abs().max() <= 1e-5 * y["torch"].abs().max()
    # Grouped value heads too; a spy on the compiled prefill shows the forced backend reached the call.
    grouped = make_model(value_heads=4)
    calls, outs = [], {}
    module = cpu_backend.kernel("cpu_prefill")
    real = module.prefill
    monkeypatch.setattr(module, "prefill", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for backend in ("torch", "cpu"):
        calls.clear()
        with lt.patch_qwen3_next(backend=backend):
            outs[backend] = run(grouped, ids[:, :5])
        assert bool(calls) == (backend == "cpu"), backend
    assert (outs["cpu"] - outs["torch"]).abs().max() <= 1e-5 * outs["torch"].abs().max()
    with pytest.raises(ValueError, match="backend"):
        lt.gated_deltanet_from_qwen3_next(hf_layer, backend="gpu")


def test_gated_deltanet_loads_hf_state_dict(model):
    hf_layer = model.model.layers[0].linear_attn
    ours = lt.gated_deltanet_from_qwen3_next(hf_layer, chunk_size=16)
    torch.manual_seed(1)
    x = torch.randn(2, 40, 48)
    with lt.use_hf_torch_fallback(), torch.no_grad():
        y_hf = hf_layer(x)
        y, _ = ours(x)
        y_pre, cache = ours(x[:, :33])
        steps = [y_pre]
        for t in range(33, 40):
            y_t, cache = ours(x[:, t:t + 1], cache)
            steps.append(y_t)
    scale = y_hf.abs().max()
    assert (y - y_hf).abs().max() <= 1e-5 * scale
    assert (torch.cat(steps, dim=1) - y_hf).abs().max() <= 1e-5 * scale


def test_rule_with_cu_seqlens_equals_hf_per_sequence():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    hf_chunk = lt.hf_torch_fallback(m.torch_chunk_gated_delta_rule)
    gen = torch.Generator().manual_seed(2)
    lengths = [10, 0, 70]
    T, H, HV, Dk, Dv = sum(lengths), 2, 4, 8, 6
    q, k = (torch.randn(1, T, H, Dk, generator=gen) for _ in range(2))
    v = torch.randn(1, T, HV, Dv, generator=gen)
    g = -torch.rand(1, T, HV, generator=gen)
    beta = torch.rand(1, T, HV, generator=gen)
    S0 = torch.randn(len(lengths), HV, Dk, Dv, generator=gen)
    cu = torch.tensor([0] + lengths).cumsum(0)
    o, S = lt.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                     use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    for i in range(len(lengths)):
        a, b = int(cu[i]), int(cu[i + 1])
        if a == b:
            assert torch.equal(S[i], S0[i])
            continue
        o_i, S_i = hf_chunk(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], initial_state=S0[i:i + 1],
                            output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert (o[:, a:b] - o_i).abs().max() <= 1e-5 and (S[i] - S_i[0]).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------ packed sequences
def packed_layer():
    """Layer 0 of a tiny Qwen3-Next in float64 (conv kernel 4), so that packed and separate runs compare tightly."""
    return make_model().model.layers[0].linear_attn.double()


@pytest.mark.parametrize("lengths", [[5, 7], [1, 9], [3, 1, 2, 6], [2, 0, 1, 8], [12]])
def test_patched_layer_keeps_packed_sequences_apart(lengths):
    """Every sequence of a packed call (cu_seq_lens_q) equals that sequence run alone, forward and backward, with
    lengths 1 and shorter than the convolution kernel among them."""
    layer = packed_layer()
    assert layer.conv_kernel_size == 4
    gen = torch.Generator().manual_seed(sum(lengths) + len(lengths))
    T = sum(lengths)
    x = torch.randn(1, T, 48, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(1, T, 48, dtype=torch.float64, generator=gen)  # a loss weight, so every output counts
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    with lt.patch_qwen3_next():
        y = layer(x, cu_seq_lens_q=cu)
        grads = torch.autograd.grad((y * w).sum(), [x, *layer.parameters()])
        parts, loss = [], 0
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            if a < b:
                y_i = layer(x[:, a:b])
                parts.append(y_i)
                loss = loss + (y_i * w[:, a:b]).sum()
        ref_grads = torch.autograd.grad(loss, [x, *layer.parameters()])
    ref = torch.cat(parts, dim=1)
    assert (y - ref).abs().max() <= 1e-12 * ref.abs().max()
    names = ["x"] + [name for name, _ in layer.named_parameters()]
    for name, grad, ref_grad in zip(names, grads, ref_grads, strict=True):
        tol = 1e-6 if name == "A_log" else 1e-12  # HF takes A_log.float(): its gradient is float32 rounding
        assert (grad - ref_grad).abs().max() <= tol * ref_grad.abs().max(), name


def test_packed_layer_with_a_cache_continues_like_one_sequence():
    """With HF's cache the convolution sees the inputs the cache puts before the call: one packed sequence equals the
    unpacked call, prefill (shorter than the kernel) then a second prefill."""
    layer = packed_layer()
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 9, 48, dtype=torch.float64, generator=gen)
    cfg = make_model().config
    outs = {}
    with lt.patch_qwen3_next(), torch.no_grad():
        for packed in (False, True):
            cache = transformers.DynamicCache(config=cfg)
            kw = (lambda n: {"cu_seq_lens_q": torch.tensor([0, n])}) if packed else (lambda n: {})
            outs[packed] = torch.cat([layer(x[:, :2], cache=cache, **kw(2)), layer(x[:, 2:], cache=cache, **kw(7))],
                                     dim=1)
    assert (outs[True] - outs[False]).abs().max() <= 1e-12 * outs[False].abs().max()


@pytest.mark.parametrize("bad, error, match, name", [
    (torch.tensor([0, 7, 5, 12]), ValueError, "nondecreasing", "cu_seq_lens_q"),
    (torch.tensor([0, 5, 13]), ValueError, "end at T = 12", "cu_seq_lens_q"),
    (torch.tensor([0, 5, 10]), ValueError, "end at T = 12", "cu_seqlens"),  # the rule's name: the convolution
    (torch.tensor([1, 5, 12]), ValueError, "start at 0", "cu_seq_lens_q"),  # reads 2 inputs before as a cache's
    (torch.tensor([0.0, 5.0, 12.0]), TypeError, "integer tensor", "cu_seq_lens_q"),
    ([0, 5, 12], TypeError, "torch.Tensor", "cu_seq_lens_q"),
])
def test_patched_layer_refuses_bad_cu_seq_lens(bad, error, match, name):
    """A bad cu_seq_lens_q is a linattn error naming it (or the rule's own name for it, cu_seqlens), not a traceback
    from inside torch."""
    layer = packed_layer()
    x = torch.randn(1, 12, 48, dtype=torch.float64)
    with lt.patch_qwen3_next(), pytest.raises(error, match=f"^{name}[: ].*{match}"):
        layer(x, cu_seq_lens_q=bad)
    with pytest.raises(error, match=f"^cu_seqlens .*{match}"):  # the rule function on its own names its argument
        q = torch.randn(1, 12, 2, 8)
        lt.chunk_gated_delta_rule(q, q, q, -torch.rand(1, 12, 2), torch.rand(1, 12, 2), cu_seqlens=bad)


# ------------------------------------------------------------------------------------------------ nested patches
def test_patches_undo_in_any_order():
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    names = list(lt.FAMILIES["gated_delta"][1])
    before = {name: getattr(m, name) for name in names}
    for order in ((0, 1), (1, 0)):
        patches = [lt.patch_qwen3_next(backend="torch"), lt.patch_qwen3_next(backend="cpu")]
        assert m.torch_chunk_gated_delta_rule.keywords["backend"] == "cpu"  # the latest patch is in force
        patches[order[0]].undo()
        survivor = patches[order[1]]
        assert m.torch_chunk_gated_delta_rule.keywords["backend"] == (survivor is patches[0] and "torch" or "cpu")
        survivor.undo()
        assert {name: getattr(m, name) for name in names} == before, order
        survivor.undo()  # undoing twice does nothing
        patches[order[0]].undo()
        assert {name: getattr(m, name) for name in names} == before
    # The HF fallback inside a patch is HF's own code, not the patch it sits on.
    with lt.patch_qwen3_next(), lt.use_hf_torch_fallback():
        assert m.torch_chunk_gated_delta_rule is lt.hf_torch_fallback(before["torch_chunk_gated_delta_rule"])
        assert m.torch_recurrent_gated_delta_rule is lt.hf_torch_fallback(before["torch_recurrent_gated_delta_rule"])
    assert {name: getattr(m, name) for name in names} == before


def test_packed_convolution_refuses_what_it_cannot_run():
    """The packed convolution is SiLU or none, with or without a bias, on one row; anything else is an error naming
    what was wrong, and an unpacked call with another activation is HF's own."""
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    hf_conv = lt.hf_torch_fallback(m.causal_conv1d_fn)
    x, w, cu = torch.randn(1, 6, 10), torch.randn(6, 4), torch.tensor([0, 4, 10])
    with pytest.raises(ValueError, match="activation='gelu'"):
        lt.causal_conv1d_fn(x, w, activation="gelu", fallback=hf_conv, cu_seq_lens_q=cu)
    bias = torch.randn(6)
    with_bias = lt.causal_conv1d_fn(x, w, bias, activation="silu", fallback=hf_conv, cu_seq_lens_q=cu)
    alone = torch.cat([hf_conv(x[..., :4], w, bias, "silu"), hf_conv(x[..., 4:], w, bias, "silu")], dim=-1)
    assert (with_bias - alone).abs().max() <= 1e-6 * alone.abs().max()
    with pytest.raises(ValueError, match="cu_seq_lens_q: .*batch size 1"):
        lt.causal_conv1d_fn(x.expand(2, -1, -1), w, activation="silu", fallback=hf_conv, cu_seq_lens_q=cu)
    assert torch.equal(lt.causal_conv1d_fn(x, w, activation="gelu", fallback=hf_conv), hf_conv(x, w, None, "gelu"))
    packed = lt.causal_conv1d_fn(x, w, activation="silu", fallback=hf_conv, cu_seq_lens_q=cu)
    alone = torch.cat([hf_conv(x[..., :4], w, None, "silu"), hf_conv(x[..., 4:], w, None, "silu")], dim=-1)
    assert (packed - alone).abs().max() <= 1e-6 * alone.abs().max()


# ------------------------------------------------------------------------------------------------ decode in place
@pytest.mark.parametrize("B", [1, 2])
def test_decode_loop_updates_hf_cache_in_place_with_one_call_per_token(calls, B):
    """HF's decode loop through the patch: the cache's state tensor is updated where it lies (the same object, the
    same memory), the compiled decode kernel runs once per token, and logits and state equal HF's own code."""
    import gc

    model = make_model(value_heads=4)  # grouped value heads
    ids = torch.randint(0, 96, (B, 12), generator=torch.Generator().manual_seed(B))
    states = {}
    for name, patch in (("hf", lt.use_hf_torch_fallback), ("ours", lt.patch_qwen3_next)):
        held = len(decode.DECODERS)
        with patch(), torch.no_grad():
            out = model(ids[:, :5], use_cache=True)
            cache, logits = out.past_key_values, [out.logits]
            S = cache.layers[0].recurrent_states[0]
            memory = S.data_ptr()
            calls.clear()
            for t in range(5, 12):
                out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
                logits.append(out.logits)
                assert cache.layers[0].recurrent_states[0] is S and S.data_ptr() == memory
            assert len(decode.DECODERS) == held  # the one kernel call per token needs no Decoder kept
        states[name] = torch.cat(logits, dim=1), S.clone()
        assert len(calls) == (7 if name == "ours" else 0)
        del out, cache, S
        gc.collect()
        assert len(decode.DECODERS) == held
    scale = states["hf"][0].abs().max()
    assert (states["ours"][0] - states["hf"][0]).abs().max() <= 1e-5 * scale
    assert (states["ours"][1] - states["hf"][1]).abs().max() <= 1e-5 * states["hf"][1].abs().max()


def test_recurrent_rule_writes_the_state_only_when_it_returns_it():
    """The decode function on its own: in place when the final state is asked for outside autograd (the same tensor
    back); the caller's state left as it was without output_final_state or under autograd (gradients flow)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    hf_step = lt.hf_torch_fallback(m.torch_recurrent_gated_delta_rule)
    gen = torch.Generator().manual_seed(11)
    q, k = (torch.randn(2, 1, 2, 8, generator=gen) for _ in range(2))
    v = torch.randn(2, 1, 4, 6, generator=gen)
    g, beta = -torch.rand(2, 1, 4, generator=gen), torch.rand(2, 1, 4, generator=gen)
    S0 = torch.randn(2, 4, 8, 6, generator=gen)
    o_ref, S_ref = hf_step(q, k, v, g, beta, initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    S = S0.clone()
    with torch.no_grad():
        o, S_out = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    assert S_out is S and (S - S_ref).abs().max() <= 1e-5 and (o - o_ref).abs().max() <= 1e-5
    S = S0.clone()
    o, none = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, use_qk_l2norm_in_kernel=True)
    assert none is None and torch.equal(S, S0) and (o - o_ref).abs().max() <= 1e-5
    S = S0.clone().requires_grad_()
    o, S_out = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    assert S_out is not S and torch.equal(S.detach(), S0) and (S_out - S_ref).abs().max() <= 1e-5
    o.sum().backward()
    assert S.grad is not None and S.grad.abs().max() > 0
    with torch.inference_mode():  # a state made under inference mode: in place there, left as it is outside it
        S = S0.clone()
        assert lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)[1] is S
    with torch.no_grad():
        o, S_out = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    assert S_out is not S and (o - hf_step(q, k, v, g, beta, initial_state=S, use_qk_l2norm_in_kernel=True)[0]
                               ).abs().max() <= 1e-5
