"""The compiled CPU kernels (``backend="cpu"``) against the float64 reference, and the dispatch around them.

Shapes are awkward on purpose (T not a multiple of any chunk, odd widths, B and H > 1, Dk != Dv); gates are drawn
near 0 (g = -30), near 1 (g = -1e-4), at -inf (a full reset) and across the range. Tolerances are those of the
torch forms in test_forms.py: 2e-3 for float32 (the token loop typically reaches 1e-6), 2e-2 for bfloat16 inputs.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers import check_state_and_output as check
from helpers import kernel_inputs, np64, reference_call, rel_err

import linattn
from linattn import State, backends
from linattn.backends import cpu as cpu_backend

pytest.importorskip("numba")

# (rule, gate kind, normalize)
VARIANTS = [
    ("accumulate", None, True),
    ("accumulate", None, False),
    ("gated", "head", True),
    ("gated", "channel", True),
    ("gated", "head", False),
    ("delta", None, False),
    ("gated_delta", "head", False),
]


def make(rule, gate, H=3, **kw):
    return kernel_inputs(rule, gate, Hq=H, **kw)


@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
def test_prefill_matches_reference(rule, gate, normalize):
    q, k, v, kw = make(rule, gate)
    B, _, H, Dk = q.shape
    Dv = v.shape[-1]
    gen = torch.Generator().manual_seed(1)
    init = State(torch.randn(B, H, Dk, Dv, generator=gen), torch.rand(B, H, Dk, generator=gen) if normalize else None)
    for eps, eps_mode in ((1e-6, "add"), (0.5, "clamp")):
        args = dict(kw, normalize=normalize, eps=eps, eps_mode=eps_mode, initial_state=init)
        o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
        assert o.dtype == torch.float32 and o.shape == v.shape
        check(o, S, reference_call(q, k, v, **args), 2e-4)
    # The caller's initial state is not modified.
    assert torch.equal(init.S, State(torch.randn(B, H, Dk, Dv, generator=torch.Generator().manual_seed(1))).S)


@pytest.mark.parametrize("rule,gate,normalize", VARIANTS[::2] + [VARIANTS[3]])
def test_bfloat16_inputs_float32_state(rule, gate, normalize):
    q, k, v, kw = make(rule, gate, dtype=torch.bfloat16, T=70)
    if "g" in kw:
        kw["g"] = kw["g"].to(torch.bfloat16)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", normalize=normalize, output_final_state=True, **kw)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    check(o, S, reference_call(q, k, v, normalize=normalize, **kw), 2e-2)


@pytest.mark.parametrize("feature_map", ["elu1", "taylor2"])
def test_feature_maps_and_scale(feature_map):
    q, k, v, kw = make("gated", "head", Dk=4)
    args = dict(kw, feature_map=feature_map, scale=0.7)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    check(o, S, reference_call(q, k, v, **args), 2e-4)


@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
def test_step_in_place_matches_reference(rule, gate, normalize):
    """Decode token by token with inplace=True: one buffer throughout, equal to the reference's prefill."""
    q, k, v, kw = make(rule, gate, B=2, T=12, H=3)
    state = None
    outs = []
    for t in range(q.shape[1]):
        tok = {n: x[:, t] for n, x in kw.items() if isinstance(x, torch.Tensor)}
        o, new = linattn.step(q[:, t], k[:, t], v[:, t], state, rule=rule, normalize=normalize, backend="cpu",
                              inplace=state is not None, **tok)
        if state is not None:
            assert new.S.data_ptr() == state.S.data_ptr()  # updated where it lies
        state = new
        outs.append(o)
    check(torch.stack(outs, dim=1), state, reference_call(q, k, v, normalize=normalize, **kw), 2e-4)


def test_step_not_in_place_leaves_state():
    q, k, v, kw = make("gated_delta", "head", T=1, gates="range")
    state = State(torch.randn(2, 3, 5, 7))
    before = state.S.clone()
    tok = {n: x[:, 0] for n, x in kw.items() if isinstance(x, torch.Tensor)}
    o, new = linattn.step(q[:, 0], k[:, 0], v[:, 0], state, rule="gated_delta", backend="cpu", **tok)
    assert torch.equal(state.S, before)
    o_t, new_t = linattn.step(q[:, 0], k[:, 0], v[:, 0], state, rule="gated_delta", backend="torch", **tok)
    assert rel_err(o, np64(o_t)) < 1e-5 and rel_err(new.S, np64(new_t.S)) < 1e-5


def test_auto_uses_torch_when_grad_is_needed():
    q, k, v, kw = make("delta", None)
    q.requires_grad_(True)
    o, _ = linattn.linear_attention(q, k, v, **kw)
    assert o.grad_fn is not None  # the torch form ran (the compiled kernel has no backward)
    o.sum().backward()
    assert q.grad is not None
    o_cpu, _ = linattn.linear_attention(q, k, v, backend="cpu", **kw)  # forced: the compiled backward
    assert o_cpu.grad_fn is not None and rel_err(o_cpu, np64(o)) < 1e-5
    with torch.no_grad():  # no graph asked for: the compiled kernel may run
        o_cpu, _ = linattn.linear_attention(q, k, v, backend="cpu", **kw)
    assert rel_err(o_cpu, np64(o)) < 1e-5


def test_auto_and_torch_agree_and_unsupported_state_dtype():
    q, k, v, kw = make("gated", "channel", gates="range")  # (the torch forms' -inf gates: branch gates)
    o_auto, _ = linattn.linear_attention(q, k, v, **kw)
    o_torch, _ = linattn.linear_attention(q, k, v, backend="torch", **kw)
    assert rel_err(o_auto, np64(o_torch)) < 1e-5
    o64, _ = linattn.linear_attention(q, k, v, state_dtype=torch.float64, **kw)  # auto: torch form in float64
    assert rel_err(o64, reference_call(q, k, v, **kw)[0]) < 1e-6
    with pytest.raises(ValueError, match="float32 state"):
        linattn.linear_attention(q, k, v, backend="cpu", state_dtype=torch.float64, **kw)


def test_bad_backend_names_the_argument():
    q, k, v, _ = make("accumulate", None)
    with pytest.raises(ValueError, match="backend"):
        linattn.linear_attention(q, k, v, backend="gpu")
    with pytest.raises(ValueError, match="backend"):
        linattn.step(q[:, 0], k[:, 0], v[:, 0], backend=None)


def test_missing_numba_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(cpu_backend, "_modules", {})
    monkeypatch.setattr(cpu_backend, "_failed", None)
    monkeypatch.setitem(__import__("sys").modules, "linattn.kernels.cpu_prefill", None)  # import now fails
    q, k, v, kw = make("gated_delta", "head", gates="range")
    with pytest.warns(RuntimeWarning, match="compiled CPU kernels unavailable"):
        o, _ = linattn.linear_attention(q, k, v, backend="cpu", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only one warning per process
        o2, _ = linattn.linear_attention(q, k, v, **kw)
    assert torch.equal(o, o2)
    assert rel_err(o, reference_call(q, k, v, **kw)[0]) < 2e-3


def test_dispatch_refuses_what_the_kernel_does_not_know():
    """Arguments the compiled kernel does not take go to the torch forms (packed sequences and grouped value heads
    it takes: tests/test_kernels_cpu_prefill.py)."""
    q, k, v, kw = make("gated_delta", "head", B=1, T=9, H=2, gates="range")
    S = torch.zeros(1, 2, 5, 7)
    common = dict(rule="gated_delta", form="chunk", q=q, k=k, v=v, g=kw["g"], beta=kw["beta"], state=S, fmap=None,
                  scale=None, normalize=False, eps=1e-6, eps_mode="add", grad=False)
    assert backends.linear_attention("auto", **common, cu_seqlens=None) is not None
    assert backends.linear_attention("auto", **common, sliding_window=4) is None
    with pytest.raises(ValueError, match="sliding_window"):
        backends.linear_attention("cpu", **common, sliding_window=4)
    assert backends.linear_attention("torch", **common) is None


def test_step_half_precision_inputs_float32_state():
    q, k, v, kw = make("gated", "channel", T=1, gates="range")
    tok = {n: x[:, 0].to(torch.bfloat16) for n, x in kw.items() if isinstance(x, torch.Tensor)}
    q, k, v = (x[:, 0].to(torch.bfloat16) for x in (q, k, v))
    state = State(torch.rand(2, 3, 5, 7), torch.rand(2, 3, 5))
    o, new = linattn.step(q, k, v, state, rule="gated", backend="cpu", **tok)
    o_t, new_t = linattn.step(q, k, v, state, rule="gated", backend="torch", **tok)
    assert o.dtype == torch.bfloat16 and new.S.dtype == torch.float32
    assert rel_err(o, np64(o_t)) < 1e-2
    assert rel_err(new.S, np64(new_t.S)) < 1e-5 and rel_err(new.z, np64(new_t.z)) < 1e-5


def test_serial_and_parallel_builds_have_cache_entries_of_their_own():
    """numba names a disk-cache entry after the function, not its options: two builds of one kernel sharing a
    name load one build for both (the parallel prefill then ran on one thread)."""
    from linattn.kernels import cpu_backward, cpu_loop, cpu_prefill

    names = set()
    for module, kernel in ((cpu_loop, "token_loop"), (cpu_backward, "backward")):
        par, ser = getattr(module, f"{kernel}_parallel"), getattr(module, f"{kernel}_serial")
        assert par.targetoptions.get("parallel") is True and not ser.targetoptions.get("parallel")
        names |= {par._cache._cache_file._index_name, ser._cache._cache_file._index_name}
    assert len(names) == 4, names
    # the prefill has one serial build (threads split its units): compiled once, whatever the thread count
    assert not cpu_prefill.prefill_kernel.targetoptions.get("parallel")
    assert not hasattr(cpu_prefill, "prefill_parallel")
