"""Packed sequences (``cu_seqlens``): one call equals calling each sequence alone, in every rule and form, with
empty sequences, sequences shorter than a chunk, initial states and grouped value heads; gradients too."""

from __future__ import annotations

import pytest
import torch
from helpers import np64, reference_call, rel_err

import linattn
from linattn import State

LENGTHS = [5, 0, 1, 13, 0, 9]  # chunk 4: shorter than a chunk, exactly none, several chunks with a partial one
FORMS = [(rule, form) for rule in linattn.RULES for form in linattn.supported_forms(rule)]


def packed_inputs(rule, lengths, *, H=2, group=2, D=3, Dv=2, per_channel=False, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    T, N, HV = sum(lengths), len(lengths), H * group
    q, k = (torch.randn(1, T, H, D, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(1, T, HV, Dv, generator=gen, dtype=dtype)
    kwargs = {"rule": rule, "feature_map": "elu1" if rule in ("accumulate", "gated") else "l2"}
    if rule in ("gated", "gated_delta"):
        kwargs["g"] = -2 * torch.rand(1, T, HV, *((D,) if per_channel else ()), generator=gen, dtype=dtype)
    if rule in ("delta", "gated_delta"):
        kwargs["beta"] = torch.rand(1, T, HV, generator=gen, dtype=dtype)
    z0 = torch.rand(N, HV, D, generator=gen, dtype=dtype) + 0.5 if rule in ("accumulate", "gated") else None
    kwargs["initial_state"] = State(torch.randn(N, HV, D, Dv, generator=gen, dtype=dtype), z0)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    return (q, k, v), kwargs, cu


def separately(q, k, v, cu, form, chunk_size, **kwargs):
    """Each sequence alone: (packed outputs [1, T, HV, Dv], final states [N, ...])."""
    outs, S, z = [], [], []
    init = kwargs.pop("initial_state")
    for i in range(len(cu) - 1):
        a, b = int(cu[i]), int(cu[i + 1])
        s0 = State(init.S[i:i + 1], None if init.z is None else init.z[i:i + 1])
        if a == b:  # an empty sequence: its state passes through
            S.append(s0.S)
            z.append(s0.z)
            continue
        per_token = {n: kwargs[n][:, a:b] for n in ("g", "beta") if n in kwargs}
        rest = {n: x for n, x in kwargs.items() if n not in per_token}
        o, st = linattn.linear_attention(q[:, a:b], k[:, a:b], v[:, a:b], form=form, chunk_size=chunk_size,
                                         initial_state=s0, output_final_state=True, **per_token, **rest)
        outs.append(o)
        S.append(st.S)
        z.append(st.z)
    return torch.cat(outs, dim=1), torch.cat(S), (None if z[0] is None else torch.cat(z))


@pytest.mark.parametrize(("rule", "form"), FORMS)
def test_packed_equals_separate_calls(rule, form):
    for per_channel in ((False, True) if rule in ("gated", "gated_delta") else (False,)):
        (q, k, v), kwargs, cu = packed_inputs(rule, LENGTHS, per_channel=per_channel)
        o, state = linattn.linear_attention(q, k, v, form=form, chunk_size=4, cu_seqlens=cu, output_final_state=True,
                                            **kwargs)
        o_sep, S_sep, z_sep = separately(q, k, v, cu, form, 4, **kwargs)
        assert o.shape == v.shape and state.S.shape == kwargs["initial_state"].S.shape
        assert rel_err(o, np64(o_sep)) <= 1e-12 and rel_err(state.S, np64(S_sep)) <= 1e-12
        if z_sep is not None:
            assert rel_err(state.z, np64(z_sep)) <= 1e-12
        if form == "chunk":  # and the reference's own loop over the sequences
            o_ref, S_ref, _ = reference_call(q, k, v, cu_seqlens=cu, **kwargs)
            assert rel_err(o, o_ref) <= 1e-10 and rel_err(state.S, S_ref) <= 1e-10
        # the empty sequences kept their initial states exactly
        for i in (1, 4):
            assert torch.equal(state.S[i], kwargs["initial_state"].S[i])


@pytest.mark.parametrize("rule", linattn.RULES)
def test_packed_float32_no_initial_state_and_one_sequence(rule):
    (q, k, v), kwargs, cu = packed_inputs(rule, [7, 0, 20], dtype=torch.float32)
    kwargs.pop("initial_state")
    o, state = linattn.linear_attention(q, k, v, cu_seqlens=cu, chunk_size=8, output_final_state=True, **kwargs)
    o_sep, S_sep, _ = separately(q, k, v, cu, "chunk", 8,
                                 initial_state=State.zeros(3, 4, 3, 2, normalizer=rule in ("accumulate", "gated")),
                                 **kwargs)
    assert rel_err(o, np64(o_sep)) <= 1e-6 and rel_err(state.S, np64(S_sep)) <= 1e-6
    assert (state.S[1] == 0).all()
    # one sequence spanning everything is the unpacked call
    whole = torch.tensor([0, q.shape[1]])
    o1, _ = linattn.linear_attention(q, k, v, cu_seqlens=whole, chunk_size=8, **kwargs)
    o2, _ = linattn.linear_attention(q, k, v, chunk_size=8, **kwargs)
    assert rel_err(o1, np64(o2)) <= 1e-6


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_packed_gradients_equal_separate(rule):
    (q, k, v), kwargs, cu = packed_inputs(rule, [6, 0, 3, 11], per_channel=rule == "gated_delta")
    leaves = [q, k, v, kwargs["g"], kwargs["initial_state"].S]
    for x in leaves:
        x.requires_grad_()
    w = torch.randn(v.shape, dtype=torch.float64)
    grads = []
    for packed in (True, False):
        if packed:
            o, st = linattn.linear_attention(q, k, v, cu_seqlens=cu, chunk_size=4, output_final_state=True, **kwargs)
            S = st.S
        else:
            o, S, _ = separately(q, k, v, cu, "chunk", 4, **dict(kwargs))
        loss = (o * w).sum() + S.square().sum()
        grads.append(torch.autograd.grad(loss, leaves))
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all() and rel_err(a, np64(b)) <= 1e-10


def test_packed_eps_zero_has_finite_gradients():
    """Padding is never divided: with eps = 0 the gradients stay finite (0 / 0 would be NaN)."""
    (q, k, v), kwargs, cu = packed_inputs("accumulate", [2, 9])
    kwargs.pop("initial_state")
    q.requires_grad_()
    o, _ = linattn.linear_attention(q, k, v, cu_seqlens=cu, eps=0.0, **kwargs)
    (grad,) = torch.autograd.grad(o.sum(), q)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize(
    ("cu", "exc", "match"),
    [
        (torch.tensor([0.0, 5.0]), TypeError, "integer tensor"),
        ([0, 5], TypeError, "torch.Tensor"),
        (torch.tensor([0]), ValueError, r"\[N \+ 1\]"),
        (torch.tensor([0, 3]), ValueError, "end at T = 5"),
        (torch.tensor([1, 5]), ValueError, "start at 0"),
        (torch.tensor([0, 4, 2, 5]), ValueError, "nondecreasing"),
    ],
)
def test_bad_cu_seqlens(cu, exc, match):
    q = torch.rand(1, 5, 2, 3)
    with pytest.raises(exc, match=match):
        linattn.linear_attention(q, q, q, cu_seqlens=cu)


@pytest.mark.parametrize("rule", ["accumulate", "delta"])
def test_packed_call_runs_on_meta_tensors(rule):
    """Shape propagation: a packed call on meta tensors gives the shapes and dtypes of a real one (the boundaries
    are read from cu_seqlens on the CPU; once "Tensor.item() cannot be called on meta tensors"); a bad boundary is
    still the same error."""
    T, H, D, Dv = 11, 2, 3, 4
    cu = torch.tensor([0, 4, 4, T])
    kw = dict(rule=rule, cu_seqlens=cu, output_final_state=True, feature_map="elu1")

    def run(device, cu=cu):
        q, k = (torch.rand(1, T, H, D, device=device, dtype=torch.bfloat16) for _ in range(2))
        v = torch.rand(1, T, H * 2, Dv, device=device, dtype=torch.bfloat16)
        beta = torch.rand(1, T, H * 2, device=device, dtype=torch.bfloat16) if rule == "delta" else None
        return linattn.linear_attention(q, k, v, beta=beta, **{**kw, "cu_seqlens": cu})

    o, s = run("meta")
    o_cpu, s_cpu = run("cpu")
    assert o.is_meta and o.shape == o_cpu.shape == (1, T, H * 2, Dv) and o.dtype == o_cpu.dtype
    assert s.S.is_meta and s.S.shape == s_cpu.S.shape == (3, H * 2, D, Dv) and s.S.dtype == s_cpu.S.dtype
    assert (s.z is None) == (s_cpu.z is None) and (s.z is None or s.z.shape == s_cpu.z.shape)
    with pytest.raises(ValueError, match="nondecreasing"):
        run("meta", torch.tensor([0, 5, 4, T]))


def test_packed_needs_batch_one_and_n_initial_states():
    q = torch.rand(2, 5, 2, 3)
    with pytest.raises(ValueError, match="batch size 1"):
        linattn.linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 5]))
    q = torch.rand(1, 5, 2, 3)
    with pytest.raises(ValueError, match="initial_state"):
        linattn.linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 2, 5]), initial_state=State.zeros(1, 2, 3, 3))


def test_packed_final_state_continues_with_step():
    """The N final states record this call's rule and feature map, so decode continues each sequence."""
    (q, k, v), kwargs, cu = packed_inputs("gated_delta", [4, 7], group=1)
    o, state = linattn.linear_attention(q, k, v, cu_seqlens=cu, output_final_state=True, **kwargs)
    assert state.rule == "gated_delta" and state.feature_map == "l2"
    x = torch.randn(2, 2, 3, dtype=torch.float64)
    o_t, _ = linattn.step(x, x, torch.randn(2, 2, 2, dtype=torch.float64), state, rule="gated_delta",
                          feature_map="l2", g=-torch.rand(2, 2, dtype=torch.float64),
                          beta=torch.rand(2, 2, dtype=torch.float64))
    assert torch.isfinite(o_t).all()


def test_skewed_lengths_run_in_segments_and_stay_exact():
    from linattn.packing import plan_segment

    lengths = [40, 2, 3, 0, 2, 1, 2]
    assert plan_segment(torch.tensor(lengths), 4) < 40  # padding every row to 40 would be wasteful
    assert plan_segment(torch.tensor([10, 11, 12]), 4) == 12  # similar lengths: one call
    for rule in linattn.RULES:
        for form in linattn.supported_forms(rule):
            (q, k, v), kwargs, cu = packed_inputs(rule, lengths, per_channel=rule == "gated")
            o, state = linattn.linear_attention(q, k, v, form=form, chunk_size=4, cu_seqlens=cu,
                                                output_final_state=True, **kwargs)
            o_sep, S_sep, _ = separately(q, k, v, cu, form, 4, **kwargs)
            assert rel_err(o, np64(o_sep)) <= 1e-12 and rel_err(state.S, np64(S_sep)) <= 1e-12, (rule, form)


def test_nan_stays_in_its_sequence():
    (q, k, v), kwargs, cu = packed_inputs("delta", [5, 9, 3])
    k[0, 1] = float("nan")  # inside the first sequence
    o, state = linattn.linear_attention(q, k, v, cu_seqlens=cu, chunk_size=4, output_final_state=True, **kwargs)
    assert torch.isnan(o[0, 1:5]).any() and torch.isfinite(o[0, 5:]).all()
    assert torch.isfinite(state.S[1:]).all()


# Input dtype other than the state dtype: every combination a packed call can meet (the packed torch path once
# cast v to the state dtype but left q and k in theirs, and refused its own call).
DTYPE_CASES = [
    (torch.float32, {"state_dtype": torch.float64}, False),
    (torch.float64, {"state_dtype": torch.float32}, False),
    (torch.bfloat16, {"backend": "torch"}, False),
    (torch.float16, {"backend": "torch"}, False),
    (torch.bfloat16, {}, True),
    (torch.float16, {}, True),
]


@pytest.mark.parametrize(("dtype", "extra", "grad"), DTYPE_CASES)
@pytest.mark.parametrize("rule", linattn.RULES)
def test_packed_input_dtype_other_than_state_dtype(rule, dtype, extra, grad):
    (q, k, v), kwargs, cu = packed_inputs(rule, [3, 0, 7, 5], dtype=torch.float32, seed=4)
    kwargs.pop("initial_state")
    kwargs = {n: (x.to(dtype) if isinstance(x, torch.Tensor) else x) for n, x in kwargs.items()}
    q, k, v = (x.to(dtype).requires_grad_(grad) for x in (q, k, v))
    o, state = linattn.linear_attention(q, k, v, cu_seqlens=cu, chunk_size=4, output_final_state=True, **extra,
                                        **kwargs)
    dt = extra.get("state_dtype", torch.float64 if dtype == torch.float64 else torch.float32)
    init = State.zeros(4, 4, 3, 2, normalizer=rule in ("accumulate", "gated"), dtype=dt)
    o_sep, S_sep, _ = separately(q, k, v, cu, "chunk", 4, initial_state=init, **extra, **kwargs)
    assert o.dtype == dtype and state.S.dtype == dt
    tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-5
    assert rel_err(o, np64(o_sep)) <= tol and rel_err(state.S, np64(S_sep)) <= 1e-5
    if grad:
        w = torch.randn(o.shape, dtype=torch.float64).to(dtype)
        dq, dv = torch.autograd.grad((o * w).sum(), (q, v))
        dq_sep, dv_sep = torch.autograd.grad((o_sep * w).sum(), (q, v))
        assert rel_err(dq, np64(dq_sep)) <= 2e-2 and rel_err(dv, np64(dv_sep)) <= 2e-2
