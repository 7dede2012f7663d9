"""The compiled prefill (``backend="cpu"``) beyond the plain case: grouped value heads, per-key-channel gates on the
delta rules (Kimi Delta Attention), packed sequences, and its compiled backward; against the float64 reference
and the torch forms.

Shapes are awkward on purpose (T not a multiple of the checkpoint spacing, odd widths, B and H > 1, Dk != Dv);
gates are drawn near 0 (g = -30), near 1 (g = -1e-4), at -inf (a full reset) and across the range. Tolerances as
in test_kernels_cpu.py: 2e-4 for float32 (the token loop typically reaches 1e-6), 2e-2 for bfloat16 inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import check_state_and_output as check
from helpers import kernel_inputs as make
from helpers import np64, reference_call, rel_err

import linattn
from linattn import State, backends
from linattn.backends import cpu as cpu_backend
from linattn.backends import policy

pytest.importorskip("numba")

# (rule, gate kind, normalize): every rule, and both gate kinds on both gated rules (channel on gated_delta: KDA)
VARIANTS = [
    ("accumulate", None, True),
    ("accumulate", None, False),
    ("gated", "head", True),
    ("gated", "channel", True),
    ("gated", "channel", False),
    ("delta", None, False),
    ("gated_delta", "head", False),
    ("gated_delta", "channel", False),
]


def initial(B, H, Dk, Dv, normalize, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return State(torch.randn(B, H, Dk, Dv, generator=gen), torch.rand(B, H, Dk, generator=gen) if normalize else None)


# ---------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
@pytest.mark.parametrize("group", [1, 2, 3])
def test_prefill_grouped_heads_and_channel_gates(rule, gate, normalize, group):
    q, k, v, kw = make(rule, gate, Hq=2, group=group)
    B, _, H, Dv = v.shape
    init = initial(B, H, q.shape[-1], Dv, normalize)
    for eps, eps_mode in ((1e-6, "add"), (0.5, "clamp")):
        args = dict(kw, normalize=normalize, eps=eps, eps_mode=eps_mode, initial_state=init)
        o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
        assert o.dtype == torch.float32 and o.shape == v.shape
        check(o, S, reference_call(q, k, v, **args), 2e-4)
        # auto takes the compiled kernel too and agrees with the torch form
        o_auto, _ = linattn.linear_attention(q, k, v, **args)
        assert torch.equal(o_auto, o)
        o_torch, _ = linattn.linear_attention(q, k, v, backend="torch", **args)
        assert rel_err(o, np64(o_torch)) < 2e-4


@pytest.mark.parametrize("rule,gate,normalize", [VARIANTS[3], VARIANTS[6], VARIANTS[7]])
def test_prefill_grouped_bfloat16_inputs_float32_state(rule, gate, normalize):
    q, k, v, kw = make(rule, gate, Hq=2, group=2, T=70, dtype=torch.bfloat16)
    if "g" in kw:
        kw["g"] = kw["g"].to(torch.bfloat16)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", normalize=normalize, output_final_state=True, **kw)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    check(o, S, reference_call(q, k, v, normalize=normalize, **kw), 2e-2)


def test_channel_gated_delta_feature_map_and_resets():
    """KDA with l2 features, gates all -inf at one token (the state before it is forgotten exactly)."""
    q, k, v, kw = make("gated_delta", "channel", Hq=1, group=4, T=23, Dk=6, Dv=3)
    kw["g"][:, 11] = -torch.inf
    args = dict(kw, feature_map="l2", scale=0.8, initial_state=initial(2, 4, 6, 3, False))
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    check(o, S, reference_call(q, k, v, **args), 2e-4)
    # after the reset, the outputs do not depend on the initial state
    o2, _ = linattn.linear_attention(q, k, v, backend="cpu", **dict(args, initial_state=initial(2, 4, 6, 3, False, 7)))
    assert torch.equal(o2[:, 11:], o[:, 11:]) and not torch.equal(o2[:, :11], o[:, :11])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_channel_gated_delta_step(dtype):
    """Decode with per-channel gates on gated delta runs the compiled token loop ([Dk, Dv] layout)."""
    q, k, v, kw = make("gated_delta", "channel", B=2, T=12, Hq=3, gates="mixed")
    state = initial(2, 3, 5, 7, False)
    ref = reference_call(q, k, v, initial_state=state, **kw)
    outs = []
    for t in range(q.shape[1]):
        tok = {n: x[:, t].to(dtype) for n, x in kw.items() if isinstance(x, torch.Tensor)}
        o, state = linattn.step(q[:, t].to(dtype), k[:, t].to(dtype), v[:, t].to(dtype), state,
                                rule="gated_delta", backend="cpu", **tok)
        outs.append(o)
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    assert rel_err(torch.stack(outs, dim=1), ref[0]) < tol and rel_err(state.S, ref[1]) < tol


# ---------------------------------------------------------------------------------------------- packed
LENGTHS = [5, 0, 1, 40, 0, 9, 33]  # empty, one token, longer than the checkpoint spacing (32), ragged


def packed(rule, gate, lengths=LENGTHS, Hq=2, group=2, Dk=5, Dv=3, dtype=torch.float32, seed=0):
    T = sum(lengths)
    q, k, v, kw = make(rule, gate, B=1, T=T, Hq=Hq, group=group, Dk=Dk, Dv=Dv, dtype=dtype, seed=seed)
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    return q, k, v, kw, cu


@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
def test_packed_matches_reference_and_torch_path(rule, gate, normalize):
    q, k, v, kw, cu = packed(rule, gate)
    N, H = len(LENGTHS), v.shape[2]
    args = dict(kw, normalize=normalize, initial_state=initial(N, H, 5, 3, normalize), cu_seqlens=cu,
                feature_map="elu1" if normalize else None)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    assert o.shape == v.shape and S.S.shape == (N, H, 5, 3)
    check(o, S, reference_call(q, k, v, **args), 2e-4)
    o_t, S_t = linattn.linear_attention(q, k, v, backend="torch", output_final_state=True, **args)
    assert rel_err(o, np64(o_t)) < 2e-4 and rel_err(S.S, np64(S_t.S)) < 2e-4
    for i in (1, 4):  # the empty sequences keep their initial states exactly
        assert torch.equal(S.S[i], args["initial_state"].S[i])


def test_packed_no_initial_state_bfloat16():
    q, k, v, kw, cu = packed("gated_delta", "channel", dtype=torch.bfloat16)
    kw["g"] = kw["g"].to(torch.bfloat16)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", cu_seqlens=cu, output_final_state=True, **kw)
    assert o.dtype == torch.bfloat16 and S.S.dtype == torch.float32
    check(o, S, reference_call(q, k, v, cu_seqlens=cu, **kw), 2e-2)
    assert torch.equal(S.S[1], torch.zeros_like(S.S[1]))


def test_packed_nan_stays_in_its_sequence():
    q, k, v, kw, cu = packed("delta", None)
    v[0, 7] = float("nan")  # token 2 of sequence 3 (tokens 6 ... 45)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", cu_seqlens=cu, output_final_state=True, **kw)
    assert o[0, 7:46].isnan().any() and not o[0, :6].isnan().any() and not o[0, 46:].isnan().any()
    assert S.S[3].isnan().any() and not S.S[[0, 5, 6]].isnan().any()


def test_dispatch_takes_packed_and_grouped_and_refuses_unknown():
    q, k, v, kw = make("gated_delta", "channel", B=1, T=9, Hq=2, group=2, gates="range")
    S = torch.zeros(2, 4, 5, 7)
    common = dict(rule="gated_delta", form="chunk", q=q, k=k, v=v, g=kw["g"], beta=kw["beta"], state=S, fmap=None,
                  scale=None, normalize=False, eps=1e-6, eps_mode="add", grad=False)
    o, S_final = backends.linear_attention("auto", **common, cu_seqlens=torch.tensor([0, 4, 9]))
    assert o.shape == v.shape and S_final.shape == S.shape
    assert backends.linear_attention("auto", **common, window=3) is None  # an argument the kernel does not know
    with pytest.raises(ValueError, match="window"):
        backends.linear_attention("cpu", **common, window=3)
    assert backends.linear_attention("auto", **dict(common, form="parallel")) is None  # a form asked for by name


# ---------------------------------------------------------------------------------------------- backward
def _grads(fn, leaves, seed=3):
    """Gradients of a fixed random projection of (o, S, z) with respect to ``leaves``."""
    o, S = fn()
    gen = torch.Generator().manual_seed(seed)
    loss = (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum()
    loss = loss + (S.S.double() * torch.randn(S.S.shape, generator=gen, dtype=torch.float64)).sum()
    if S.z is not None:
        loss = loss + (S.z.double() * torch.randn(S.z.shape, generator=gen, dtype=torch.float64)).sum()
    return o, S, torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
@pytest.mark.parametrize("packed_call", [False, True])
def test_compiled_backward_matches_float64_token_loop(rule, gate, normalize, packed_call):
    """Gradients of q, k, v, g, beta and the initial state (through the feature map and the grouping) against
    autograd on the float64 torch token loop, at T past several checkpoint segments."""
    if packed_call:
        q, k, v, kw, cu = packed(rule, gate, Dk=5, Dv=7)
        extra = {"cu_seqlens": cu}
        N = len(LENGTHS)
    else:
        q, k, v, kw = make(rule, gate, B=2, T=75, Hq=2, group=2)
        extra, N = {}, 2
    H = v.shape[2]
    init = initial(N, H, 5, 7, normalize)
    tensors = {"q": q, "k": k, "v": v, "S0": init.S} | {n: kw[n] for n in ("g", "beta") if n in kw}
    if normalize:
        tensors["z0"] = init.z
    fmap = "elu1" if normalize else "l2"
    results = []
    for backend, dtype in (("cpu", torch.float32), ("torch", torch.float64)):
        leaves = {n: x.detach().to(dtype).requires_grad_(True) for n, x in tensors.items()}

        def call(leaves=leaves, backend=backend, dtype=dtype):
            st = State(leaves["S0"], leaves.get("z0"))
            return linattn.linear_attention(
                leaves["q"], leaves["k"], leaves["v"], rule=rule, g=leaves.get("g"), beta=leaves.get("beta"),
                normalize=normalize, feature_map=fmap, initial_state=st, output_final_state=True, backend=backend,
                form="recurrent", state_dtype=dtype, **extra)

        results.append(_grads(call, list(leaves.values())))
    (o, S, grads), (o64, S64, grads64) = results
    assert o.grad_fn is not None
    assert rel_err(o, np64(o64)) < 2e-4 and rel_err(S.S, np64(S64.S)) < 2e-4
    for name, ga, gb in zip(tensors, grads, grads64, strict=True):
        assert rel_err(ga, np64(gb)) < 1e-3, name


def test_compiled_backward_under_auto_only_where_enabled(monkeypatch):
    q, k, v, kw = make("gated_delta", "head", B=1, T=20, Hq=2)
    q.requires_grad_(True)
    calls = []
    module = cpu_backend.kernel("cpu_backward")
    real = module.backward
    monkeypatch.setattr(module, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(policy, "AUTO_BACKWARD_RULES", ())
    o, _ = linattn.linear_attention(q, k, v, **kw)
    (gq,) = torch.autograd.grad(o.sum(), q)
    assert not calls  # the torch form ran
    monkeypatch.setattr(policy, "AUTO_BACKWARD_RULES", ("gated_delta",))
    o2, _ = linattn.linear_attention(q, k, v, **kw)
    (gq2,) = torch.autograd.grad(o2.sum(), q)
    assert calls == [1] and rel_err(gq2, np64(gq)) < 1e-4


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_takes_compiled_backward_for_per_channel_gates(monkeypatch, threads):
    """GLA's per-channel gates take the compiled backward under "auto" at one thread, and at more only from
    ``BACKWARD_MULTITHREAD_MIN_ROWS`` (token, head) rows; gates per head keep the torch chunk backward. The
    gradients agree with the torch form's either way."""
    calls = []
    module = cpu_backend.kernel("cpu_backward")
    real = module.backward
    monkeypatch.setattr(module, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(cpu_backend, "available_threads", lambda: threads)
    for gate, rows, compiled in (("head", 1, False), ("channel", 1 << 30, threads == 1), ("channel", 1, True)):
        monkeypatch.setattr(policy, "BACKWARD_MULTITHREAD_MIN_ROWS", rows)
        q, k, v, kw = make("gated", gate, B=2, T=21, Hq=2, Dk=5, Dv=3)
        g = kw.pop("g").requires_grad_(True)
        calls.clear()
        o, _ = linattn.linear_attention(q, k, v, g=g, **kw)
        (gg,) = torch.autograd.grad(o.square().sum(), g)
        o_t, _ = linattn.linear_attention(q, k, v, g=g, backend="torch", **kw)
        (gg_t,) = torch.autograd.grad(o_t.square().sum(), g)
        assert calls == ([1] if compiled else []), (gate, rows)
        assert rel_err(gg, np64(gg_t)) < 1e-4 and rel_err(o, np64(o_t)) < 1e-5


def test_per_channel_backward_threshold_counts_token_head_rows(monkeypatch):
    """At more than one thread the compiled backward starts at exactly BACKWARD_MULTITHREAD_MIN_ROWS rows of
    (sequence, token, value head): B * T * HV."""
    calls = []
    module = cpu_backend.kernel("cpu_backward")
    real = module.backward
    monkeypatch.setattr(module, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(cpu_backend, "available_threads", lambda: 2)
    q, k, v, kw = make("gated", "channel", B=2, T=21, Hq=2, group=2, Dk=5, Dv=3)
    q.requires_grad_(True)
    rows = 2 * 21 * 4
    for threshold, compiled in ((rows, True), (rows + 1, False)):
        monkeypatch.setattr(policy, "BACKWARD_MULTITHREAD_MIN_ROWS", threshold)
        calls.clear()
        o, _ = linattn.linear_attention(q, k, v, **kw)
        torch.autograd.grad(o.sum(), q)
        assert calls == ([1] if compiled else []), threshold


def test_torch_backend_never_loads_the_kernels(monkeypatch):
    """backend="torch" decides before anything asks for the compiled kernels (no import, no warning)."""
    monkeypatch.setattr(cpu_backend, "kernel", lambda name: (_ for _ in ()).throw(AssertionError(f"{name} loaded")))
    q, k, v, kw = make("gated", "channel", B=1, T=13, Hq=2, Dk=5, Dv=3)
    q.requires_grad_(True)
    o, _ = linattn.linear_attention(q, k, v, backend="torch", **kw)
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_torch_func_transforms_never_reach_the_compiled_kernels():
    """The compiled kernels read raw memory, which torch.func's wrapped tensors lack: under a transform "auto" runs
    the torch forms (linattn.step under vmap equals a loop of steps), and a forced "cpu" is a ValueError that says
    why, for linear_attention and step alike."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 4, generator=gen) for _ in range(3))
    k = F.normalize(k, dim=-1)
    beta = torch.rand(1, 2, generator=gen)
    state = State.zeros(1, 2, 4, 4, normalizer=False)

    def one(q_, backend="auto"):
        return linattn.step(q_[None], k[:1], v[:1], state, rule="delta", beta=beta, backend=backend)[0][0]

    got = torch.func.vmap(one)(q)
    want = torch.stack([one(q[i]) for i in range(3)])
    assert rel_err(got, np64(want)) < 1e-6
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it reads raw tensor memory"):
        torch.func.vmap(lambda q_: one(q_, "cpu"))(q)
    qs, ks, vs = (torch.randn(1, 9, 2, 4, generator=gen) for _ in range(3))
    with pytest.raises(ValueError, match="torch.func transforms"):
        torch.func.grad(lambda v_: linattn.linear_attention(qs, ks, v_, backend="cpu")[0].sum())(vs)


@pytest.mark.parametrize("rule,gate,normalize", [("gated_delta", "channel", False), ("gated", "head", True)])
def test_parallel_builds_match_serial(monkeypatch, rule, gate, normalize):
    """Two threads (above the policy's PREFILL_SPLIT_MIN_WORK) give the serial results, forward and backward,
    packed and grouped: the prefill's units on a pool of threads and then its normalized rows, the backward's
    prange build."""
    import numba

    from linattn.kernels import cpu_threads

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    q, k, v, kw, cu = packed(rule, gate)
    kw = dict(kw, normalize=normalize, feature_map="elu1" if normalize else None)
    leaves = [x.requires_grad_(True) for x in (q, k, v, kw.get("g"), kw.get("beta")) if x is not None]
    runs, launched = [], []
    real_launch, real_on_threads = cpu_threads.launch, cpu_threads.on_threads
    monkeypatch.setattr(cpu_threads, "launch",
                        lambda p, s, args, n: launched.append(("launch", n)) or real_launch(p, s, args, n))
    monkeypatch.setattr(cpu_threads, "on_threads",
                        lambda fn, count, n: launched.append(("threads", n)) or real_on_threads(fn, count, n))
    for threads, min_work in ((1, 1 << 62), (2, 0)):
        monkeypatch.setattr(policy, "PREFILL_SPLIT_MIN_WORK", min_work)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            o, S = linattn.linear_attention(q, k, v, backend="cpu", cu_seqlens=cu, output_final_state=True, **kw)
            runs.append((o, S.S, *torch.autograd.grad((o * o).sum() + S.S.sum(), leaves)))
        finally:
            torch.set_num_threads(before)
    prefill_2 = [("threads", 2)] if not normalize else [("threads", 2), ("threads", 2)]  # units, then rows
    assert launched == [("launch", 1), *prefill_2, ("launch", 2)]  # the backward: its prange build at 2
    for a, b in zip(*runs, strict=True):
        assert rel_err(b, np64(a)) < 1e-5


def test_on_threads_covers_every_index_once_and_raises_a_part_s_error():
    from linattn.kernels import cpu_threads

    seen = []
    cpu_threads.on_threads(lambda lo, hi: seen.extend(range(lo, hi)), 10, 3)
    assert sorted(seen) == list(range(10))
    seen.clear()
    cpu_threads.on_threads(lambda lo, hi: seen.extend(range(lo, hi)), 2, 4)  # fewer indices than threads
    assert sorted(seen) == [0, 1]

    def fail_late(lo, hi):
        if hi == 10:
            raise ValueError("last part")
        seen.append(lo)

    seen.clear()
    with pytest.raises(ValueError, match="last part"):
        cpu_threads.on_threads(fail_late, 10, 2)
    assert seen == [0]  # the other part still ran to its end


def test_compiled_backward_steps_aside_for_torch_func_and_learnable_maps():
    """Under torch.func transforms "auto" keeps the torch forms (the compiled backward has no functorch rule), and a
    feature map with parameters gets its gradient on every backend (the grad decision sees the map's output)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 9, 2, 4, generator=gen) for _ in range(3))
    k = F.normalize(k, dim=-1)
    beta = torch.rand(1, 9, 2, generator=gen)

    def loss(v_, backend):
        return linattn.linear_attention(q, k, v_, rule="delta", beta=beta, backend=backend)[0].pow(2).sum()

    g_auto = torch.func.grad(lambda v_: loss(v_, "auto"))(v)
    g_torch = torch.func.grad(lambda v_: loss(v_, "torch"))(v)
    assert rel_err(g_auto, g_torch) < 1e-5
    lin = torch.nn.Linear(4, 4)
    grads = {}
    for backend in ("auto", "cpu", "torch"):
        lin.zero_grad()
        fm = lambda x: F.softplus(lin(x))  # noqa: E731
        o, _ = linattn.linear_attention(q, q, v, feature_map=fm, backend=backend)
        assert o.requires_grad, backend
        o.pow(2).sum().backward()
        grads[backend] = lin.weight.grad.clone()
    for backend in ("auto", "cpu"):
        assert rel_err(grads[backend], grads["torch"]) < 1e-5, backend


# ------------------------------------------------------------------------- head widths and work units
@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
@pytest.mark.parametrize("D", [64, 128])
def test_prefill_head_widths_with_compiled_in_rows(rule, gate, normalize, D):
    """Dk = 64 and 128 run four value rows per sweep with the width compiled in (Dv = D + 3 leaves rows for the
    pair and single-row paths, and the normalizer row joins the last group), with grouped heads and packed
    sequences; against the float64 reference."""
    q, k, v, kw = make(rule, gate, B=1, T=41, Hq=2, group=2, Dk=D, Dv=D + 3)
    init = initial(1, 4, D, D + 3, normalize)
    args = dict(kw, normalize=normalize, initial_state=init)
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    check(o, S, reference_call(q, k, v, **args), 2e-4)
    # packed: three sequences with their own states, one of length 0
    packed_args = dict(args, initial_state=initial(3, 4, D, D + 3, normalize, seed=5),
                       cu_seqlens=torch.tensor([0, 17, 17, 41], dtype=torch.int32))
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **packed_args)
    check(o, S, reference_call(q, k, v, **packed_args), 2e-4)


@pytest.mark.parametrize("rule,gate,normalize", [VARIANTS[1], VARIANTS[2], VARIANTS[3], VARIANTS[6], VARIANTS[7]])
@pytest.mark.parametrize("D", [64, 9])
def test_prefill_column_blocks_and_threads_agree(monkeypatch, rule, gate, normalize, D):
    """The value rows split into blocks (each run through the whole sequence on its own) and over threads give
    the float64 reference for every block size, with checkpoints for the backward taken per block."""
    import numba

    from linattn.kernels import cpu_prefill

    q, k, v, kw = make(rule, gate, B=2, T=29, Hq=1, group=3, Dk=D, Dv=D + 1)
    args = dict(kw, normalize=normalize, initial_state=initial(2, 3, D, D + 1, normalize))
    ref = reference_call(q, k, v, **args)
    threads = (1, 2) if numba.config.NUMBA_NUM_THREADS >= 2 else (1,)
    before = torch.get_num_threads()
    seen = []
    real = cpu_prefill.prefill
    for n_threads in threads:
        monkeypatch.setattr(policy, "PREFILL_SPLIT_MIN_WORK", 0)
        torch.set_num_threads(n_threads)
        try:
            for cols in (1, 4, 16, 32, D + 1):
                def forced(*a, c=cols, **kw_):
                    seen.append(c)  # the kernel was reached with this block size
                    return real(*a, **dict(kw_, cols=c))

                monkeypatch.setattr(cpu_prefill, "prefill", forced)
                o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
                check(o, S, ref, 2e-4)
        finally:
            torch.set_num_threads(before)
    assert len(seen) == 5 * len(threads)


def test_loop_threads_counts_the_prefill_s_value_blocks_and_the_backward_s_pairs(monkeypatch):
    """One sizing for the prefill, its autograd forward and its backward: the work is tokens x H x Dk x Dw state
    entries; the units are (sequence, head) pairs, cut into blocks of 32 value rows for the prefill only."""
    monkeypatch.setattr(cpu_backend, "available_threads", lambda: 2)
    monkeypatch.setattr(policy, "PREFILL_SPLIT_MIN_WORK", 4096 * 64 * 65)
    assert cpu_backend.loop_threads(4096, 1, 1, 64, 65, value_rows=64) == 2  # one head, two blocks of 32 rows
    assert cpu_backend.loop_threads(4096, 1, 1, 64, 65) == 1  # the backward: one pair
    assert cpu_backend.loop_threads(4096, 1, 1, 64, 65, value_rows=31) == 1  # under 32 rows: one block
    assert cpu_backend.loop_threads(4095, 2, 1, 64, 65) == 1  # below the work threshold
    assert cpu_backend.loop_threads(4096, 2, 1, 64, 65) == 2
    assert cpu_backend.loop_threads(2048, 1, 2, 64, 65) == 2  # two heads of one sequence


def test_prefill_cols_spreads_few_heads_and_keeps_many_whole():
    from linattn.kernels import cpu_prefill

    assert cpu_prefill.prefill_cols(8, 64, 1) == 64 and cpu_prefill.prefill_cols(8, 64, 2) == 64
    assert cpu_prefill.prefill_cols(32, 128, 2) == 128
    assert cpu_prefill.prefill_cols(1, 128, 2) == 32 and cpu_prefill.prefill_cols(2, 64, 2) == 32
    assert cpu_prefill.prefill_cols(1, 7, 2) == 7


@pytest.mark.parametrize("threads", [1, 2])
def test_auto_takes_the_compiled_loop_for_every_rule_at_any_thread_count(monkeypatch, threads):
    """"auto" runs the compiled prefill for every rule in the forms the policy names (measured faster than the
    torch chunk form at 1 and 2 threads), and the torch form for a form asked for by name; both right."""
    from linattn.kernels import cpu_prefill

    ran = []
    real = cpu_prefill.prefill
    monkeypatch.setattr(cpu_prefill, "prefill", lambda *a, **kw: ran.append(1) or real(*a, **kw))
    monkeypatch.setattr(cpu_backend, "available_threads", lambda: threads)
    for rule, gate in (("accumulate", None), ("gated", "head"), ("delta", None), ("gated_delta", "channel")):
        q, k, v, kw = make(rule, gate, B=2, T=19, Hq=2, group=2, Dk=5, Dv=4)
        ref = reference_call(q, k, v, **kw)
        ran.clear()
        o_auto, _ = linattn.linear_attention(q, k, v, **kw)
        assert ran == [1] and rel_err(o_auto, ref[0]) < 2e-4, rule
    q, k, v, kw = make("gated", "head", B=2, T=19, Hq=2, group=2, Dk=5, Dv=4)
    ran.clear()
    o_par, _ = linattn.linear_attention(q, k, v, form="parallel", **kw)
    assert ran == [] and rel_err(o_par, reference_call(q, k, v, **kw)[0]) < 2e-4


# ------------------------------------------------------------------------------ feature maps in the kernel
@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
@pytest.mark.parametrize("Dk,Dv,group", [(5, 7, 1), (64, 64, 2), (128, 33, 1)])
@pytest.mark.parametrize("fmap", ["l2", "elu1", "relu1"])
def test_prefill_feature_maps_inside_the_kernel(rule, gate, normalize, Dk, Dv, group, fmap, monkeypatch):
    """feature_map "l2", "elu1" or "relu1" is applied by the kernel as it loads each row of q and k (no mapped
    copy): equal to the float64 reference on raw q and k, unpacked and packed, with gates near 0, 1 and at -inf."""
    seen = []
    module = cpu_backend.kernel("cpu_prefill")
    real = module.prefill
    monkeypatch.setattr(module, "prefill", lambda *a, **kw: seen.append(kw.get("fmap")) or real(*a, **kw))
    q, k, v, kw = make(rule, gate, Hq=2, group=group, T=41, Dk=Dk, Dv=Dv)
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(q.shape, generator=gen) * 3, torch.randn(k.shape, generator=gen)  # raw: not unit rows
    if normalize and fmap == "l2":  # positive features keep the normalizer z.q away from 0
        q, k = q.abs(), k.abs()
    if fmap != "l2" and "beta" in kw:  # features of norm ~sqrt(Dk): a delta write stays a contraction
        kw["beta"] = kw["beta"] / Dk
    k[:, 5] = 0.0  # a zero key row: stays zero under l2, maps to ones under elu1 and relu1
    k[:, 7, 0, 0] = -30.0  # a large negative entry: elu1's exp stays finite and positive there
    B, _, H, _ = v.shape
    args = dict(kw, normalize=normalize, feature_map=fmap, initial_state=initial(B, H, Dk, Dv, normalize))
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    assert seen == [fmap]
    check(o, S, reference_call(q, k, v, **args), 2e-4)
    cu = torch.tensor([0, 1, 17, 17, 41])  # packed: lengths 1, 16, 0, 24 in one row
    pk = dict(args, initial_state=None)
    for name in ("g", "beta"):
        if name in pk:
            pk[name] = pk[name][:1]
    o_p, _ = linattn.linear_attention(q[:1], k[:1], v[:1], backend="cpu", cu_seqlens=cu, **pk)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if a < b:
            seg = {n: (x[:, a:b] if isinstance(x, torch.Tensor) else x) for n, x in pk.items()}
            ref = reference_call(q[:1, a:b], k[:1, a:b], v[:1, a:b], **seg)
            assert rel_err(o_p[:, a:b], ref[0]) < 2e-4


def test_prefill_takes_an_unhashable_callable_map():
    """A user's map is recognised by identity, never hashed: an unhashable callable runs in torch, as before."""
    import dataclasses

    @dataclasses.dataclass(eq=True)  # eq without frozen: instances are unhashable
    class Shifted:
        shift: float = 1.0

        def __call__(self, x):
            return torch.relu(x) + self.shift

    q, k, v, kw = make("accumulate", None, Hq=2, T=23, Dk=8, Dv=5)
    with pytest.raises(TypeError):
        hash(Shifted())
    o, _ = linattn.linear_attention(q, k, v, backend="cpu", feature_map=Shifted(), **kw)
    o_ref, _ = linattn.linear_attention(q, k, v, backend="cpu", feature_map="relu1", **kw)
    assert torch.allclose(o, o_ref, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ bfloat16 read in the kernel
@pytest.mark.parametrize("rule,gate,normalize", VARIANTS)
@pytest.mark.parametrize("feature_map", [None, "l2", "elu1"])
@pytest.mark.parametrize("Dk,Dv,group", [(5, 7, 1), (64, 64, 2), (128, 33, 1)])
def test_prefill_reads_bfloat16_in_place(rule, gate, normalize, feature_map, Dk, Dv, group, monkeypatch):
    """bfloat16 q, k, v with no feature map to apply first (none, or one the kernel applies) reach the kernel as
    their bits, widened as they are loaded: the same output and state, bit for bit, as the float32 call on the
    widened inputs, unpacked and packed; a map the kernel does not compute (a callable) still widens first."""
    seen = []
    module = cpu_backend.kernel("cpu_prefill")
    real = module.prefill
    monkeypatch.setattr(module, "prefill", lambda q, *a, **kw: seen.append(q.dtype) or real(q, *a, **kw))
    q, k, v, kw = make(rule, gate, Hq=2, group=group, T=41, Dk=Dk, Dv=Dv, dtype=torch.bfloat16)
    if feature_map == "elu1" and "beta" in kw:  # features of norm ~sqrt(Dk): a delta write stays a contraction
        kw["beta"] = kw["beta"] / Dk
    B, _, H, _ = v.shape
    args = dict(kw, normalize=normalize, feature_map=feature_map, initial_state=initial(B, H, Dk, Dv, normalize))
    o, S = linattn.linear_attention(q, k, v, backend="cpu", output_final_state=True, **args)
    o32, S32 = linattn.linear_attention(q.float(), k.float(), v.float(), backend="cpu", output_final_state=True,
                                        **args)
    assert seen == [np.int16, np.float32]
    assert o.dtype == torch.bfloat16 and torch.equal(o, o32.to(torch.bfloat16))
    assert torch.equal(S.S, S32.S) and (S.z is None or torch.equal(S.z, S32.z))
    check(o, S, reference_call(q, k, v, **args), 2e-2)

    cu = torch.tensor([0, 1, 17, 17, 41])  # packed: lengths 1, 16, 0, 24 in one row
    pk = {n: (x[:1] if n in ("g", "beta") else x) for n, x in dict(args, initial_state=None).items()}
    o_p, _ = linattn.linear_attention(q[:1], k[:1], v[:1], backend="cpu", cu_seqlens=cu, **pk)
    o_p32, _ = linattn.linear_attention(q[:1].float(), k[:1].float(), v[:1].float(), backend="cpu", cu_seqlens=cu,
                                        **pk)
    assert torch.equal(o_p, o_p32.to(torch.bfloat16))

    seen.clear()
    if normalize:  # a callable map runs in torch, on float32 copies
        linattn.linear_attention(q, k, v, backend="cpu", **dict(args, feature_map=lambda x: torch.relu(x) + 1))
        assert seen == [np.float32]


def test_prefill_bfloat16_keeps_nan_and_inf_in_their_rows():
    """A NaN or an infinity in a bfloat16 value row goes through the widening unchanged, as in float32."""
    q, k, v, kw = make("delta", None, B=1, Hq=1, T=9, Dk=8, Dv=8, dtype=torch.bfloat16)
    v[0, 6, 0, 2], v[0, 4, 0, 5] = torch.nan, torch.inf  # the infinity first: it shows before the NaN spreads
    o, _ = linattn.linear_attention(q, k, v, backend="cpu", **kw)
    o32, _ = linattn.linear_attention(q.float(), k.float(), v.float(), backend="cpu", **kw)
    assert torch.equal(o.isnan(), o32.to(torch.bfloat16).isnan()) and o[0, :4].isfinite().all()
    assert not o[0, 4, 0, 5].isfinite() and o[0, 4, 0, :5].isfinite().all()  # only the column the infinity enters
    assert o[0, 6:].isnan().any()


def test_prefill_kernel_refuses_mixed_input_dtypes():
    from linattn.kernels import cpu_prefill

    x = np.zeros((3, 1, 4), np.float32)
    ST = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="q, k, v must all be float32 or all int16"):
        cpu_prefill.prefill(x, x, x.astype(np.int16), None, None, np.array([0, 3]), ST, x.copy(), scale=1.0, eps=0.0,
                          clamp=False, normalize=False)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork")
def test_on_threads_works_in_a_forked_child():
    """A child forked after the pool started has none of its threads: it makes its own instead of waiting forever."""
    import os

    from linattn.kernels import cpu_threads

    seen = []
    cpu_threads.on_threads(lambda lo, hi: seen.append(hi - lo), 4, 2)  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if both parts ran (and SIGALRM instead of waiting forever)
        import signal

        signal.alarm(20)
        got = []
        try:
            cpu_threads.on_threads(lambda lo, hi: got.append(hi - lo), 4, 2)
        finally:
            os._exit(0 if sorted(got) == [2, 2] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and sorted(seen) == [2, 2]


@pytest.mark.parametrize("backend", ["cpu", "auto"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("rule,gate,normalize", [("gated", "head", False), ("gated_delta", "channel", False),
                                                 ("accumulate", None, True)])
def test_an_initial_state_in_the_kernels_layout_is_not_written(backend, grad, rule, gate, normalize):
    """A state that is the transposed view of a contiguous ``[Dv, Dk]`` tensor (HF's Mamba-2 layout, as the
    transformers adapter hands it on) is already in the kernel's layout: it must still be copied, not written (it
    once came back holding the final state)."""
    B, T, H, Dk, Dv = 2, 13, 3, 5, 4
    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(B, T, H, Dk, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=gen)
    g = None if gate is None else -torch.rand(B, T, H, *([Dk] if gate == "channel" else []), generator=gen)
    beta = torch.rand(B, T, H, generator=gen) if "delta" in rule else None
    if grad:
        v.requires_grad_()
    width = Dv + normalize
    mem = torch.rand(B, H, width, Dk, generator=gen)  # contiguous [Dv(+1), Dk]
    S0 = State(mem[..., :Dv, :].transpose(-1, -2), mem[..., Dv, :] if normalize else None)
    before = mem.clone()
    feature_map = "elu1" if normalize else None
    o, st = linattn.linear_attention(q, k, v, rule=rule, g=g, beta=beta, initial_state=S0, normalize=normalize,
                                     feature_map=feature_map, output_final_state=True, backend=backend)
    if grad:
        o.square().sum().backward()
    assert torch.equal(mem, before)
    o_ref, st_ref = linattn.linear_attention(q, k, v, rule=rule, g=g, beta=beta, initial_state=State(
        before[..., :Dv, :].transpose(-1, -2).contiguous(), before[..., Dv, :] if normalize else None),
        normalize=normalize, feature_map=feature_map, output_final_state=True, backend="torch")
    assert rel_err(o.detach(), o_ref.detach()) <= 1e-5 and rel_err(st.S.detach(), st_ref.S.detach()) <= 1e-5
