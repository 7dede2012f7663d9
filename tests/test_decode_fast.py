"""The one-call decode path of ``linattn.step`` (kernels/cpu_decode.py) against the float64 reference.

Each case prefills a few tokens (giving a state linattn made, with its record), then decodes the rest one token
at a time and compares every output and the final state with the reference over the whole sequence. A spy on
the compiled entry proves which path ran: the plain case must take it, everything else must not (and still be
right). Sizes are awkward: odd widths, Dk != Dv, B and H > 1, grouped value heads; gates near 0, near 1, -inf.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State
from linattn.state import is_joint

pytest.importorskip("numba")
from linattn.backends import policy  # noqa: E402
from linattn.kernels import cpu_decode  # noqa: E402

TOL = 2e-4  # float32 state, a dozen tokens (docs/testing.md: the token loop reaches ~1e-6)


def inputs(rule, *, gate="head", B=2, T=11, H=3, G=1, D=5, Dv=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H * G, Dv, generator=gen)
    kw = {}
    if rule in ("gated", "gated_delta"):
        shape = (B, T, H * G) if gate == "head" else (B, T, H * G, D)
        g = F.logsigmoid(torch.randn(*shape, generator=gen) * 3)
        if T > 8:  # near 1, near 0, a full reset: all while decoding
            g[:, 4], g[:, 6], g[:, 8] = -1e-4, -30.0, -torch.inf
        kw["g"] = g
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(B, T, H * G, generator=gen) * 1.5
    return q, k, v, kw


def decode(q, k, v, kw, *, prefill=3, inplace=True, **opts):
    """Prefill ``prefill`` tokens, decode the rest; the outputs of every token and the final state."""
    head = {n: x[:, :prefill] for n, x in kw.items()}
    o0, state = linattn.linear_attention(q[:, :prefill], k[:, :prefill], v[:, :prefill], output_final_state=True,
                                         **head, **opts)
    outs = [o0]
    for t in range(prefill, q.shape[1]):
        tok = {n: x[:, t].contiguous() for n, x in kw.items()}
        o, state = linattn.step(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(), state,
                                inplace=inplace, **tok, **opts)
        outs.append(o.unsqueeze(1))
    return torch.cat(outs, dim=1), state


def check_against_reference(q, k, v, kw, o, state, **opts):
    o_ref, S_ref, z_ref = reference_call(q, k, v, **kw, **opts)
    assert rel_err(o, o_ref) < TOL
    assert rel_err(state.S, S_ref) < TOL
    if z_ref is not None:
        assert rel_err(state.z, z_ref) < TOL


CASES = [  # rule, gate kind, feature map, value heads per query head
    ("accumulate", None, "elu1", 1),
    ("accumulate", None, "relu1", 2),
    ("gated", "head", "elu1", 1),
    ("gated", "channel", "relu1", 2),
    ("delta", None, "l2", 1),
    ("delta", None, "identity", 3),
    ("gated_delta", "head", "l2", 2),
    ("gated_delta", "head", None, 1),
    ("gated_delta", "channel", "l2", 2),  # Kimi Delta: a gate per key channel
    ("gated_delta", "channel", None, 1),
]


@pytest.mark.parametrize("rule,gate,fmap,G", CASES)
@pytest.mark.parametrize("inplace", [True, False])
def test_plain_decode_takes_one_call_and_matches_reference(calls, rule, gate, fmap, G, inplace):
    q, k, v, kw = inputs(rule, gate=gate, G=G)
    if fmap == "identity" or fmap is None:  # a delta rule without a map needs unit keys to stay bounded
        k = F.normalize(k, dim=-1)
    o, state = decode(q, k, v, kw, rule=rule, feature_map=fmap, inplace=inplace)
    assert len(calls) == q.shape[1] - 3
    check_against_reference(q, k, v, kw, o, state, rule=rule, feature_map=fmap)


@pytest.mark.parametrize("eps_mode,scale,eps", [("add", 0.3, 1e-3), ("clamp", 0.7, 0.5), ("clamp", -0.2, 1e-6)])
def test_scale_and_eps_conventions(calls, eps_mode, scale, eps):
    q, k, v, kw = inputs("gated", B=1, H=2, D=4, Dv=3)
    opts = dict(rule="gated", feature_map="elu1", scale=scale, eps=eps, eps_mode=eps_mode)
    o, state = decode(q, k, v, kw, **opts)
    assert calls
    check_against_reference(q, k, v, kw, o, state, **opts)


def test_in_place_returns_the_state_it_updated_and_copy_leaves_it(calls):
    q, k, v, kw = inputs("accumulate", B=1, T=4)
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True, feature_map="elu1")
    before = state.S.clone(), state.z.clone()
    q, k, v = q[:, 3], k[:, 3], v[:, 3]  # B = 1: one token is contiguous
    o1, copy = linattn.step(q, k, v, state, feature_map="elu1")
    assert torch.equal(state.S, before[0]) and torch.equal(state.z, before[1])  # inplace=False: a new state
    assert copy.rule == "accumulate" and copy.feature_map == "elu1" and copy.normalized is True
    o2, same = linattn.step(q, k, v, state, feature_map="elu1", inplace=True)
    assert same is state and torch.equal(o1, o2)
    assert torch.equal(state.S, copy.S) and torch.equal(state.z, copy.z)
    assert len(calls) == 2


@pytest.mark.parametrize("bad", [float("nan"), 0.25])
def test_bad_gate_names_g_and_leaves_the_state(calls, bad):
    q, k, v, kw = inputs("gated_delta", B=1, T=4, H=2)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True, rule="gated_delta",
                                        feature_map="l2", g=kw["g"][:, :3], beta=kw["beta"][:, :3])
    before = state.S.clone()
    g = kw["g"][:, 3].clone()
    g[0, 1] = bad
    with pytest.raises(ValueError, match="g must be <= 0"):
        linattn.step(q[:, 3], k[:, 3], v[:, 3], state, rule="gated_delta", feature_map="l2", g=g,
                     beta=kw["beta"][:, 3].contiguous(), inplace=True)
    assert len(calls) == 1  # the kernel saw the gate first, wrote nothing, and the full path named it
    assert torch.equal(state.S, before)


def fall_through_cases():
    """Calls the one-call path must leave to the full path, each still correct."""
    yield "float16 inputs", dict(dtype=torch.float16), {}  # (bfloat16 takes the kernel: test_decode_bf16.py)
    yield "taylor2 map", {}, dict(feature_map="taylor2")
    yield "strided q", dict(strided=True), {}
    yield "a state without a record", dict(bare=True), {}
    yield "an int scale", {}, dict(scale=1)


@pytest.mark.parametrize("name,how,opts", list(fall_through_cases()), ids=[c[0] for c in fall_through_cases()])
def test_other_calls_take_the_full_path_and_stay_right(calls, name, how, opts):
    rule = how.get("rule", "gated")
    q, k, v, kw = inputs(rule, gate=how.get("gate", "head"), B=2, T=5, H=2, D=3, Dv=4)
    opts = {"rule": rule, "feature_map": "l2" if "delta" in rule else "elu1", **opts}
    _, state = linattn.linear_attention(q[:, :4], k[:, :4], v[:, :4], output_final_state=True,
                                        **{n: x[:, :4] for n, x in kw.items()}, **opts)
    if how.get("bare"):
        state = State(state.S, state.z)
    tq = q[:, 4]
    if how.get("strided"):
        tq = torch.randn(2, 2, 6)[..., ::2]
        tq.copy_(q[:, 4])
    dtype = how.get("dtype", torch.float32)
    tok = {n: x[:, 4].contiguous().to(dtype) for n, x in kw.items()}
    o, state = linattn.step(tq.to(dtype), k[:, 4].to(dtype), v[:, 4].to(dtype), state, **tok, **opts)
    assert calls == []
    o_ref, S_ref, _ = reference_call(q.to(dtype), k.to(dtype), v.to(dtype), **{n: x.to(dtype) for n, x in kw.items()},
                                     **opts)
    assert rel_err(o[:, None], o_ref[:, 4:]) < (2e-2 if dtype == torch.float16 else TOL)
    assert rel_err(state.S, S_ref) < (2e-2 if dtype == torch.float16 else TOL)


def test_torch_backend_and_grad_never_take_it(calls):
    q, k, v, kw = inputs("accumulate", B=1, T=4)
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True)
    linattn.step(q[:, 3], k[:, 3], v[:, 3], state, backend="torch")
    linattn.step(q[:, 3].requires_grad_(), k[:, 3], v[:, 3], state)
    assert calls == []


def test_inference_state_outside_inference_mode_is_still_refused(calls):
    q, k, v, _ = inputs("accumulate", B=1, T=4)
    with torch.inference_mode():
        _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True)
    with pytest.raises(ValueError, match="inference"):
        linattn.step(q[:, 3], k[:, 3], v[:, 3], state, inplace=True)
    assert calls == []


# ------------------------------------------------------------------------------------------ the kernel, everywhere
# B, H (query heads), value heads per query head G, D, Dv: odd widths, D != Dv, D = 1, grouped value heads
SIZES = [(2, 3, 1, 5, 7), (1, 2, 2, 16, 33), (3, 1, 3, 1, 1)]
RULE_GATES = [("accumulate", None), ("gated", "head"), ("gated", "channel"), ("delta", None), ("gated_delta", "head"),
              ("gated_delta", "channel")]


def stable_inputs(rule, gate, fmap, B, H, G, D, Dv, T=11, seed=1):
    """``inputs`` with keys and write strengths that keep the delta rules bounded for every feature map."""
    q, k, v, kw = inputs(rule, gate=gate or "head", B=B, T=T, H=H, G=G, D=D, Dv=Dv, seed=seed)
    if rule in ("delta", "gated_delta"):
        if fmap in (None, "identity"):
            k = F.normalize(k, dim=-1)
        elif fmap != "l2":  # relu1 / elu1 features have |phi(k)|^2 of about D to 4 D
            kw["beta"] = kw["beta"] / (2 * D)
    return q, k, v, kw


def torch_step_outputs(q, k, v, kw, *, prefill=3, **opts):
    """The torch step (backend="torch") from the same prefill, token by token: outputs and final state."""
    head = {n: x[:, :prefill] for n, x in kw.items()}
    _, state = linattn.linear_attention(q[:, :prefill], k[:, :prefill], v[:, :prefill], output_final_state=True,
                                        **head, **opts)
    outs = []
    for t in range(prefill, q.shape[1]):
        tok = {n: x[:, t].contiguous() for n, x in kw.items()}
        o, state = linattn.step(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(), state,
                                backend="torch", **tok, **opts)
        outs.append(o.unsqueeze(1))
    return torch.cat(outs, dim=1), state


@pytest.mark.parametrize("B,H,G,D,Dv", SIZES, ids=[f"B{b}H{h}G{g}D{d}Dv{dv}" for b, h, g, d, dv in SIZES])
@pytest.mark.parametrize("rule,gate", RULE_GATES, ids=[f"{r}-{g}" for r, g in RULE_GATES])
@pytest.mark.parametrize("fmap", [None, "relu1", "elu1", "l2"])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
def test_kernel_matches_reference_and_torch_step(calls, rule, gate, fmap, G, inplace, B, H, D, Dv):
    q, k, v, kw = stable_inputs(rule, gate, fmap, B, H, G, D, Dv)
    opts = dict(rule=rule, feature_map=fmap)
    if rule in ("accumulate", "gated") and fmap in (None, "l2"):  # signed features: q.z may cross 0, so no z
        opts["normalize"] = False
    o, state = decode(q, k, v, kw, inplace=inplace, **opts)
    assert len(calls) == q.shape[1] - 3  # every decode token took the compiled call
    check_against_reference(q, k, v, kw, o, state, **opts)
    # The torch step does the same float32 arithmetic in another order: a much tighter bound than the reference's.
    o_torch, state_torch = torch_step_outputs(q, k, v, kw, **opts)
    assert rel_err(o[:, 3:], o_torch.double().numpy()) < 2e-5
    assert rel_err(state.S, state_torch.S.double().numpy()) < 2e-5
    if state.z is not None:
        assert rel_err(state.z, state_torch.z.double().numpy()) < 2e-5
    assert state.rule == rule and state.feature_map == (fmap or "identity")


def test_copy_is_a_fresh_joint_state_and_the_output_is_fresh(calls):
    q, k, v, kw = inputs("gated", B=1, T=5, H=2, D=4, Dv=3)
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], g=kw["g"][:, :3], rule="gated",
                                        feature_map="elu1", output_final_state=True)
    before = state.S.clone(), state.z.clone()
    tok = dict(rule="gated", feature_map="elu1", g=kw["g"][:, 3])
    o1, new = linattn.step(q[:, 3], k[:, 3], v[:, 3], state, **tok)
    assert torch.equal(state.S, before[0]) and torch.equal(state.z, before[1])  # the old state only read
    assert new is not state and new.S.untyped_storage().data_ptr() != state.S.untyped_storage().data_ptr()
    assert is_joint(new.S, new.z) and new.normalized is True and new.rule == "gated"
    o2, same = linattn.step(q[:, 3], k[:, 3], v[:, 3], state, inplace=True, **tok)
    assert same is state and torch.equal(o1, o2) and torch.equal(new.S, state.S) and torch.equal(new.z, state.z)
    assert o1.untyped_storage().data_ptr() != o2.untyped_storage().data_ptr()  # each call a tensor of its own
    o3, _ = linattn.step(q[:, 4], k[:, 4], v[:, 4], new, inplace=True, rule="gated", feature_map="elu1",
                         g=kw["g"][:, 4])  # the copy continues in place: it is in linattn's own layout
    assert len(calls) == 3 and o3.shape == (1, 2, 3)


def test_output_is_float32_whatever_the_default_dtype(calls):
    q, k, v, kw = inputs("delta", B=1, T=5, H=2, D=4, Dv=3)
    k = F.normalize(k, dim=-1)
    o_ref, state_ref = decode(q, k, v, kw, rule="delta", feature_map="l2")
    calls.clear()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        o, _ = decode(q, k, v, kw, rule="delta", feature_map="l2")
    finally:
        torch.set_default_dtype(default)
    assert len(calls) == 2 and o.dtype == torch.float32 and torch.equal(o, o_ref)


def test_exp_is_rounded_once_to_float32():
    """The kernel's own exp (gates, elu1): within half an ulp over the float32 range, exact at 0 and -inf."""
    import numba
    import numpy as np

    from linattn.kernels import cpu_intrinsics

    @numba.njit(**{n: f for n, f in cpu_decode._FLAGS.items() if n != "cache"})  # as the kernel compiles it
    def run(x, out):
        for i in range(x.shape[0]):
            out[i] = cpu_intrinsics.exp32_jit(x[i])

    x = np.concatenate([np.linspace(-110, 90, 200_001), [0.0, -0.0, -1e-30, -np.inf, np.nan, np.inf]]).astype(
        np.float32)
    out = np.empty_like(x)
    run(x, out)
    exact = np.exp(x.astype(np.float64))
    normal = (exact > 1.2e-38) & (exact < 3e38)
    ulp = np.spacing(exact[normal].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(out[normal] - exact[normal]) / ulp) < 0.51
    tiny = (exact <= 1.2e-38) & (exact > 0)  # subnormal results, and those that round to 0
    assert np.max(np.abs(out[tiny] - exact[tiny])) < 1.5e-45
    assert list(out[-6:-2]) == [1.0, 1.0, 1.0, 0.0] and np.isnan(out[-2]) and out[-1] == np.inf


# ------------------------------------------------------------------------------------------ what it must refuse
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
@pytest.mark.parametrize("rule,gate", [("gated", "head"), ("gated", "channel"), ("gated_delta", "channel")])
@pytest.mark.parametrize("bad", [float("nan"), 0.25, float("inf")])
def test_bad_gate_anywhere_leaves_the_state_and_names_g(calls, inplace, rule, gate, bad):
    q, k, v, kw = inputs(rule, gate=gate, B=2, T=4, H=2, G=2, D=3, Dv=5)
    opts = dict(rule=rule, feature_map="relu1" if rule == "gated" else "l2")
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True,
                                        **{n: x[:, :3] for n, x in kw.items()}, **opts)
    before = state.S.clone(), None if state.z is None else state.z.clone()
    g = kw["g"][:, 3].clone()
    g.view(-1)[-1] = bad  # the very last gate: the kernel must have checked them all before writing any
    tok = {n: x[:, 3].contiguous() for n, x in kw.items() if n != "g"}
    with pytest.raises(ValueError, match="g must be <= 0"):
        linattn.step(q[:, 3].contiguous(), k[:, 3].contiguous(), v[:, 3].contiguous(), state, g=g, inplace=inplace,
                     **tok, **opts)
    assert len(calls) == 1
    assert torch.equal(state.S, before[0]) and (state.z is None or torch.equal(state.z, before[1]))


def _token_state(rule="gated_delta", B=2, H=2, D=4, Dv=3):
    q, k, v, kw = inputs(rule, B=B, T=4, H=H, D=D, Dv=Dv)
    fmap = "l2" if "delta" in rule else "relu1"
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True, rule=rule,
                                        feature_map=fmap, **{n: x[:, :3] for n, x in kw.items()})
    tok = dict(q=q[:, 3].contiguous(), k=k[:, 3].contiguous(), v=v[:, 3].contiguous(),
               **{n: x[:, 3].contiguous() for n, x in kw.items()})
    return tok, state, dict(rule=rule, feature_map=fmap)


def _strided(x):
    y = torch.empty(*x.shape[:-1], 2 * x.shape[-1])[..., ::2]
    y.copy_(x)
    return y


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_strided_inputs_take_the_full_path(calls, name):
    tok, state, opts = _token_state()
    o_fast, s_fast = linattn.step(**tok, state=state, **opts)
    assert len(calls) == 1
    tok[name] = _strided(tok[name])
    o, s = linattn.step(**tok, state=state, **opts)
    assert len(calls) == 1  # not taken
    assert rel_err(o, o_fast.double().numpy()) < 1e-5 and rel_err(s.S, s_fast.S.double().numpy()) < 1e-5


def test_grad_takes_the_full_path_and_keeps_the_graph(calls):
    tok, state, opts = _token_state()
    tok["v"] = tok["v"].requires_grad_()
    o, s = linattn.step(**tok, state=state, **opts)
    assert calls == [] and o.requires_grad and s.S.requires_grad
    o.sum().backward()
    assert tok["v"].grad is not None
    S = state.S.clone().requires_grad_()
    o, s = linattn.step(**{**tok, "v": tok["v"].detach()}, state=State(S, rule="gated_delta", feature_map="l2",
                                                                       normalized=False), **opts)
    assert calls == [] and s.S.requires_grad


def test_a_state_of_another_rule_or_map_is_refused_by_name(calls):
    tok, state, opts = _token_state(rule="gated")
    with pytest.raises(ValueError, match="made by rule 'gated'"):
        linattn.step(tok["q"], tok["k"], tok["v"], state, rule="accumulate", feature_map="relu1")
    with pytest.raises(ValueError, match="made with feature_map 'relu1'"):
        linattn.step(tok["q"], tok["k"], tok["v"], state, rule="gated", feature_map="elu1", g=tok["g"])
    assert calls == []


def test_a_state_not_in_linattn_layout_takes_the_full_path(calls):
    tok, state, opts = _token_state(rule="gated")
    o_fast, s_fast = linattn.step(**tok, state=state, **opts)
    calls.clear()
    # S and z as separate tensors: updated through a copy and written back into them
    split = State(state.S.clone(), state.z.clone(), rule="gated", feature_map="relu1", normalized=True)
    o, s = linattn.step(**tok, state=split, inplace=True, **opts)
    assert calls == [] and s.S is split.S and torch.allclose(o, o_fast, atol=1e-6)
    assert torch.allclose(split.S, s_fast.S, atol=1e-6) and torch.allclose(split.z, s_fast.z, atol=1e-6)
    # a z that no longer covers the buffer's last column (replaced after the State was made)
    short = state.clone()
    short.z = short.z[..., :-1]
    try:
        linattn.step(**tok, state=short, **opts)
    except ValueError:
        pass
    assert calls == []


def test_empty_heads_take_the_full_path(calls):
    tok, state, opts = _token_state(rule="accumulate")
    with pytest.raises(ValueError, match="no empty dimension"):
        linattn.step(tok["q"], tok["k"], tok["v"][:, :0], state, **opts)
    assert calls == []


def _launches(monkeypatch):
    from linattn.kernels import cpu_threads

    seen = []
    real = cpu_threads.launch
    monkeypatch.setattr(cpu_threads, "launch", lambda p, s, args, n: seen.append(n) or real(p, s, args, n))
    return seen


@pytest.mark.parametrize("rule,gate,fmap,scale", [("gated", "head", "elu1", None), ("gated_delta", "channel", "l2", 1)],
                         ids=["plain", "full-path"])
def test_batch_decode_on_two_threads_stays_serial(calls, monkeypatch, rule, gate, fmap, scale):
    """A batch step with two threads below ``policy.DECODE_SPLIT_MIN_ENTRIES`` state entries runs serially (waking the
    second thread cost more than it saved there): the plain case on the one-call kernel, another case (an int
    scale, which the one-call proof leaves to the full path) on the serial token loop; both right against the
    reference."""
    launched = _launches(monkeypatch)
    q, k, v, kw = inputs(rule, gate=gate, B=64, T=4, H=8, D=16, Dv=16)  # 64*8*16*17 entries: above the old bar
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        o, state = decode(q, k, v, kw, rule=rule, feature_map=fmap, scale=scale)
    finally:
        torch.set_num_threads(threads)
    check_against_reference(q, k, v, kw, o, state, rule=rule, feature_map=fmap, scale=scale)
    if rule == "gated":
        assert len(calls) == 1 and launched == []  # the step took the one-call kernel (the prefill launches none)
    else:
        assert calls == [] and launched == [1]  # the serial token loop


def test_batch_decode_parallel_above_a_threshold_matches(calls, monkeypatch):
    """With the thresholds set to 0 (a machine where the parallel step pays) the step splits its sequences over
    two threads (the one-call kernel on each part) and stays right."""
    import numba

    from linattn.kernels import cpu_threads

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    monkeypatch.setattr(policy, "DECODE_SPLIT_MIN_ENTRIES", 0)
    launched = _launches(monkeypatch)
    parts = []
    real_on_threads = cpu_threads.on_threads
    monkeypatch.setattr(cpu_threads, "on_threads",
                        lambda fn, count, n: parts.append((count, n)) or real_on_threads(fn, count, n))
    q, k, v, kw = inputs("gated_delta", B=3, T=6, H=4, D=9, Dv=5)
    k = F.normalize(k, dim=-1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        o, state = decode(q, k, v, kw, rule="gated_delta")
    finally:
        torch.set_num_threads(threads)
    check_against_reference(q, k, v, kw, o, state, rule="gated_delta")
    assert launched == [] and parts == [(3, 2)] * 3  # three steps, each its 3 sequences on 2 threads
    assert sorted(c[8] for c in calls) == [1, 1, 1, 2, 2, 2]  # each part one call of the kernel: 1 and 2 sequences


def test_token_loop_decode_stays_serial_and_its_split_build_matches(calls, monkeypatch):
    """The general token loop's decode step (cases the one-call kernel does not take) runs serially at any thread
    count and any size, as the policy says (its split was measured slower); its parallel build, called directly
    on two threads, gives the serial build's step bit for bit."""
    import numba

    from linattn.kernels import cpu_loop

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    monkeypatch.setattr(policy, "DECODE_SPLIT_MIN_ENTRIES", 0)
    launched = _launches(monkeypatch)
    q, k, v, kw = inputs("gated_delta", gate="channel", B=3, T=6, H=4, D=9, Dv=5)
    k = F.normalize(k, dim=-1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # an int scale: the one-call proof leaves it to the full path, the token loop
        o, state = decode(q, k, v, kw, rule="gated_delta", scale=1)
    finally:
        torch.set_num_threads(threads)
    check_against_reference(q, k, v, kw, o, state, rule="gated_delta", scale=1)
    assert calls == [] and launched == [1, 1, 1]  # the steps (the prefill splits its units in on_threads)
    gen = torch.Generator().manual_seed(1)
    B, H, D, Dv = 3, 4, 9, 5
    qs, ks = torch.randn(B, 1, H, D, generator=gen), F.normalize(torch.randn(B, 1, H, D, generator=gen), dim=-1)
    vs, gs = torch.randn(B, 1, H, Dv, generator=gen), -torch.rand(B, 1, H, 1, generator=gen)
    betas, S0 = torch.rand(B, 1, H, generator=gen), torch.randn(B, H, D, Dv, generator=gen)
    results = []
    for n in (1, 2):
        S, o = S0.clone(), torch.empty(B, 1, H, Dv)
        cpu_loop.run(qs.numpy(), ks.numpy(), vs.numpy(), gs.numpy(), betas.numpy(), S.numpy(), o.numpy(),
                     scale=1.0, eps=0.0, clamp=False, normalize=False, threads=n)
        results.append((o, S))
    assert launched[-2:] == [1, 2]
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("D", [64, 128])  # the widths the kernel compiles with constant row lengths
@pytest.mark.parametrize("rule,gate", [("accumulate", None), ("gated", "head"), ("gated", "channel"),
                                       ("gated_delta", "channel")])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
def test_usual_head_sizes_match_reference_and_torch_step(calls, D, rule, gate, inplace):
    fmap = "l2" if rule == "gated_delta" else "elu1"
    q, k, v, kw = stable_inputs(rule, gate, fmap, 1, 2, 2, D, D, T=10)  # B=1: below the threads' bar
    opts = dict(rule=rule, feature_map=fmap)
    o, state = decode(q, k, v, kw, inplace=inplace, **opts)
    assert len(calls) == q.shape[1] - 3
    check_against_reference(q, k, v, kw, o, state, **opts)
    o_torch, state_torch = torch_step_outputs(q, k, v, kw, **opts)
    assert rel_err(o[:, 3:], o_torch.double().numpy()) < 2e-5
    assert rel_err(state.S, state_torch.S.double().numpy()) < 2e-5
    if state.z is not None:
        assert rel_err(state.z, state_torch.z.double().numpy()) < 2e-5


@pytest.mark.parametrize("rule", ["accumulate", "gated_delta"])
def test_in_place_fast_step_tells_autograd(rule):
    """The compiled step writes the state through a raw pointer; a graph that saved the state must then refuse to
    backpropagate through the overwritten values (as torch's own in-place ops make it), not use them silently."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, generator=gen) for _ in range(3))
    gates = {"g": -torch.rand(1, 2, generator=gen), "beta": torch.rand(1, 2, generator=gen)}
    kw = {} if rule == "accumulate" else gates
    _, state = linattn.step(q, k, v, rule=rule, **kw)
    w = torch.ones_like(state.S, requires_grad=True)
    y = (state.S * w).sum()
    version = state.S._version
    linattn.step(q, k, v, state, rule=rule, inplace=True, **kw)
    assert state.S._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.parametrize("rule,gate,fmap,G", CASES)
@pytest.mark.parametrize("inplace", [True, False])
def test_decode_from_state_zeros_takes_the_fast_path(calls, rule, gate, fmap, G, inplace):
    """A state from ``State.zeros`` (no record, linattn's own layout) decodes through the compiled call from its
    first token, matches the reference, and comes back recorded as the full path records it."""
    q, k, v, kw = inputs(rule, gate=gate, G=G)
    if fmap == "identity" or fmap is None:
        k = F.normalize(k, dim=-1)
    B, T, HV, Dv = v.shape
    normalized = rule in ("accumulate", "gated")
    state = State.zeros(B, HV, q.shape[-1], Dv, normalizer=normalized)
    outs = []
    for t in range(T):
        tok = {n: x[:, t].contiguous() for n, x in kw.items()}
        o, state = linattn.step(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(), state,
                                rule=rule, feature_map=fmap, inplace=inplace, **tok)
        outs.append(o.unsqueeze(1))
    assert len(calls) == T
    check_against_reference(q, k, v, kw, torch.cat(outs, dim=1), state, rule=rule, feature_map=fmap)
    assert (state.rule, state.feature_map, state.normalized) == (rule, fmap or "identity", normalized)


def test_state_zeros_of_the_wrong_shape_still_names_the_state(calls):
    tok, _, opts = _token_state(rule="gated")
    B, H, Dv = tok["v"].shape
    with pytest.raises(ValueError, match="state.S must be"):
        linattn.step(**tok, state=State.zeros(B, H, tok["q"].shape[-1] + 1, Dv), **opts)
    assert calls == []


@pytest.mark.parametrize("rule,gate,fmap", [("accumulate", None, "elu1"), ("gated", "head", "relu1"),
                                            ("gated", "channel", "l2"), ("delta", None, None),
                                            ("gated_delta", "head", "l2"), ("gated_delta", "channel", "l2")])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
def test_split_decode_equals_the_serial_kernel(monkeypatch, rule, gate, fmap, inplace):
    """The split one-call kernel (sequences over two threads, taken from ``policy.DECODE_SPLIT_MIN_ENTRIES``
    state entries) gives the serial kernel's outputs and states bit for bit, for step and Decoder, grouped value heads,
    both layouts of the result; and the reference's."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    split = []
    real = cpu_decode.decode_split
    monkeypatch.setattr(cpu_decode, "decode_split", lambda n, *a, **kw: split.append(n) or real(n, *a, **kw))
    q, k, v, kw = stable_inputs(rule, gate, fmap, B=3, H=2, G=2, D=9, Dv=6)
    opts = dict(rule=rule, feature_map=fmap)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        o_serial, state_serial = decode(q, k, v, kw, inplace=inplace, **opts)
        assert split == []
        monkeypatch.setattr(policy, "DECODE_SPLIT_MIN_ENTRIES", 0)
        o_split, state_split = decode(q, k, v, kw, inplace=inplace, **opts)
        assert split == [2] * (q.shape[1] - 3)
        _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], output_final_state=True,
                                            **{n: x[:, :3] for n, x in kw.items()}, **opts)
        dec = linattn.Decoder(state, **opts)
        outs = [dec(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(),
                    **{n: x[:, t].contiguous() for n, x in kw.items()}) for t in range(3, q.shape[1])]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(o_split, o_serial) and torch.equal(state_split.S, state_serial.S)
    assert torch.equal(torch.stack(outs, dim=1), o_serial[:, 3:]) and torch.equal(dec.state.S, state_serial.S)
    assert len(split) == 2 * (q.shape[1] - 3)
    check_against_reference(q, k, v, kw, o_split, state_split, **opts)


@pytest.mark.parametrize("Dv,split", [(1023, False), (1024, True)], ids=["below", "at"])
@pytest.mark.parametrize("threads", [2, 5])
def test_default_threshold_splits_a_large_state(monkeypatch, Dv, split, threads):
    """With the default threshold a step at more than one thread splits its sequences exactly from
    ``policy.DECODE_SPLIT_MIN_ENTRIES`` state entries (here 2 sequences of one 4,096 x Dv head, unnormalized), on
    no more threads than numba has (a torch thread count above it is capped, not an error), and gives the serial
    kernel's result bit for bit. One group (B = Hq = 1) never splits."""
    import numba

    from linattn.kernels import cpu_threads

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    assert 2 * 4096 * 1024 == policy.DECODE_SPLIT_MIN_ENTRIES
    seen = []
    real = cpu_threads.on_threads
    monkeypatch.setattr(cpu_threads, "on_threads", lambda fn, count, n: seen.append(n) or real(fn, count, n))
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 4096, generator=gen), F.normalize(torch.randn(2, 1, 4096, generator=gen), dim=-1)
    v, beta = torch.randn(2, 1, Dv, generator=gen), torch.rand(2, 1, generator=gen)
    S0 = torch.randn(2, 1, 4096, Dv, generator=gen) * 0.01
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        o, st = linattn.step(q, k, v, State(S0.clone(), None), rule="delta", beta=beta, inplace=True)
        # one group (B = Hq = 1) of 4,096 x 4,096 entries: past the threshold, but run on one thread
        o_one, st_one = linattn.step(q[:1], k[:1], torch.ones(1, 1, 4096),
                                     State.zeros(1, 1, 4096, 4096, normalizer=False),
                                     rule="delta", beta=beta[:1], inplace=True)
        torch.set_num_threads(1)  # the serial kernel
        o1, st1 = linattn.step(q, k, v, State(S0.clone(), None), rule="delta", beta=beta, inplace=True)
    finally:
        torch.set_num_threads(before)
    assert seen == ([min(2, numba.config.NUMBA_NUM_THREADS)] if split else []) + [1]
    assert torch.equal(o, o1) and torch.equal(st.S, st1.S)
    qk = torch.dot(q[0, 0], k[0, 0])  # from a zero state: S = k (beta v)^T, o = S^T q / sqrt(D)
    assert torch.allclose(o_one[0, 0], qk * beta[0, 0] * torch.ones(4096) / 4096**0.5, rtol=1e-4, atol=1e-6)
    assert torch.allclose(st_one.S[0, 0], torch.outer(k[0, 0], beta[0, 0] * torch.ones(4096)))


def test_split_decode_with_a_bad_gate_writes_nothing(monkeypatch):
    """A positive log-gate in the last sequence of a split step: no part writes (all gates are checked before any
    thread starts), and the step raises the full path's error naming g."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    monkeypatch.setattr(policy, "DECODE_SPLIT_MIN_ENTRIES", 0)
    gen = torch.Generator().manual_seed(3)
    B, H, D = 3, 2, 8
    q, k, v = (torch.randn(B, H, D, generator=gen) for _ in range(3))
    g = -torch.rand(B, H, generator=gen)
    g[2, 1] = 0.5
    state = State(torch.randn(B, H, D, D, generator=gen), torch.rand(B, H, D, generator=gen))
    S0, z0 = state.S.clone(), state.z.clone()
    buf = torch.cat([state.S, state.z.unsqueeze(-1)], dim=-1).contiguous()  # the kernel's [S | z] layout
    buf0, o, g1 = buf.clone(), torch.zeros_like(v), g.unsqueeze(-1).contiguous()
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), g1.data_ptr(), q.data_ptr(), buf.data_ptr(), buf.data_ptr(),
            o.data_ptr(), B, H, H, D, D, 1, cpu_decode.FEATURE_CODES["elu1"], 0, 1, 0, D**-0.5, 1e-6)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert cpu_decode.decode_split(2, *args) == cpu_decode.BAD_GATE
        assert torch.equal(buf, buf0) and not o.any()
        with pytest.raises(ValueError, match="g"):
            linattn.step(q, k, v, state, rule="gated", g=g, feature_map="elu1", inplace=True)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(state.S, S0) and torch.equal(state.z, z0)
    g1[2, 1] = -0.1  # every gate fine: the split call writes
    assert cpu_decode.decode_split(2, *args) == cpu_decode.OK and not torch.equal(buf, buf0) and o.all()
