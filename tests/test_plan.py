"""linattn.plan: which backend a call runs on and why, without running it, and in agreement with what the call
then does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn.backends import TRANSFORM_REFUSAL
from linattn.backends import cpu as cpu_backend


def sequence(B=2, T=7, H=3, D=5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, dtype=dtype) for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=dtype))
    return q, k, v, g


def test_cpu_taken_and_the_call_runs_it(monkeypatch):
    q, k, v, g = sequence()
    plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g)
    assert (plan.runs, plan.kernel, plan.why) == ("cpu", "cpu", "the numba kernels take the call")
    assert str(plan) == "cpu: the numba kernels take the call"
    ran = []
    real = cpu_backend.prefill
    monkeypatch.setattr(cpu_backend, "prefill", lambda *a: ran.append(1) or real(*a))
    linattn.linear_attention(q, k, v, rule="gated", g=g)
    assert ran == [1]


def test_mamba_like_prefill_runs_the_grouped_chunk_form(monkeypatch):
    """A long plain gated prefill with one gate per head and many value heads per q/k head (Mamba-2's scan): the CPU
    backend's grouped matmuls, and the plan says so; a forced "cpu" keeps the numba token loop."""
    from linattn.backends import GROUPED_CHUNK_WHY, policy

    T, group = policy.GROUPED_CHUNK_MIN_TOKENS, policy.GROUPED_CHUNK_MIN_GROUP
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, T, 1, 8, generator=gen) for _ in range(2))
    v = torch.randn(1, T, group, 4, generator=gen)
    g = -torch.rand(1, T, group, generator=gen)
    kw = dict(rule="gated", g=g, normalize=False, scale=1.0)
    plan = linattn.plan(linattn.linear_attention, q, k, v, **kw)
    assert (plan.runs, plan.grouped_chunk, str(plan)) == ("cpu", True, f"cpu: {GROUPED_CHUNK_WHY}")
    forced = linattn.plan(linattn.linear_attention, q, k, v, backend="cpu", **kw)
    assert (forced.runs, forced.grouped_chunk, forced.why) == ("cpu", False, "the numba kernels take the call")
    ran = []
    monkeypatch.setattr(cpu_backend, "prefill", lambda *a: pytest.fail("the token loop ran"))
    real = cpu_backend.grouped_prefill
    monkeypatch.setattr(cpu_backend, "grouped_prefill", lambda *a: ran.append(1) or real(*a))
    linattn.linear_attention(q, k, v, **kw)
    assert ran == [1]


def test_step_plain_case_runs_the_one_call_kernel(calls):
    q, k, v, g = sequence(B=1)
    state = linattn.State.zeros(1, 3, 5, 5)
    before = state.S.clone()
    plan = linattn.plan(linattn.step, q[:, 0], k[:, 0], v[:, 0], state, rule="gated", g=g[:, 0], inplace=True)
    assert plan.runs == "cpu" and plan.backend == "auto"
    assert torch.equal(state.S, before) and not calls  # nothing ran, nothing was written
    linattn.step(q[:, 0], k[:, 0], v[:, 0], state, rule="gated", g=g[:, 0], inplace=True)
    assert len(calls) == 1


def test_named_form_keeps_the_torch_form_under_auto(monkeypatch):
    q, k, v, g = sequence()
    plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, form="parallel")
    assert plan.runs == "torch" and plan.kernel is None
    assert plan.why == "form='parallel' is asked for by name, so it runs as written"
    monkeypatch.setattr(cpu_backend, "prefill", lambda *a: pytest.fail("the compiled prefill ran"))
    o, _ = linattn.linear_attention(q, k, v, rule="gated", g=g, form="parallel")
    assert o.shape == v.shape
    assert linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, backend="torch").why == \
        "backend='torch'"


def test_a_refusal_is_the_reason_under_auto_and_the_error_when_forced():
    q, k, v, g = sequence()
    plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, state_dtype=torch.float64)
    assert plan.runs == "torch" and plan.why == "it keeps a float32 state, got state dtype torch.float64"
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it keeps a float32 state"):
        linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, state_dtype=torch.float64,
                        backend="cpu")
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it keeps a float32 state"):
        linattn.linear_attention(q, k, v, rule="gated", g=g, state_dtype=torch.float64, backend="cpu")
    step = (q[:, 0].double(), k[:, 0].double(), v[:, 0].double())
    assert linattn.plan(linattn.step, *step, rule="gated", g=g[:, 0].double()).why == \
        "it keeps a float32 state, got state dtype torch.float64"
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it keeps a float32 state"):
        linattn.plan(linattn.step, *step, rule="gated", g=g[:, 0].double(), backend="cpu")
    q.requires_grad_(True)
    plan = linattn.plan(linattn.step, q[:, 0], k[:, 0], v[:, 0], rule="gated", g=g[:, 0])
    assert plan.runs == "torch" and plan.why == "it has no backward (inputs require grad)"


def test_torch_func_transform_is_the_reason():
    q, k, v, g = sequence(B=1)
    seen = []

    def one(q_t):
        seen.append(linattn.plan(linattn.step, q_t, k[:, 0], v[:, 0], rule="gated", g=g[:, 0]))
        with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it reads raw tensor memory"):
            linattn.plan(linattn.step, q_t, k[:, 0], v[:, 0], rule="gated", g=g[:, 0], backend="cpu")
        return linattn.step(q_t, k[:, 0], v[:, 0], rule="gated", g=g[:, 0])[0]

    torch.func.vmap(one)(q.transpose(0, 1))
    assert [(p.runs, p.why) for p in seen] == [("torch", TRANSFORM_REFUSAL)]
    got = torch.func.grad(lambda q_: (
        seen.append(linattn.plan(linattn.linear_attention, q_, k, v, rule="gated", g=g)),
        linattn.linear_attention(q_, k, v, rule="gated", g=g)[0].sum())[1])(q)
    assert seen[-1].why == TRANSFORM_REFUSAL and got.shape == q.shape


def test_triton_without_cuda_is_a_value_error(monkeypatch):
    try:
        import linattn.kernels.triton as kt
    except Exception:  # triton missing: the refusal says so, and is an error all the same
        kt = None
    if kt is not None:
        monkeypatch.setattr(kt, "interpreted", lambda: False)  # as on a machine without TRITON_INTERPRET=1
    q, k, v, g = sequence()
    for fn, args, kw in ((linattn.linear_attention, (q, k, v), {"g": g}),
                         (linattn.step, (q[:, 0], k[:, 0], v[:, 0]), {"g": g[:, 0]})):
        with pytest.raises(ValueError, match=r"backend='triton' cannot run this call: .*(CUDA|triton)"):
            linattn.plan(fn, *args, rule="gated", backend="triton", **kw)


def test_bad_arguments_raise_what_the_call_raises():
    q, k, v, g = sequence()
    with pytest.raises(ValueError, match="rule: unknown rule 'nope'"):
        linattn.plan(linattn.linear_attention, q, k, v, rule="nope")
    with pytest.raises(ValueError, match="g must be <= 0"):
        linattn.plan(linattn.step, q[:, 0], k[:, 0], v[:, 0], rule="gated", g=-g[:, 0])
    with pytest.raises(TypeError, match="got an unexpected keyword argument 'form'"):
        linattn.plan(linattn.step, q[:, 0], k[:, 0], v[:, 0], form="chunk")
    with pytest.raises(TypeError, match="fn must be linattn.linear_attention or linattn.step"):
        linattn.plan(torch.matmul, q, k)


def test_packed_calls_name_what_runs_their_segments():
    """Packed sequences: the CPU kernels take them as they lie; where no kernel does (Triton), the padded segments
    they run as are planned, and the plan names what runs them."""
    q, k, v, g = sequence(B=1, T=9)
    cu = torch.tensor([0, 4, 9])
    assert linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, cu_seqlens=cu).runs == "cpu"
    plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, cu_seqlens=cu, form="parallel")
    assert plan.runs == "torch" and "form='parallel'" in plan.why
    try:
        import linattn.kernels.triton as kt
    except Exception:
        pytest.skip("triton is not installed")
    if kt.unavailable_reason(q.device, q.dtype, 5) is not None:
        pytest.skip("the Triton kernels cannot run here (no CUDA, no TRITON_INTERPRET=1)")
    plan = linattn.plan(linattn.linear_attention, q, k, v, rule="gated", g=g, cu_seqlens=cu, backend="triton")
    assert plan.runs == "triton" and plan.why == "packed sequences on Triton run as padded segments (backend='triton')"
