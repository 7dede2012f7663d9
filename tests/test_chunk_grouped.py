"""The grouped chunk form of the gated rule (`linattn.ops.gated.chunk_grouped`: one gate per head, q/k shared by
groups of value heads, Mamba-2's SSD in matmuls): against the float64 reference and the numba token loop, and
the CPU backend's choice of it under ``backend="auto"`` (`linattn.plan` says which path runs and why)."""

from __future__ import annotations

import pytest
import torch

import linattn
from linattn import reference
from linattn.backends import GROUPED_CHUNK_WHY, policy
from linattn.backends import cpu as cpu_backend
from linattn.ops.gated import chunk_grouped

torch.set_num_threads(1)


def rel(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def gates(B, T, H, kind, gen):
    """Log-gates [B, T, H]: "mild" (-0.5..0), "near0" (|g| < 1e-4: no decay), "strong" (some heads -3 per token: a
    chunk of 64 decays past the factored range, so those heads take the exact path), "reset" (-inf at some tokens:
    the state before is forgotten exactly), "large" (-30 at some tokens)."""
    g = -torch.rand(B, T, H, generator=gen) * 0.5
    if kind == "near0":
        g = -torch.rand(B, T, H, generator=gen) * 1e-4
    elif kind == "strong":
        g[..., ::2] = -3.0 * torch.rand(B, T, (H + 1) // 2, generator=gen) - 1.5
    elif kind == "reset":
        g[:, T // 3] = float("-inf")
        g[:, (2 * T) // 3, :1] = float("-inf")
    elif kind == "large":
        g[:, T // 2] = -30.0
    return g


def case(B, T, G, Hg, N, P, kind, init, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    H = G * Hg
    q, k = (torch.randn(B, T, G, N, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, P, generator=gen).to(dtype)
    g = gates(B, T, H, kind, gen)
    S0 = torch.randn(B, H, N, P, generator=gen) if init else torch.zeros(B, H, N, P)
    return q, k, v, g, S0


def ref(q, k, v, g, S0, scale):
    o, S, _ = reference.linear_attention(q.double().numpy(), k.double().numpy(), v.double().numpy(), rule="gated",
                                         g=g.double().numpy(), initial_S=S0.double().numpy(), normalize=False,
                                         scale=scale)
    return torch.from_numpy(o), torch.from_numpy(S)


@pytest.mark.parametrize("B,T,G,Hg,N,P,C", [
    (1, 1, 1, 1, 3, 5, 64),     # one token
    (2, 63, 1, 3, 7, 5, 64),    # C - 1
    (1, 64, 2, 3, 9, 4, 64),    # exactly one chunk
    (2, 65, 3, 1, 5, 3, 64),    # C + 1: a last chunk of one token
    (1, 77, 2, 8, 5, 7, 16),    # odd T over several chunks
    (2, 129, 1, 8, 17, 9, 32),
])
@pytest.mark.parametrize("kind", ["mild", "near0", "strong", "reset", "large"])
@pytest.mark.parametrize("init", [False, True])
def test_matches_the_float64_reference(B, T, G, Hg, N, P, C, kind, init):
    q, k, v, g, S0 = case(B, T, G, Hg, N, P, kind, init, seed=T + 7 * G)
    before = S0.clone()
    o, S = chunk_grouped(q, k, v, g, initial_state=S0, chunk_size=C, scale=0.8)
    o_ref, S_ref = ref(q, k, v, g, S0, 0.8)
    assert o.shape == (B, T, G * Hg, P) and S.shape == (B, G * Hg, N, P)
    assert rel(o, o_ref) <= 1e-5 and rel(S, S_ref) <= 1e-5
    assert torch.equal(S0, before)  # the caller's state is not written


@pytest.mark.parametrize("B,T,G,Hg,N,P,C", [(2, 65, 3, 1, 5, 3, 64), (1, 77, 2, 8, 5, 7, 16)])
@pytest.mark.parametrize("kind", ["mild", "strong", "reset"])
@pytest.mark.parametrize("skip_shape", [None, "head", "head_dim", "one"])
def test_value_scale_and_skip_match_the_float64_reference(B, T, G, Hg, N, P, C, kind, skip_shape):
    """Mamba-2's dt on the values and D x on the output, folded into the chunk form (factored and exact heads),
    against the reference run on v * dt with D * v added after."""
    q, k, v, g, S0 = case(B, T, G, Hg, N, P, kind, True, seed=T + 3 * Hg)
    gen = torch.Generator().manual_seed(5)
    H = G * Hg
    dt = torch.rand(B, T, H, generator=gen) * 2 + 0.01
    shape = {None: None, "head": (H,), "head_dim": (H, P), "one": (1,)}[skip_shape]  # "one": broadcast to every head
    skip = None if shape is None else torch.randn(shape, generator=gen)
    o, S = chunk_grouped(q, k, v, g, initial_state=S0, chunk_size=C, scale=0.8, v_scale=dt, skip=skip)
    o_ref, S_ref = ref(q, k, v * dt[..., None], g, S0, 0.8)
    if skip is not None:
        o_ref = o_ref + (skip if skip.dim() == 2 else skip[:, None]).double() * v.double()  # [1, 1] broadcasts
    assert rel(o, o_ref) <= 1e-5 and rel(S, S_ref) <= 1e-5


def test_reset_forgets_the_state_exactly():
    """g = -inf at the first token: the output and state are those of a zero initial state, bit for bit the same
    as without the huge initial state (no 0 * inf, no rounding from it)."""
    q, k, v, g, S0 = case(1, 70, 2, 3, 5, 4, "mild", True, seed=5)
    g[:, 0] = float("-inf")
    o, S = chunk_grouped(q, k, v, g, initial_state=S0 * 1e30, chunk_size=32)
    o0, S00 = chunk_grouped(q, k, v, g, initial_state=torch.zeros_like(S0), chunk_size=32)
    assert torch.isfinite(o).all() and torch.equal(o, o0) and torch.equal(S, S00)


def test_no_tokens_returns_the_initial_state():
    q, k, v, g, S0 = case(2, 0, 2, 3, 5, 4, "mild", True)
    o, S = chunk_grouped(q, k, v, g, initial_state=S0)
    assert o.shape == (2, 0, 6, 4) and torch.equal(S, S0) and S is not S0


def test_out_is_written_and_returned():
    q, k, v, g, S0 = case(1, 40, 1, 3, 5, 4, "mild", True)
    out = torch.full(v.shape, float("nan"))
    o, _ = chunk_grouped(q, k, v, g, initial_state=S0, chunk_size=16, out=out)
    assert o is out and rel(out, ref(q, k, v, g, S0, 1.0)[0]) <= 1e-5


# --------------------------------------------------------------------------------- the CPU backend's choice
LONG = policy.GROUPED_CHUNK_MIN_TOKENS + 37  # long enough, and not a multiple of the chunk
GROUP = policy.GROUPED_CHUNK_MIN_GROUP


def mamba_like(B=1, T=LONG, G=2, Hg=GROUP, N=16, P=8, seed=0, dtype=torch.float32):
    q, k, v, g, S0 = case(B, T, G, Hg, N, P, "mild", True, seed=seed, dtype=dtype)
    return q, k, v, g, S0


KW = dict(rule="gated", normalize=False, scale=1.0)


def test_auto_runs_the_grouped_chunk_form_and_matches_the_token_loop(monkeypatch):
    q, k, v, g, S0 = mamba_like(B=2)
    plan = linattn.plan(linattn.linear_attention, q, k, v, g=g, initial_state=linattn.State(S0), **KW)
    assert (plan.runs, plan.grouped_chunk, plan.why) == ("cpu", True, GROUPED_CHUNK_WHY)
    ran = []
    real = cpu_backend.grouped_prefill
    monkeypatch.setattr(cpu_backend, "grouped_prefill", lambda *a: ran.append(1) or real(*a))
    state = linattn.State(S0.clone())
    o, st = linattn.linear_attention(q, k, v, g=g, initial_state=state, output_final_state=True, **KW)
    assert ran == [1] and torch.equal(state.S, S0)
    o_loop, st_loop = linattn.linear_attention(q, k, v, g=g, initial_state=linattn.State(S0),
                                               output_final_state=True, backend="cpu", **KW)
    assert ran == [1]  # a forced "cpu" runs the numba token loop
    o_ref, S_ref = ref(q, k, v, g, S0, 1.0)
    assert o.dtype == torch.float32 and st.S.dtype == torch.float32 and st.S.shape == S_ref.shape
    assert rel(o, o_ref) <= 1e-5 and rel(st.S, S_ref) <= 1e-5
    assert rel(o, o_loop) <= 1e-5 and rel(st.S, st_loop.S) <= 1e-5


def test_auto_with_bfloat16_inputs_widens_them():
    q, k, v, g, S0 = mamba_like(dtype=torch.bfloat16)
    plan = linattn.plan(linattn.linear_attention, q, k, v, g=g, **KW)
    assert plan.grouped_chunk
    o, st = linattn.linear_attention(q, k, v, g=g, initial_state=linattn.State(S0), output_final_state=True, **KW)
    o_ref, S_ref = ref(q, k, v, g, S0, 1.0)  # from the same bfloat16 values, in float64
    assert o.dtype == torch.bfloat16 and st.S.dtype == torch.float32
    assert rel(o, o_ref) <= 1e-2 and rel(st.S, S_ref) <= 1e-5


def test_strided_inputs_as_hf_splits_them():
    """q, k, v and g as views into larger tensors (one projection split, a transposed gate): read where they lie."""
    q, k, v, g, S0 = mamba_like(T=LONG + 64, P=6)
    G, N, H, P = q.shape[2], q.shape[3], v.shape[2], v.shape[3]
    proj = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1)
    qs, ks, vs = proj.split([G * N, G * N, H * P], dim=-1)
    qs, ks, vs = qs.unflatten(-1, (G, N)), ks.unflatten(-1, (G, N)), vs.unflatten(-1, (H, P))
    gs = g.transpose(1, 2).contiguous().transpose(1, 2)
    assert not (qs.is_contiguous() or vs.is_contiguous() or gs.is_contiguous())
    o, st = linattn.linear_attention(qs, ks, vs, g=gs, initial_state=linattn.State(S0), output_final_state=True,
                                     **KW)
    assert linattn.plan(linattn.linear_attention, qs, ks, vs, g=gs, **KW).grouped_chunk
    o_ref, S_ref = ref(q, k, v, g, S0, 1.0)
    assert rel(o, o_ref) <= 1e-5 and rel(st.S, S_ref) <= 1e-5


@pytest.mark.parametrize("G,Hg,threads", [(1, 16, 2), (2, 16, 2), (2, 16, 3), (3, 16, 2)])
def test_shares_of_the_heads_on_threads(G, Hg, threads):
    """On several threads each share of the heads runs on its own thread with torch on one; torch's thread count is
    restored afterwards."""
    q, k, v, g, S0 = case(2, LONG, G, Hg, 9, 5, "strong", True, seed=G + threads)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        o, st = linattn.linear_attention(q, k, v, g=g, initial_state=linattn.State(S0), output_final_state=True,
                                         **KW)
        assert torch.get_num_threads() == threads
        dt, D = torch.rand(2, LONG, G * Hg) + 0.01, torch.randn(G * Hg)  # each share takes its heads' dt and D
        o2, S2 = cpu_backend.grouped_prefill(q, k, v, g, S0, 1.0, v_scale=dt, skip=D)
    finally:
        torch.set_num_threads(before)
    o_ref, S_ref = ref(q, k, v, g, S0, 1.0)
    assert rel(o, o_ref) <= 1e-5 and rel(st.S, S_ref) <= 1e-5
    o_ref, S_ref = ref(q, k, v * dt[..., None], g, S0, 1.0)
    assert rel(o2, o_ref + D[:, None].double() * v.double()) <= 1e-5 and rel(S2, S_ref) <= 1e-5


@pytest.mark.parametrize("G,Hg,n,shares", [
    (1, 80, 2, [(0, 40), (40, 80)]),
    (8, 16, 2, [(0, 64), (64, 128)]),
    (2, 3, 8, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]),
    (1, 1, 2, [(0, 1)]),
])
def test_head_shares(G, Hg, n, shares):
    assert cpu_backend.head_shares(G, Hg, n) == shares


def test_default_scale_and_no_initial_state():
    q, k, v, g, _ = mamba_like()
    o, st = linattn.linear_attention(q, k, v, rule="gated", g=g, normalize=False, output_final_state=True)
    o_ref, S_ref = ref(q, k, v, g, torch.zeros(st.S.shape), q.shape[-1] ** -0.5)
    assert rel(o, o_ref) <= 1e-5 and rel(st.S, S_ref) <= 1e-5


@pytest.mark.parametrize("change,why", [
    (dict(T=policy.GROUPED_CHUNK_MIN_TOKENS - 1), "too few tokens or value heads per q/k head"),
    (dict(Hg=GROUP - 1), "too few tokens or value heads per q/k head"),
    (dict(normalize=True), "a feature map or a normalizer runs in the token loop"),
    (dict(feature_map="elu1"), "a feature map or a normalizer runs in the token loop"),
    (dict(per_channel=True), "only the gated rule with one gate per head runs as grouped matmuls"),
    (dict(rule="gated_delta"), "only the gated rule with one gate per head runs as grouped matmuls"),
    (dict(form="recurrent"), "the numba kernels take the call"),
    (dict(backend="cpu"), "the numba kernels take the call"),
    (dict(grad=True), "the numba kernels take the call"),
    (dict(packed=True), "the numba kernels take the call"),
])
def test_other_calls_keep_the_token_loop(change, why, monkeypatch):
    shape = {name: change[name] for name in ("T", "Hg") if name in change}
    q, k, v, g, _ = mamba_like(**shape)
    kw = dict(KW)
    kw.update({name: change[name] for name in ("normalize", "feature_map", "rule", "form", "backend")
               if name in change})
    if change.get("per_channel"):
        g = g[..., None].expand(*g.shape, q.shape[-1]).contiguous()
    if kw["rule"] == "gated_delta":
        kw["beta"] = torch.rand(g.shape)
    if change.get("grad"):
        v = v.requires_grad_()
    if change.get("packed"):
        kw["cu_seqlens"] = torch.tensor([0, 100, q.shape[1]])
    plan = linattn.plan(linattn.linear_attention, q, k, v, g=g, **kw)
    if why.startswith("the numba"):
        # (under autograd "auto" keeps the torch form of this rule's backward: either way not the grouped form)
        assert not plan.grouped_chunk
    else:
        assert (plan.runs, plan.grouped_chunk) == ("cpu", False)
        from linattn.backends import cpu as cpu_mod
        assert cpu_mod.grouped_chunk_refusal(kw["rule"], q, v, g, not kw.get("normalize") and
                                             "feature_map" not in kw).startswith(why)
    monkeypatch.setattr(cpu_backend, "grouped_prefill", lambda *a: pytest.fail("the grouped chunk form ran"))
    linattn.linear_attention(q, k, v, g=g, **kw)


@pytest.mark.parametrize("T,group,expected", [
    (policy.GROUPED_CHUNK_MIN_TOKENS, policy.GROUPED_CHUNK_MIN_GROUP, True),
    (policy.GROUPED_CHUNK_MIN_TOKENS - 1, 80, False),
    (4096, policy.GROUPED_CHUNK_MIN_GROUP - 1, False),
    (4096, 80, True),
])
def test_policy_thresholds(T, group, expected):
    assert policy.grouped_chunk(T, group) is expected
