"""``linattn.Decoder``: a decode loop validated once. Every rule, feature map, head grouping and gate kind against
the float64 reference; the plain case through one compiled call (a spy on the kernel entry); the state updated in
place; the same errors as ``linattn.step`` for bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State

pytest.importorskip("numba")

TOL = 2e-4


def inputs(rule, gate, *, B=2, T=9, H=2, G=1, D=5, Dv=3, seed=0, dtype=torch.float32, fmap=None):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H * G, Dv, generator=gen, dtype=torch.float64).to(dtype)
    kw = {}
    if rule in ("gated", "gated_delta"):
        shape = (B, T, H * G) if gate == "head" else (B, T, H * G, feature_width(fmap, D))  # per key channel
        kw["g"] = F.logsigmoid(torch.randn(*shape, generator=gen, dtype=torch.float64) * 2 + 1).to(dtype)
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(B, T, H * G, generator=gen, dtype=torch.float64).to(dtype)
        k = F.normalize(k, dim=-1)
    return q, k, v, kw


def feature_width(fmap, D):
    return 1 + D + D * D if fmap == "taylor2" else D


CASES = [(rule, gate, fmap, G)
         for rule in linattn.RULES
         for gate in (("head", "channel") if rule in ("gated", "gated_delta") else (None,))
         for fmap in (None, "identity", "relu1", "elu1", "l2", "taylor2")
         for G in (1, 2)
         if not (rule in ("accumulate", "gated") and fmap in (None, "identity", "l2"))]  # normalized: positive maps


@pytest.mark.parametrize(("rule", "gate", "fmap", "G"), CASES)
def test_decoder_matches_reference(calls, rule, gate, fmap, G):
    q, k, v, kw = inputs(rule, gate, G=G, fmap=fmap)
    B, T, HV, Dv = v.shape
    normalized = rule in ("accumulate", "gated")
    state = State.zeros(B, HV, feature_width(fmap, q.shape[-1]), Dv, normalizer=normalized)
    S_memory = state.S.data_ptr()
    dec = linattn.Decoder(state, rule=rule, feature_map=fmap)
    outs = [dec(q[:, t].contiguous(), k[:, t].contiguous(), v[:, t].contiguous(),
                **{n: x[:, t].contiguous() for n, x in kw.items()}) for t in range(T)]
    o_ref, S_ref, z_ref = reference_call(q, k, v, rule=rule, feature_map=fmap, **kw)
    assert rel_err(torch.stack(outs, dim=1), o_ref) < TOL
    assert rel_err(dec.state.S, S_ref) < TOL and dec.state.S.data_ptr() == S_memory  # updated where it lies
    if z_ref is not None:
        assert rel_err(dec.state.z, z_ref) < TOL
    compiled = fmap != "taylor2"
    assert len(calls) == (T if compiled else 0)


@pytest.mark.parametrize("rule", linattn.RULES)
def test_decoder_from_a_prefill_and_in_float64(rule):
    """From a prefill's state, float64 (the full path), equal to step(inplace=True) token by token."""
    q, k, v, kw = inputs(rule, "head", dtype=torch.float64, T=7)
    fmap = "elu1" if rule in ("accumulate", "gated") else "l2"
    head = {n: x[:, :3] for n, x in kw.items()}
    _, state = linattn.linear_attention(q[:, :3], k[:, :3], v[:, :3], rule=rule, feature_map=fmap,
                                        output_final_state=True, **head)
    twin = state.clone()
    dec = linattn.Decoder(state, rule=rule, feature_map=fmap, eps_mode="clamp", eps=0.01, scale=0.5)
    for t in range(3, 7):
        tok = {n: x[:, t] for n, x in kw.items()}
        o = dec(q[:, t], k[:, t], v[:, t], **tok)
        o_step, twin = linattn.step(q[:, t], k[:, t], v[:, t], twin, rule=rule, feature_map=fmap, eps_mode="clamp",
                                    eps=0.01, scale=0.5, inplace=True, **tok)
        assert torch.equal(o, o_step)
    assert torch.equal(dec.state.S, twin.S)


def _error(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


BAD_CALLS = {
    "q shape": lambda q, k, v, g, b: (q[:, :, :-1], k, v, g, b),
    "k dtype": lambda q, k, v, g, b: (q, k.double(), v, g, b),
    "v heads": lambda q, k, v, g, b: (q, k, v[:, :1], g, b),
    "g positive": lambda q, k, v, g, b: (q, k, v, g.abs() + 0.1, b),
    "g NaN": lambda q, k, v, g, b: (q, k, v, torch.full_like(g, float("nan")), b),
    "g shape": lambda q, k, v, g, b: (q, k, v, g[:, :1], b),
    "g missing": lambda q, k, v, g, b: (q, k, v, None, b),
    "beta shape": lambda q, k, v, g, b: (q, k, v, g, b[:1]),
    "beta not a tensor": lambda q, k, v, g, b: (q, k, v, g, 0.5),
    "q not a tensor": lambda q, k, v, g, b: ([1.0], k, v, g, b),
}


@pytest.mark.parametrize("bad", list(BAD_CALLS))
def test_bad_input_raises_what_step_raises_and_leaves_the_state(bad):
    q, k, v, kw = inputs("gated_delta", "head", T=1)
    state = State.zeros(2, 2, 5, 3, normalizer=False)
    dec = linattn.Decoder(state, rule="gated_delta", feature_map="l2")
    args = BAD_CALLS[bad](q[:, 0], k[:, 0], v[:, 0], kw["g"][:, 0], kw["beta"][:, 0])
    got = _error(lambda: dec(*args[:3], g=args[3], beta=args[4]))
    want = _error(lambda: linattn.step(*args[:3], state.clone(), rule="gated_delta", feature_map="l2", g=args[3],
                                       beta=args[4], inplace=True))
    assert got == want and got != "no error", (got, want)
    assert not state.S.any()


def test_bad_construction_names_the_argument():
    state = State.zeros(1, 2, 4, 3)
    with pytest.raises(ValueError, match="rule: unknown rule"):
        linattn.Decoder(state, rule="deltax")
    with pytest.raises(ValueError, match="feature_map: unknown name"):
        linattn.Decoder(state, feature_map="l2x")
    with pytest.raises(ValueError, match="eps must be"):
        linattn.Decoder(state, eps=-1.0)
    with pytest.raises(ValueError, match="backend"):
        linattn.Decoder(state, backend="gpu")
    with pytest.raises(TypeError, match="state must be a linattn.State"):
        linattn.Decoder(state.S)
    with pytest.raises(ValueError, match="normalize=True: rule 'delta'"):
        linattn.Decoder(state, rule="delta", normalize=True)
    with pytest.raises(ValueError, match="state.z is set but normalize=False"):
        linattn.Decoder(state, rule="delta")
    with pytest.raises(ValueError, match="inplace=True: the state requires grad"):
        linattn.Decoder(State(state.S.clone().requires_grad_(), state.z.clone()))
    for empty in ((1, 2, 0, 3), (0, 2, 4, 3), (1, 2, 4, 0)):  # once a ZeroDivisionError for a width of 0
        with pytest.raises(ValueError, match=r"state.S must have no empty dimension, got shape"):
            linattn.Decoder(State.zeros(*empty))
    with pytest.raises(ValueError, match=r"state.S must be a dense \(strided\) tensor"):
        linattn.Decoder(State(state.S.to_sparse(), state.z))
    recorded = linattn.linear_attention(torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 4), torch.ones(1, 2, 2, 3),
                                        rule="gated", g=torch.zeros(1, 2, 2), feature_map="elu1",
                                        output_final_state=True)[1]
    with pytest.raises(ValueError, match="made by rule 'gated'"):
        linattn.Decoder(recorded, rule="accumulate", feature_map="elu1")


def test_replaced_state_is_checked_like_step():
    """dec.state may be replaced; a state of another rule or batch is refused as step refuses it, never written."""
    B, H, D = 2, 2, 4
    dec = linattn.Decoder(linattn.State.zeros(B, H, D, D), rule="accumulate")
    x = [torch.randn(B, H, D) for _ in range(3)]
    _, gated = linattn.linear_attention(*(torch.randn(4, 3, H, D) for _ in range(3)), rule="gated",
                                        g=-torch.rand(4, 3, H), output_final_state=True)
    dec.state = gated
    before = gated.S.clone()
    with pytest.raises(ValueError, match="rule 'gated'"):
        dec(*x)
    assert torch.equal(gated.S, before)
    small = linattn.State.zeros(1, H, D, D)
    dec.state = small
    with pytest.raises(ValueError, match="state.S must be"):
        dec(*x)
    assert not small.S.any()


def test_partial_record_is_checked_on_the_fast_path():
    """A hand-built State that records a feature map but no rule is refused for another map on every backend."""
    H, D = 2, 4
    buf = torch.zeros(1, H, D, D + 1)
    state = linattn.State(buf[..., :D], buf[..., D], feature_map="elu1")
    q, k, v = (torch.randn(1, H, D) for _ in range(3))
    for backend in ("auto", "torch"):
        with pytest.raises(ValueError, match="feature_map 'elu1'"):
            linattn.step(q, k, v, state, backend=backend)


@pytest.mark.parametrize("rule", linattn.RULES)
def test_inputs_that_require_grad_are_refused_in_place(rule):
    """An in-place step records no graph: an input requiring grad is refused by name on the first call, before
    anything is written (left to run, the delta rules' backward met an overwritten state, and a k or v requiring
    grad made the caller's state require grad, so the next in-place step refused it and a Decoder could not go
    on). Under torch.no_grad() the same inputs decode as plain ones."""
    q, k, v, kw = inputs(rule, "head", T=1)
    x = dict(q=q[:, 0], k=k[:, 0], v=v[:, 0], **{n: t[:, 0] for n, t in kw.items()})
    normalized = rule in ("accumulate", "gated")
    fmap = "elu1" if normalized else "l2"
    for name in x:
        state = State.zeros(2, 2, 5, 3, normalizer=normalized)
        dec = linattn.Decoder(state.clone(), rule=rule, feature_map=fmap)
        args = {n: t.clone().requires_grad_(n == name) for n, t in x.items()}
        with pytest.raises(ValueError, match=rf"inplace=True: {name} requires grad.*torch.no_grad\(\).*inplace=False"):
            linattn.step(args.pop("q"), args.pop("k"), args.pop("v"), state, rule=rule, feature_map=fmap,
                         inplace=True, **args)
        args = {n: t.clone().requires_grad_(n == name) for n, t in x.items()}
        with pytest.raises(ValueError, match=rf"inplace=True: {name} requires grad"):
            dec(args["q"], args["k"], args["v"], g=args.get("g"), beta=args.get("beta"))
        for st in (state, dec.state):
            assert not st.S.any() and not st.S.requires_grad
        with torch.no_grad():
            o = dec(args["q"], args["k"], args["v"], g=args.get("g"), beta=args.get("beta"))
        o_plain, want = linattn.step(x["q"], x["k"], x["v"], state, rule=rule, feature_map=fmap,
                                     **{n: t for n, t in x.items() if n in ("g", "beta")})
        assert torch.allclose(o, o_plain, atol=1e-6) and torch.allclose(dec.state.S, want.S, atol=1e-6)
        assert not dec.state.S.requires_grad


@pytest.mark.parametrize("rule", ["gated", "gated_delta"])
def test_step_runs_under_vmap_over_the_gate(rule):
    """step vmapped over g (and over q, v, g at once) equals a loop of steps: the gate value check, which reads
    values into Python, is skipped for vmap's batched tensors (it once raised vmap's "data-dependent control
    flow"); in place with a state vmap does not batch is refused by name; the Decoder refuses every torch.func
    transform with its own message (it once raised baddbmm's in-place error)."""
    q, k, v, kw = inputs(rule, "head", T=5)
    q, k, v, g = q.transpose(0, 1), k[:, 0], v.transpose(0, 1), kw["g"].transpose(0, 1)  # [T=5, B, ...]: vmap dims
    beta = kw.get("beta", torch.empty(0))[:, 0] if rule == "gated_delta" else None
    normalized = rule == "gated"
    fmap = "elu1" if normalized else "l2"
    state = State.zeros(2, 2, 5, 3, normalizer=normalized)

    def one(q_, v_, g_):
        return linattn.step(q_, k, v_, state, rule=rule, feature_map=fmap, g=g_, beta=beta)[0]

    want = torch.stack([one(q[i], v[i], g[i]) for i in range(5)])
    got = torch.func.vmap(lambda g_: one(q[0], v[0], g_))(g)
    assert torch.allclose(got, torch.stack([one(q[0], v[0], g[i]) for i in range(5)]), atol=1e-6)
    assert torch.allclose(torch.func.vmap(one)(q, v, g), want, atol=1e-6)
    with pytest.raises(ValueError, match="inplace=True: g is batched by torch.func.vmap but the state is not"):
        torch.func.vmap(lambda g_: linattn.step(q[0], k, v[0], state, rule=rule, feature_map=fmap, g=g_, beta=beta,
                                                inplace=True)[0])(g)
    assert not state.S.any()
    dec = linattn.Decoder(state, rule=rule, feature_map=fmap)
    with pytest.raises(ValueError, match=r"Decoder: called under a torch.func transform .*inplace=False"):
        torch.func.vmap(lambda g_: dec(q[0], k, v[0], g=g_, beta=beta))(g)
    with pytest.raises(ValueError, match=r"Decoder: called under a torch.func transform"):
        torch.func.grad(lambda v_: dec(q[0], k, v_, g=g[0], beta=beta).sum())(v[0])
    assert not dec.state.S.any()
    assert torch.allclose(dec(q[0], k, v[0], g=g[0], beta=beta), want[0], atol=1e-6)  # and runs outside


def test_decoder_for_keeps_one_decoder_per_holder():
    """decode.decoder_for: the same Decoder while the holder, its arguments and its state stay; a new one when the
    arguments change, the state object is replaced or a bare tensor is re-pointed; the entry goes with its holder."""
    import gc

    from linattn import decode

    class Holder:
        pass

    holder, state = Holder(), State.zeros(1, 2, 4, 3)
    dec = decode.decoder_for(holder, state, rule="accumulate")
    assert dec.state is state and decode.decoder_for(holder, state, rule="accumulate") is dec
    assert decode.decoder_for(holder, state, rule="accumulate", eps=0.5) is not dec  # other arguments
    other = State.zeros(1, 2, 4, 3)
    assert decode.decoder_for(holder, other, rule="accumulate", eps=0.5).state is other  # another state object
    S = torch.zeros(1, 2, 4, 3)
    bare = decode.decoder_for(S, S, rule="gated", normalize=False)
    assert bare.state.S.data_ptr() == S.data_ptr() and bare.state.S is not S  # an alias, not the key itself
    assert decode.decoder_for(S, S, rule="gated", normalize=False) is bare
    S.set_(torch.zeros(1, 2, 4, 3))  # re-pointed in place: a new decoder on the new memory
    again = decode.decoder_for(S, S, rule="gated", normalize=False)
    assert again is not bare and again.state.S.data_ptr() == S.data_ptr()
    held = len(decode.DECODERS)
    del holder, S
    gc.collect()
    assert len(decode.DECODERS) == held - 2
