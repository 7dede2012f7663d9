"""linattn.nn: every mixer's full forward equals prefill at any split plus token-by-token decode through its cache;
packed sequences equal separate calls (caches included); gradients reach every parameter; the LM likewise."""

from __future__ import annotations

import pytest
import torch

from linattn import nn as lnn
from linattn.backends import cpu as cpu_backend

torch.set_num_threads(1)
MIXERS = [("accumulate", {}), ("gated", {}), ("gated", {"per_channel_gate": False}), ("delta", {}),
          ("gated_delta", {}), ("gated_delta", {"per_channel_gate": True}), ("attention", {}),
          ("attention", {"conv_size": 3})]
IDS = ["accumulate", "gla", "gated_per_head", "delta", "gated_deltanet", "kda", "attention", "attention_conv"]


def make_layer(name, kwargs, seed=0):
    torch.manual_seed(seed)
    if name == "attention":
        return lnn.SoftmaxAttention(24, 2, 8, **kwargs).double()
    return lnn.LinearAttention(24, 2, 8, rule=name, num_v_heads=4, v_head_dim=6, chunk_size=4, **kwargs).double()


def decode(layer, x, split):
    """Prefill ``split`` tokens (none if 0), then one token at a time through the cache."""
    ys, cache = [], None
    if split:
        y, cache = layer(x[:, :split])
        ys.append(y)
    for t in range(split, x.shape[1]):
        y, cache = layer(x[:, t:t + 1], cache)
        ys.append(y)
    return torch.cat(ys, dim=1), cache


@pytest.mark.parametrize(("name", "kwargs"), MIXERS, ids=IDS)
def test_layer_full_equals_prefill_then_decode(name, kwargs):
    layer = make_layer(name, kwargs)
    x = torch.randn(2, 11, 24, dtype=torch.float64)
    y, cache = layer(x)
    assert y.shape == x.shape
    for split in (0, 1, 5, 10):
        y_dec, cache_dec = decode(layer, x, split)
        assert (y_dec - y).abs().max() <= 1e-12, split
        if name != "attention":
            assert (cache_dec.state.S - cache.state.S).abs().max() <= 1e-12
        if name != "attention" or kwargs:
            assert (cache_dec.conv - cache.conv).abs().max() <= 1e-12


@pytest.mark.parametrize(("name", "kwargs"), MIXERS, ids=IDS)
def test_layer_packed_equals_separate_and_continues(name, kwargs):
    layer = make_layer(name, kwargs, seed=1)
    lengths = [5, 1, 0, 9]
    x = torch.randn(1, sum(lengths), 24, dtype=torch.float64)
    cu = torch.tensor([0] + lengths).cumsum(0)
    y, cache = layer(x, cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if a == b:
            continue
        y_i, cache_i = layer(x[:, a:b])
        assert (y[:, a:b] - y_i).abs().max() <= 1e-12
        if name != "attention":  # the packed cache continues each sequence as its own cache does
            assert (cache.state.S[i] - cache_i.state.S[0]).abs().max() <= 1e-12
            assert (cache.conv[i] - cache_i.conv[0]).abs().max() <= 1e-12


@pytest.mark.parametrize(("name", "kwargs"), MIXERS, ids=IDS)
def test_layer_gradients_reach_every_parameter(name, kwargs):
    layer = make_layer(name, kwargs, seed=2).float()
    x = torch.randn(2, 9, 24, requires_grad=True)
    y, _ = layer(x)
    (y.square().mean()).backward()
    for pname, p in layer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, pname
    assert x.grad.abs().max() > 0


def test_attention_conv_equals_hand_computation():
    """conv_size: a depthwise causal conv with SiLU over [q | k | v], then rotary and causal softmax, written out."""
    layer = make_layer("attention", {"conv_size": 3}, seed=3)
    B, T, H, D = 2, 7, 2, 8
    x = torch.randn(B, T, 24, dtype=torch.float64)
    y, cache = layer(x)
    qkv = torch.cat([x @ layer.q_proj.weight.T, x @ layer.k_proj.weight.T, x @ layer.v_proj.weight.T], dim=-1)
    w = layer.conv_weight  # [C, K]; tap j reads token t - (K - 1 - j)
    conv = torch.zeros_like(qkv)
    for t in range(T):
        for j in range(3):
            if t - (2 - j) >= 0:
                conv[:, t] += w[:, j] * qkv[:, t - (2 - j)]
    conv = conv * torch.sigmoid(conv)
    q, k, v = (conv[..., i * H * D:(i + 1) * H * D].reshape(B, T, H, D) for i in range(3))
    half = D // 2
    freqs = 10000.0 ** (-torch.arange(half, dtype=torch.float32) * 2 / D)  # angles in float32, as HF's
    ang = torch.arange(T, dtype=torch.float32)[:, None] * freqs  # [T, D/2]
    cos, sin = ang.cos()[None, :, None].double(), ang.sin()[None, :, None].double()

    def rot(a):
        return torch.cat([a[..., :half] * cos - a[..., half:] * sin, a[..., half:] * cos + a[..., :half] * sin], -1)

    q, k = rot(q), rot(k)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / D**0.5
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, H * D)
    assert (y - o @ layer.o_proj.weight.T).abs().max() <= 1e-12
    assert torch.equal(cache.conv, qkv[:, -2:])  # the last K-1 inputs, before the convolution


def test_attention_conv_cache_errors():
    conv, plain = make_layer("attention", {"conv_size": 3}), make_layer("attention", {})
    x = torch.randn(2, 3, 24, dtype=torch.float64)
    c_conv, c_plain = conv(x)[1], plain(x)[1]
    with pytest.raises(ValueError, match=r"cache\.conv is None but this layer has conv_size=3"):
        conv(x[:, :1], c_plain)
    with pytest.raises(ValueError, match=r"cache\.conv is set but this layer has conv_size=0"):
        plain(x[:, :1], c_conv)
    with pytest.raises(ValueError, match=r"cache\.conv"):
        conv(x[:, :1], lnn.KVCache(c_conv.k, c_conv.v, c_conv.conv[..., 1:]))
    with pytest.raises(ValueError, match="conv_size"):
        lnn.SoftmaxAttention(24, 2, 8, conv_size=-1)
    lm = lnn.CausalLM(30, 16, 2, 2, 8, mixers=["delta", "attention"], attention_conv_size=2, conv_size=3)
    assert lm.layers[1].mixer.conv_size == 2 and lm.layers[0].mixer.conv_size == 3


def test_gated_delta_decay_init_ranges():
    torch.manual_seed(4)
    default = lnn.LinearAttention(24, 2, 8, rule="gated_delta", num_v_heads=4)
    torch.manual_seed(4)
    spelled = lnn.LinearAttention(24, 2, 8, rule="gated_delta", num_v_heads=4, A_init_range=(1, 16),
                                  dt_init_range=(1e-3, 0.1))
    for (name, a), b in zip(default.state_dict().items(), spelled.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # the defaults are Mamba-2's ranges, drawn in the same order
    A, dt = default.A_log.exp(), torch.nn.functional.softplus(default.dt_bias)
    assert ((A >= 1) & (A <= 16)).all() and ((dt >= 1e-3 * (1 - 1e-6)) & (dt <= 0.1 * (1 + 1e-6))).all()
    slow = lnn.LinearAttention(24, 2, 8, rule="gated_delta", A_init_range=(1, 1), dt_init_range=(0.01, 0.01))
    assert torch.equal(slow.A_log.exp(), torch.ones(2))
    assert torch.allclose(torch.nn.functional.softplus(slow.dt_bias), torch.full((2,), 0.01), rtol=1e-6)
    for bad, err in (((2, 1), "low <= high"), ((0, 1), "> 0"), ((1,), "pair"), (1.0, "pair")):
        with pytest.raises((TypeError, ValueError), match=err):
            lnn.LinearAttention(24, 2, 8, A_init_range=bad)
    with pytest.raises(ValueError, match="dt_init_range"):
        lnn.LinearAttention(24, 2, 8, dt_init_range=(0.1, float("inf")))


def test_lm_hybrid_decode_packing_and_gradients():
    torch.manual_seed(0)
    model = lnn.CausalLM(40, hidden_size=24, num_layers=4, num_heads=2, head_dim=8,
                         mixers=lnn.hybrid_pattern(4, "gated_delta"), chunk_size=4).double()
    assert model.mixers == ["gated_delta", "gated_delta", "gated_delta", "attention"]
    ids = torch.randint(0, 40, (2, 10))
    logits, cache = model(ids)
    assert logits.shape == (2, 10, 40) and len(cache) == 4
    for split in (1, 6):
        outs, c = [model(ids[:, :split])[0]], model(ids[:, :split])[1]
        for t in range(split, 10):
            lt, c = model(ids[:, t:t + 1], c)
            outs.append(lt)
        assert (torch.cat(outs, dim=1) - logits).abs().max() <= 1e-11
    cu = torch.tensor([0, 4, 10])
    packed, _ = model(ids[:1].reshape(1, -1)[:, :10], cu_seqlens=cu)
    assert (packed[:, :4] - model(ids[:1, :4])[0]).abs().max() <= 1e-11
    assert (packed[:, 4:] - model(ids[:1, 4:])[0]).abs().max() <= 1e-11
    gen = model.generate(ids[:, :3], 4)
    assert gen.shape == (2, 7) and torch.equal(gen[:, :3], ids[:, :3])
    model.float()
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1])[0].reshape(-1, 40), ids[:, 1:].reshape(-1))
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, pname


@pytest.mark.parametrize("mixer", ["attention", "accumulate", "gated", "delta"])
def test_lm_every_mixer_prefill_decode(mixer):
    torch.manual_seed(1)
    model = lnn.CausalLM(30, hidden_size=16, num_layers=2, num_heads=2, head_dim=8, mixers=mixer).double()
    ids = torch.randint(0, 30, (1, 7))
    logits, _ = model(ids)
    out, c = model(ids[:, :3])
    outs = [out]
    for t in range(3, 7):
        lt, c = model(ids[:, t:t + 1], c)
        outs.append(lt)
    assert (torch.cat(outs, dim=1) - logits).abs().max() <= 1e-11


def test_nn_errors():
    with pytest.raises(ValueError, match="rule"):
        lnn.LinearAttention(16, 2, 8, rule="softmax")
    with pytest.raises(ValueError, match="num_v_heads"):
        lnn.LinearAttention(16, 2, 8, num_v_heads=3)
    with pytest.raises(ValueError, match="mixers"):
        lnn.CausalLM(10, 16, 2, 2, 8, mixers=["attention"])
    with pytest.raises(ValueError, match="mixers"):
        lnn.CausalLM(10, 16, 1, 2, 8, mixers="mamba")
    layer = lnn.LinearAttention(16, 2, 8)
    _, cache = layer(torch.randn(1, 3, 16))
    with pytest.raises(ValueError, match="cache"):
        layer(torch.randn(1, 3, 16), cache, cu_seqlens=torch.tensor([0, 3]))


@pytest.mark.parametrize("rule", ["accumulate", "gated", "delta", "gated_delta"])
def test_backend_reaches_every_linattn_call(rule, monkeypatch):
    """Forced backend="torch" and "cpu" (the numba kernel) give the same prefill and decode, layer and LM; the
    compiled module is entered only when asked for."""
    x = torch.randn(2, 11, 24)
    ys = {}
    for backend in ("torch", "cpu"):
        torch.manual_seed(0)
        layer = lnn.LinearAttention(24, 2, 8, rule=rule, chunk_size=4, backend=backend)
        with torch.no_grad():
            y, cache = layer(x[:, :7])
            steps = [y]
            for t in range(7, 11):
                y_t, cache = layer(x[:, t:t + 1], cache)
                steps.append(y_t)
        ys[backend] = torch.cat(steps, dim=1), cache.state.S
    assert (ys["cpu"][0] - ys["torch"][0]).abs().max() <= 1e-5 * ys["torch"][0].abs().max()
    assert (ys["cpu"][1] - ys["torch"][1]).abs().max() <= 1e-5 * ys["torch"][1].abs().max()
    # The keyword reaches the call: with parameters that require grad, "cpu" runs the compiled prefill and its
    # backward, "torch" never enters the compiled module.
    calls = []
    module = cpu_backend.kernel("cpu_prefill")
    real = module.prefill
    monkeypatch.setattr(module, "prefill", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for backend, expected in (("torch", 0), ("cpu", 1)):
        calls.clear()
        lnn.LinearAttention(24, 2, 8, rule=rule, backend=backend)(x)[0].sum().backward()
        assert len(calls) == expected, backend
    ids = torch.randint(0, 30, (2, 6))
    logits = {}
    for backend in ("torch", "cpu"):
        torch.manual_seed(0)
        lm = lnn.CausalLM(30, hidden_size=24, num_layers=2, num_heads=2, head_dim=8, mixers=[rule, "attention"],
                          backend=backend)
        with torch.no_grad():
            logits[backend] = lm.generate(ids, 3), lm(ids)[0]
    assert torch.equal(logits["cpu"][0], logits["torch"][0])
    assert (logits["cpu"][1] - logits["torch"][1]).abs().max() <= 1e-5 * logits["torch"][1].abs().max()
    with pytest.raises(ValueError, match="backend"):
        lnn.CausalLM(30, mixers="attention", backend="numba")


# ------------------------------------------------------------------------ mixer-only blocks, absolute positions
def test_mixer_only_blocks_and_hidden_states():
    torch.manual_seed(0)
    m = lnn.CausalLM(40, 16, 2, 2, 8, mixers="delta", intermediate_size=0)
    assert all(b.mlp is None and b.mlp_norm is None for b in m.layers)
    assert not any("mlp" in name for name, _ in m.named_parameters())
    ids = torch.randint(0, 40, (2, 9))
    logits, _ = m(ids)
    h, _ = m.hidden_states(ids)
    assert h.shape == (2, 9, 16)
    assert torch.equal(m.logits(h), logits)
    mask = ids > 20
    assert torch.equal(m.logits(h[mask]), logits[mask])


def test_absolute_positions_prefill_decode_and_packing():
    torch.manual_seed(1)
    m = lnn.CausalLM(30, 16, 2, 2, 8, mixers=["delta", "attention"], max_position_embeddings=12).double()
    ids = torch.randint(0, 30, (1, 12))
    full, _ = m(ids)
    logits, cache = m(ids[:, :5])
    steps = [logits]
    for t in range(5, 12):  # decode continues at positions 5, 6, ...
        logits, cache = m(ids[:, t:t + 1], cache)
        steps.append(logits)
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-10
    # each packed sequence starts again at position 0
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    packed, _ = m(ids, cu_seqlens=cu)
    for a, b in ((0, 4), (4, 12)):
        alone, _ = m(ids[:, a:b])
        assert (packed[:, a:b] - alone).abs().max() < 1e-10
    # positions matter: the same tokens shifted by one position give other logits
    assert (m(ids[:, 1:6])[0] - full[:, 1:6]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="max_position_embeddings"):
        m(ids[:, :1], cache)  # position 12 is past the table
    linear = lnn.CausalLM(30, 16, 1, 2, 8, mixers="delta", max_position_embeddings=8)
    _, c = linear(ids[:, :3])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        linear(ids[:, 3:4], c)  # no attention cache counts the positions


def test_sweep_models_follow_zoology():
    from linattn.tools.mqar.sweep import FULL, Job, train_config
    from linattn.tools.mqar.train import build_model
    att = build_model("attention", train_config(FULL, Job("attention", 64, 64, 4, 1e-2, 0)))
    lin = build_model("delta", train_config(FULL, Job("delta", 64, 64, 4, 1e-2, 0)))
    hyb = build_model("hybrid", train_config(FULL, Job("hybrid", 64, 64, 4, 1e-2, 0)))
    assert att.max_position_embeddings == lin.max_position_embeddings == hyb.max_position_embeddings == 0
    assert all(b.mixer.conv_size == 4 for model in (att, lin, hyb) for b in model.layers)  # every layer, as zoology
    assert all(b.mlp is None for model in (att, lin, hyb) for b in model.layers)
