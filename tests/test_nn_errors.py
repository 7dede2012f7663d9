"""A generated catalogue of bad arguments for ``linattn.nn``, as ``tests/test_catalogue.py`` is for the API.

Every parameter of the constructors of ``LinearAttention``, ``SoftmaxAttention`` and ``CausalLM`` is crossed with
generic bad values (None, bools, numbers, NaN, inf, strings, containers, objects, tensors); every argument of
``forward`` (x or input_ids, cache, cu_seqlens) and of ``CausalLM.generate`` with mutations of its own kind (rank,
width, dtype, device, a cache from another layer, rule, feature map, batch or model, packed sequences with B != 1).
Each case ends in one of two ways:

- a ``ValueError`` or ``TypeError`` raised inside linattn's own files (the traceback's last frame, not torch's),
  whose message names the argument; or
- a documented result (``ACCEPTED`` says why): the module builds and runs; where the case changes the call, not
  the module, its output equals that of the base call.
"""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import linattn
from linattn import State
from linattn import nn as lnn

torch.set_num_threads(1)
LINATTN_DIR = Path(linattn.__file__).resolve().parent
HIDDEN, B, T = 24, 2, 5

GENERIC = [
    ("None", None), ("True", True), ("False", False), ("int 3", 3), ("int 0", 0), ("int -1", -1),
    ("float 0.5", 0.5), ("nan", math.nan), ("inf", math.inf), ("huge int", 10**400), ("str", "bogus"),
    ("list", []), ("dict", {}), ("object", object()), ("0-d tensor", torch.tensor(0.5)), ("numpy int", np.int64(3)),
]

# The module each constructor case changes one argument of.
BASE = {
    "LinearAttention": dict(hidden_size=HIDDEN, num_heads=2, head_dim=8, rule="gated_delta", num_v_heads=4,
                            v_head_dim=6, chunk_size=4),
    "SoftmaxAttention": dict(hidden_size=HIDDEN, num_heads=2, head_dim=8),
    "CausalLM": dict(vocab_size=40, hidden_size=HIDDEN, num_layers=2, num_heads=2, head_dim=8,
                     mixers=["gated_delta", "attention"], chunk_size=4),
}

# (module or call, argument, case label) -> why the value is valid.
ACCEPTED = {
    **{(m, "hidden_size", "int 3"): "any size >= 1" for m in BASE},
    **{(m, "num_heads", "int 3"): "any count >= 1" for m in ("SoftmaxAttention", "CausalLM")},
    ("LinearAttention", "head_dim", "int 3"): "any width >= 1",
    ("CausalLM", "vocab_size", "int 3"): "any vocabulary >= 1",
    ("LinearAttention", "feature_map", "None"): "q and k are features already",
    ("LinearAttention", "normalize", "None"): "the rule's own definition",
    ("LinearAttention", "normalize", "False"): "the delta rules define no normalizer",
    ("LinearAttention", "num_v_heads", "None"): "default num_heads",
    ("LinearAttention", "v_head_dim", "None"): "default head_dim",
    ("LinearAttention", "v_head_dim", "int 3"): "any width >= 1",
    ("LinearAttention", "conv_size", "int 3"): "any kernel size",
    ("LinearAttention", "conv_size", "int 0"): "no convolution",
    ("CausalLM", "intermediate_size", "int 0"): "blocks without an MLP",
    ("CausalLM", "max_position_embeddings", "int 0"): "no position embeddings",
    **{(m, arg, lab): "any kernel size; 0: none" for m, arg in (("SoftmaxAttention", "conv_size"),
                                                               ("CausalLM", "attention_conv_size"))
       for lab in ("int 3", "int 0")},
    **{("LinearAttention", "per_channel_gate", lab): "gated_delta has a gate" for lab in ("None", "True", "False")},
    ("LinearAttention", "gate_rank", "int 3"): "any rank >= 1",
    **{("LinearAttention", "output_gate", lab): "a bool" for lab in ("True", "False")},
    **{("LinearAttention", "norm_eps", lab): "any finite eps >= 0" for lab in ("int 3", "int 0", "float 0.5")},
    ("LinearAttention", "chunk_size", "int 3"): "any positive int",
    ("LinearAttention", "state_dtype", "None"): "linattn's own accumulation dtype",
    **{("SoftmaxAttention", "rope_base", lab): "any finite base > 0" for lab in ("int 3", "float 0.5")},
    ("CausalLM", "intermediate_size", "None"): "default 2 * hidden_size",
    ("CausalLM", "intermediate_size", "int 3"): "any width >= 1",
    # forward and generate
    **{(m, "x", lab): "any strides, any autograd flag" for m in ("LinearAttention", "SoftmaxAttention")
       for lab in ("non-contiguous", "requires grad")},
    **{(m, "cu_seqlens", lab): "any integer dtype" for m in BASE for lab in ("int32", "on the cpu as a view")},
    ("LinearAttention", "cache", "hand-built state"): "a State(S, z) without record is trusted, as in the API",
    ("CausalLM", "input_ids", "int32"): "any integer dtype",
    ("CausalLM", "input_ids", "non-contiguous"): "any strides",
    **{("generate", "max_new_tokens", lab): "any int >= 0" for lab in ("int 3", "int 0")},
}


def build(name: str, **changes) -> torch.nn.Module:
    torch.manual_seed(0)
    kw = BASE[name] | changes
    if name == "LinearAttention":
        return lnn.LinearAttention(kw.pop("hidden_size"), kw.pop("num_heads"), kw.pop("head_dim"), **kw)
    if name == "SoftmaxAttention":
        return lnn.SoftmaxAttention(kw.pop("hidden_size"), kw.pop("num_heads"), kw.pop("head_dim"), **kw)
    return lnn.CausalLM(kw.pop("vocab_size"), **kw)


def sample_input(module: torch.nn.Module, batch: int = B, length: int = T) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    if isinstance(module, lnn.CausalLM):
        return torch.randint(0, module.vocab_size, (batch, length), generator=gen)
    return torch.randn(batch, length, module.hidden_size, generator=gen)


def constructor_cases() -> list[tuple]:
    cases = []
    for name in BASE:
        cls = getattr(lnn, name)
        for arg, p in inspect.signature(cls).parameters.items():
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            cases += [(f"{name}-init-{arg}-{lab}", name, "init", arg, lab, value) for lab, value in GENERIC]
    cases += [("CausalLM-init-linear_kwargs-bogus", "CausalLM", "init", "bogus", "unknown keyword", 1),
              ("CausalLM-init-linear_kwargs-rule", "CausalLM", "init", "rule", "keyword of its own", "delta")]
    return cases


def _call_cases(name: str) -> list[tuple]:
    """forward (and generate) arguments of ``name``: (label, argument, value builder from the module)."""
    lm = name == "CausalLM"
    first = "input_ids" if lm else "x"
    out = []

    def x_mut(label, fn):
        out.append((label, first, fn))

    x_mut("numpy", lambda m: sample_input(m).numpy())
    x_mut("rank - 1", lambda m: sample_input(m)[0])
    x_mut("rank + 1", lambda m: sample_input(m)[None])
    x_mut("empty T", lambda m: sample_input(m)[:, :0])
    x_mut("empty B", lambda m: sample_input(m)[:0])
    x_mut("bool", lambda m: sample_input(m) > 0)
    x_mut("complex", lambda m: sample_input(m).to(torch.complex64))
    x_mut("meta", lambda m: sample_input(m).to("meta"))
    x_mut("non-contiguous", lambda m: sample_input(m).transpose(0, 1).contiguous().transpose(0, 1))
    if lm:
        x_mut("float", lambda m: sample_input(m).float())
        x_mut("int32", lambda m: sample_input(m).int())
        x_mut("id = vocab_size", lambda m: sample_input(m).clamp_max(0) + m.vocab_size)
        x_mut("id -1", lambda m: sample_input(m).clamp_max(0) - 1)
    else:
        x_mut("width + 1", lambda m: torch.randn(B, T, HIDDEN + 1))
        x_mut("int64", lambda m: torch.ones(B, T, HIDDEN, dtype=torch.int64))
        x_mut("float64", lambda m: sample_input(m).double())
        x_mut("float16", lambda m: sample_input(m).half())
        x_mut("requires grad", lambda m: sample_input(m).requires_grad_())

    def cu_mut(label, fn, length=T):
        out.append((label, "cu_seqlens", lambda m: (sample_input(m, 1, length), fn(m))))

    cu_mut("list", lambda m: [0, 2, T])
    cu_mut("float", lambda m: torch.tensor([0.0, 2.0, T]))
    cu_mut("bool", lambda m: torch.tensor([False, True]))
    cu_mut("2-D", lambda m: torch.tensor([[0, 2, T]]))
    cu_mut("one entry", lambda m: torch.tensor([0]))
    cu_mut("ends before T", lambda m: torch.tensor([0, 2, T - 1]))
    cu_mut("starts at 1", lambda m: torch.tensor([1, 2, T]))
    cu_mut("decreasing", lambda m: torch.tensor([0, 4, 2, T]))
    cu_mut("int32", lambda m: torch.tensor([0, 2, T], dtype=torch.int32))
    cu_mut("on the cpu as a view", lambda m: torch.tensor([9, 0, 2, T])[1:])
    out.append(("batch 2", "cu_seqlens", lambda m: (sample_input(m, 2, T), torch.tensor([0, 2, T]))))
    out.append(("with a cache", "cu_seqlens", lambda m: (sample_input(m, 1, T), torch.tensor([0, 2, T]),
                                                          m(sample_input(m, 1, 3))[1])))

    def cache_mut(label, fn):
        out.append((label, "cache", fn))

    cache_mut("tuple", lambda m: (1, 2))
    cache_mut("str", lambda m: "cache")
    cache_mut("other batch", lambda m: m(sample_input(m, 1, 3))[1])
    if name == "LinearAttention":
        cache_mut("a KVCache", lambda m: KV(m))
        cache_mut("other rule", lambda m: build(name, rule="delta")(sample_input(m, B, 3))[1])
        cache_mut("other feature map", lambda m: build(name, feature_map="elu1")(sample_input(m, B, 3))[1])
        cache_mut("other value width", lambda m: build(name, v_head_dim=5)(sample_input(m, B, 3))[1])
        cache_mut("other key width", lambda m: build(name, feature_map="taylor2")(sample_input(m, B, 3))[1])
        cache_mut("no conv", lambda m: lnn.LinearAttentionCache(own_cache(m).state, None))
        cache_mut("conv of other width", lambda m: lnn.LinearAttentionCache(own_cache(m).state, own_cache(m).conv[
            ..., 1:]))
        cache_mut("state not a State", lambda m: lnn.LinearAttentionCache(own_cache(m).state.S, own_cache(m).conv))
        cache_mut("state with z", lambda m: lnn.LinearAttentionCache(State(own_cache(m).state.S,
                                                                           own_cache(m).state.S[..., 0]),
                                                                     own_cache(m).conv))
        cache_mut("state on meta", lambda m: lnn.LinearAttentionCache(own_cache(m).state.to("meta"),
                                                                      own_cache(m).conv))
        cache_mut("hand-built state", lambda m: lnn.LinearAttentionCache(State(own_cache(m).state.S.clone()),
                                                                         own_cache(m).conv))
    elif name == "SoftmaxAttention":
        cache_mut("a LinearAttentionCache", lambda m: build("LinearAttention")(sample_input(m, B, 3))[1])
        cache_mut("other heads", lambda m: lnn.KVCache(*(t.repeat(1, 1, 2, 1) for t in kv(own_cache(m)))))
        cache_mut("v shorter", lambda m: lnn.KVCache(own_cache(m).k, own_cache(m).v[:, 1:]))
        cache_mut("float64", lambda m: lnn.KVCache(own_cache(m).k.double(), own_cache(m).v.double()))
        cache_mut("numpy", lambda m: lnn.KVCache(own_cache(m).k.detach().numpy(), own_cache(m).v.detach().numpy()))
    else:
        cache_mut("one entry short", lambda m: own_cache(m)[:1])
        cache_mut("layers swapped", lambda m: own_cache(m)[::-1])
        cache_mut("from a packed forward", lambda m: m(sample_input(m, 1, T), cu_seqlens=torch.tensor([0, 2, T]))[1])
        cache_mut("from another model", lambda m: build(name, mixers=["delta", "attention"])(sample_input(m, B, 3))[1])
        for lab, value in GENERIC:
            out.append((lab, "max_new_tokens", lambda m, value=value: value))
    return out


def KV(m):  # noqa: N802 - a KVCache of the right batch for a linear layer
    return lnn.KVCache(torch.zeros(B, 3, 2, 8), torch.zeros(B, 3, 2, 8))


def kv(cache):
    return cache.k, cache.v


def own_cache(m):
    """The module's own cache after a prefill of 3 tokens, the base every cache case continues."""
    return m(sample_input(m, B, 3))[1]


def call_cases() -> list[tuple]:
    cases = []
    for name in BASE:
        for label, arg, fn in _call_cases(name):
            where = "generate" if arg == "max_new_tokens" else "forward"
            cases.append((f"{name}-{where}-{arg}-{label}", name, where, arg, label, fn))
    return cases


CASES = constructor_cases() + call_cases()


def _names(message: str, arg: str) -> bool:
    return re.search(rf"(?<![A-Za-z_]){re.escape(arg)}(?![A-Za-z_])", message) is not None


def _accepted(name: str, where: str, arg: str, label: str) -> bool:
    return (("generate" if where == "generate" else name), arg, label) in ACCEPTED


def _run(name: str, where: str, arg: str, value, module=None):
    """The call of one case; returns (output, the base output to compare with, or None)."""
    if where == "init":
        module = build(name, **{arg: value})
        x = sample_input(module)
        y, cache = module(x)
        step, _ = module(x[:, :1], cache)  # and one decode step through the cache it made
        return y, None
    m = module
    if where == "generate":
        return m.generate(sample_input(m, B, 3), value), None
    if arg in ("x", "input_ids"):
        return m(value), m(sample_input(m))[0]
    if arg == "cu_seqlens":
        x, cu, *cache = value
        return m(x, *cache, cu_seqlens=cu), m(x, cu_seqlens=torch.tensor([0, 2, T]))
    x = sample_input(m, B, 1)
    return m(x, value)[0], m(x, own_cache(m))[0]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_nn_catalogue(case):
    _, name, where, arg, label, value = case
    module = None if where == "init" else build(name)
    if where != "init":
        value = value(module)
    if not _accepted(name, where, arg, label):
        with pytest.raises((ValueError, TypeError)) as info:
            _run(name, where, arg, value, module)
        last = Path(info.traceback[-1].path).resolve()
        assert LINATTN_DIR in last.parents, f"raised in {last}, not in linattn: {info.value!r}"
        assert _names(str(info.value), arg), f"message does not name {arg!r}: {info.value}"
        return
    out, expected = _run(name, where, arg, value, module)
    out = out[0] if isinstance(out, tuple) else out
    assert bool(torch.isfinite(out.float()).all())
    if expected is not None:
        expected = expected[0] if isinstance(expected, tuple) else expected
        assert (out - expected).abs().max() <= 1e-6 * max(1.0, float(expected.abs().max()))


@pytest.mark.parametrize(("kwargs", "arg"), [
    ({"num_layers": 0}, "num_layers"), ({"num_layers": 2.0}, "num_layers"), ({"attention_every": 0}, "attention_every"),
    ({"rule": "attention"}, "rule"), ({"rule": None}, "rule"),
])
def test_hybrid_pattern_errors(kwargs, arg):
    with pytest.raises((ValueError, TypeError), match=arg):
        lnn.hybrid_pattern(**({"num_layers": 4} | kwargs))
    assert lnn.hybrid_pattern(5, "delta", 2) == ["delta", "attention", "delta", "attention", "delta"]


def test_catalogue_covers_every_argument():
    for name in BASE:
        params = {a for a, p in inspect.signature(getattr(lnn, name)).parameters.items()
                  if p.kind is not inspect.Parameter.VAR_KEYWORD}
        assert {c[3] for c in CASES if c[1] == name and c[2] == "init"} >= params
        forward = set(inspect.signature(getattr(lnn, name).forward).parameters) - {"self"}
        assert {c[3] for c in CASES if c[1] == name and c[2] == "forward"} == forward
    assert {c[3] for c in CASES if c[2] == "generate"} == {"max_new_tokens"}
    assert len(CASES) > 300
