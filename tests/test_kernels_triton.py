"""Triton kernels (linattn.kernels.triton) against the float64 NumPy reference.

On a machine without CUDA the kernels run under Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` must be
in the environment before triton is first imported, so tests/conftest.py sets it when there is no CUDA device.
On CUDA the same tests run compiled on the device. The interpreter is slow (0.1 s per linear chunk call, 0.5 s per
delta chunk call here): the default run keeps a fixed subset of about 30 s; ``python -m pytest -m slow
tests/test_kernels_triton.py`` runs the wider sweep.

Shapes are awkward on purpose: T not a multiple of the chunk, B*H > 1, Dk != Dv, odd widths (masked blocks),
inputs given as [B, H, T, D] views of [B, T, H, D] tensors (strided, as linattn.api passes them).
"""

from __future__ import annotations

import pytest
import torch
from helpers import np64, rel_err

from linattn import reference

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
# (rule, gate kind): the five kernels' variants.
VARIANTS = [("accumulate", None), ("gated", "head"), ("gated", "channel"), ("delta", None), ("gated_delta", "head")]
IDS = [f"{r}-{k}" if k else r for r, k in VARIANTS]
GATED = [(r, k) for r, k in VARIANTS if k]


@pytest.fixture(scope="module")
def tk():
    """The kernel package; without CUDA its kernels must be interpreted (conftest sets TRITON_INTERPRET=1)."""
    import linattn.kernels.triton as kt

    if DEVICE == "cpu" and not kt.interpreted():
        pytest.skip("no CUDA device and triton was imported without TRITON_INTERPRET=1")
    return kt


def make(rule, kind, *, B=2, T=37, H=3, Dk=5, Dv=7, gates="wide", initial=True, seed=0, dtype=torch.float64):
    """Inputs in the reference layout [B, T, H, D] (float64 leaves, rounded to ``dtype``) and its gate/beta/S0."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, lo=-1.0, hi=1.0):
        return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=torch.float64)).to(dtype).double()

    q, k, v = rand(B, T, H, Dk), rand(B, T, H, Dk), rand(B, T, H, Dv)
    x = {"q": q, "k": k, "v": v, "g": None, "beta": None, "S0": rand(B, H, Dk, Dv) if initial else None}
    if rule in ("delta", "gated_delta"):
        # Unit keys and beta in (0, 1.5): the write converges.
        x["k"] = (k / k.norm(dim=-1, keepdim=True)).to(dtype).double()
        x["beta"] = rand(B, T, H, lo=0.05, hi=1.5)
    if kind is not None:
        shape = (B, T, H, Dk) if kind == "channel" else (B, T, H)
        lo, hi = {"wide": (-8.0, -1e-4), "near_one": (-1e-3, -1e-5), "near_zero": (-30.0, -5.0)}.get(gates, (-3, -0.1))
        g = torch.empty(shape, dtype=torch.float64).uniform_(lo, hi, generator=gen)
        if gates == "resets":  # a full reset (-inf) and a huge finite gate inside chunks
            g[:, 7] = float("-inf")
            g[:, 21] = -1e30
        x["g"] = g.to(dtype).double()
    return x


def heads_first(x, dtype):
    return None if x is None else x.to(dtype).to(DEVICE).transpose(1, 2)


def run_chunk(tk, rule, x, dtype, chunk_size=16, scale=0.7):
    kernel = tk.chunk_kernel(rule)
    S0 = None if x["S0"] is None else x["S0"].to(dtype).to(DEVICE)
    return kernel(
        *(heads_first(x[n], dtype) for n in ("q", "k", "v")), g=heads_first(x["g"], dtype),
        beta=heads_first(x["beta"], dtype), initial_state=S0, chunk_size=chunk_size, scale=scale,
    )


def ref(rule, x, scale=0.7):
    o, S, _ = reference.linear_attention(
        np64(x["q"]), np64(x["k"]), np64(x["v"]), rule=rule, normalize=False, scale=scale, g=np64(x["g"]),
        beta=np64(x["beta"]), initial_S=np64(x["S0"]),
    )
    return o, S


def check_chunk(tk, rule, kind, dtype, chunk_size=16, **shape):
    x = make(rule, kind, dtype=dtype, **shape)
    o, S = run_chunk(tk, rule, x, dtype, chunk_size)
    o_ref, S_ref = ref(rule, x)
    assert o.dtype == dtype and S.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    err = {"o": rel_err(o.transpose(1, 2), o_ref), "S": rel_err(S, S_ref)}
    assert max(err.values()) <= TOL[dtype], f"{rule}/{kind} {dtype}: {err}"


# ------------------------------------------------------------------------------------------- chunk forward
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_chunk_forward_matches_reference(tk, rule, kind, dtype):
    check_chunk(tk, rule, kind, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("gates", ["near_zero", "near_one", "resets"])
@pytest.mark.parametrize("rule,kind", GATED, ids=[f"{r}-{k}" for r, k in GATED])
def test_chunk_forward_extreme_gates(tk, rule, kind, gates, dtype):
    """Gates near 0 and 1, a reset (-inf) and -1e30 inside chunks; in float32 the cumulative log-gates after a
    reset are about -1000, where only a float64 sum (or a two-float difference) keeps the later differences."""
    check_chunk(tk, rule, kind, dtype, gates=gates, T=29)


@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_chunk_forward_bfloat16_without_initial_state(tk, rule, kind):
    check_chunk(tk, rule, kind, torch.bfloat16, initial=False, T=21)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_chunk_forward_wide_sweep(tk, rule, kind, chunk_size, dtype):
    """Several value blocks (Dv = 70 > 64), Dk = 33 (a 64-wide masked key block), T = 150, B*H = 4."""
    check_chunk(tk, rule, kind, dtype, chunk_size, B=2, H=2, T=150, Dk=33, Dv=70, seed=1)


def test_chunk_normalizer_column_as_the_api_builds_it(tk):
    """The normalizer rides as a value column of ones: num / (den + eps) equals the normalized reference."""
    x = make("gated", "head", T=23, Dv=6)
    z0 = torch.rand(2, 3, 5, dtype=torch.float64) + 0.5
    x["q"], x["k"] = x["q"].abs() + 0.1, x["k"].abs() + 0.1
    ones = torch.ones_like(x["v"][..., :1])
    aug = dict(x, v=torch.cat([x["v"], ones], -1), S0=torch.cat([x["S0"], z0[..., None]], -1))
    o, S = run_chunk(tk, "gated", aug, torch.float64)
    o = o.transpose(1, 2).cpu()
    o = o[..., :-1] / (o[..., -1:] + 1e-6)
    o_ref, S_ref, z_ref = reference.linear_attention(
        np64(x["q"]), np64(x["k"]), np64(x["v"]), rule="gated", scale=0.7, g=np64(x["g"]), initial_S=np64(x["S0"]),
        initial_z=np64(z0), eps=1e-6,
    )
    assert rel_err(o, o_ref) <= 1e-10 and rel_err(S[..., :-1], S_ref) <= 1e-10 and rel_err(S[..., -1], z_ref) <= 1e-10


# ------------------------------------------------------------------------------------------- gradients
def grads_of(fn, leaves, weights):
    o, S = fn(*leaves)
    loss = (o * weights[0]).sum() + (S * weights[1]).sum()
    return torch.autograd.grad(loss, [x for x in leaves if x is not None])


@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_chunk_gradients_match_token_loop(tk, rule, kind):
    """Gradients through the Triton chunk kernels (backward: _backward.py for accumulate and gated, _delta_backward.py
    for the delta rules) equal the float64 token loop's, for q, k, v, g, beta and the initial state; the forward
    matches the reference too."""
    from linattn.ops import gated, gated_delta

    x = make(rule, kind, T=19, gates="moderate")
    names = ("q", "k", "v", "g", "beta", "S0")
    leaves = [None if x[n] is None else x[n].to(DEVICE).transpose(1, 2).contiguous().requires_grad_()
              if n != "S0" else x[n].to(DEVICE).requires_grad_() for n in names]
    loop = gated_delta.recurrent if rule in ("delta", "gated_delta") else gated.recurrent
    gen = torch.Generator().manual_seed(5)
    weights = (torch.randn(2, 3, 19, 7, generator=gen, dtype=torch.float64).to(DEVICE),
               torch.randn(2, 3, 5, 7, generator=gen, dtype=torch.float64).to(DEVICE))

    def triton_fn(q, k, v, g, beta, S0):
        return tk.chunk_kernel(rule)(q, k, v, g=g, beta=beta, initial_state=S0, chunk_size=16, scale=0.7)

    def loop_fn(q, k, v, g, beta, S0):
        return loop(q, k, v, g=g, beta=beta, initial_state=S0, scale=0.7)

    o, S = triton_fn(*leaves)
    o_ref, S_ref = ref(rule, x)
    assert rel_err(o.transpose(1, 2), o_ref) <= 1e-10 and rel_err(S, S_ref) <= 1e-10
    got, want = grads_of(triton_fn, leaves, weights), grads_of(loop_fn, leaves, weights)
    present = [n for n, leaf in zip(names, leaves, strict=True) if leaf is not None]
    for name, a, b in zip(present, got, want, strict=True):
        assert rel_err(a, np64(b)) <= 1e-10, name


# The delta rules in float32 through resets: slow (the fast subset above has float32 and resets separately).
RESET_GRAD_CASES = [
    pytest.param(r, k, d, id=f"{i}-{n}", marks=[pytest.mark.slow] if r.endswith("delta") and n == "f32" else [])
    for (r, k), i in zip(VARIANTS, IDS, strict=True) for d, n in ((torch.float64, "f64"), (torch.float32, "f32"))
]


@pytest.mark.parametrize("rule,kind,dtype", RESET_GRAD_CASES)
def test_chunk_gradients_through_resets(tk, rule, kind, dtype):
    """Gates -inf and -1e30 inside chunks (and gates near 0): finite gradients equal to the torch chunk form's
    (itself tested against the token loop through resets in test_extreme_gates.py); 0 for a floored gate."""
    import importlib

    x = make(rule, kind, T=29, gates="resets" if kind else "wide", dtype=dtype)
    names = ("q", "k", "v", "g", "beta", "S0")

    def leaves():
        return [None if x[n] is None else (x[n] if n == "S0" else x[n].transpose(1, 2)).to(dtype).to(DEVICE)
                .contiguous().requires_grad_() for n in names]

    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(2, 3, 29, 7, generator=gen).to(dtype).to(DEVICE),
         torch.randn(2, 3, 5, 7, generator=gen).to(DEVICE))
    torch_chunk = importlib.import_module(f"linattn.ops.{rule}").FORMS["chunk"]
    got = grads_of(lambda q, k, v, g, b, S0: tk.chunk_kernel(rule)(q, k, v, g=g, beta=b, initial_state=S0,
                                                                   chunk_size=16, scale=0.7), leaves(), w)
    want = grads_of(lambda q, k, v, g, b, S0: torch_chunk(q, k, v, g=g, beta=b, initial_state=S0, chunk_size=16,
                                                          scale=0.7), leaves(), w)
    present = [n for n in names if x[n] is not None]
    for name, a, b in zip(present, got, want, strict=True):
        assert torch.isfinite(a).all(), name
        assert rel_err(a, np64(b)) <= (1e-10 if dtype == torch.float64 else 1e-4), name
    if kind:
        g_grad = got[present.index("g")]
        assert (g_grad[:, :, 7] == 0).all() and (g_grad[:, :, 21] == 0).all()


@pytest.mark.parametrize("rule,kind", [("gated", "head"), ("delta", None)], ids=["gated-head", "delta"])
def test_chunk_gradient_without_initial_state_and_partial_outputs(tk, rule, kind):
    """Only o used, no initial state, only v requires grad: the backward returns what autograd asks for."""
    from linattn.ops import gated, gated_delta

    x = make(rule, kind, T=17, initial=False)
    q, k, g, beta = (None if x[n] is None else x[n].transpose(1, 2).to(DEVICE) for n in ("q", "k", "g", "beta"))
    v = x["v"].transpose(1, 2).contiguous().to(DEVICE).requires_grad_()
    o, _ = tk.chunk_kernel(rule)(q, k, v, g=g, beta=beta, initial_state=None, chunk_size=16, scale=1.0)
    (gv,) = torch.autograd.grad(o.square().sum(), [v])
    v2 = v.detach().clone().requires_grad_()
    loop = gated_delta.recurrent if rule == "delta" else gated.recurrent
    S0 = torch.zeros(2, 3, 5, 7, dtype=torch.float64, device=DEVICE)
    o2, _ = loop(q, k, v2, g=g, beta=beta, initial_state=S0)
    (gv2,) = torch.autograd.grad(o2.square().sum(), [v2])
    assert rel_err(gv, np64(gv2)) <= 1e-10


# ------------------------------------------------------------------------------------------- delta backward
def delta_grads(tk, rule, x, dtype, chunk_size, *, use_o=True, use_S=True):
    """Gradients of (o * Wo).sum() + (S * WS).sum() through the Triton delta kernels (inputs rounded to ``dtype``)
    and through the float64 token loop on the same rounded values, in the order q, k, v, g, beta, S0."""
    from linattn.ops import gated_delta

    names = [n for n in ("q", "k", "v", "g", "beta", "S0") if x[n] is not None]
    shape_o = x["v"].transpose(1, 2).shape
    B, H, _, Dv = shape_o
    gen = torch.Generator().manual_seed(11)
    w_o = torch.randn(*shape_o, generator=gen, dtype=torch.float64) if use_o else None
    w_S = torch.randn(B, H, x["q"].shape[-1], Dv, generator=gen, dtype=torch.float64) if use_S else None

    def leaves(dt):
        return {n: (x[n] if n == "S0" else x[n].transpose(1, 2)).to(dt).to(DEVICE).contiguous().requires_grad_()
                for n in names}

    def loss(o, S):
        return sum((a.double() * w.to(DEVICE)).sum() for a, w in ((o, w_o), (S, w_S)) if w is not None)

    ours = leaves(dtype)
    o, S = tk.chunk_kernel(rule)(ours["q"], ours["k"], ours["v"], g=ours.get("g"), beta=ours["beta"],
                                 initial_state=ours.get("S0"), chunk_size=chunk_size, scale=0.7)
    got = torch.autograd.grad(loss(o, S), [ours[n] for n in names])
    # Without o in the loss the loop leaves q out of the graph: its gradient is 0.
    ref = leaves(torch.float64)
    S0 = ref.get("S0")
    if S0 is None:
        S0 = torch.zeros(B, H, x["q"].shape[-1], Dv, dtype=torch.float64, device=DEVICE)
    o2, S2 = gated_delta.recurrent(ref["q"], ref["k"], ref["v"], g=ref.get("g"), beta=ref["beta"], initial_state=S0,
                                   scale=0.7)
    want = torch.autograd.grad(loss(o2, S2), [ref[n] for n in names], allow_unused=True)
    want = [torch.zeros_like(ref[n]) if w is None else w for n, w in zip(names, want, strict=True)]
    return names, got, want


def check_delta_grads(tk, rule, dtype, chunk_size=16, gates="moderate", use_o=True, use_S=True, **shape):
    x = make(rule, "head" if rule == "gated_delta" else None, gates=gates, dtype=dtype, **shape)
    names, got, want = delta_grads(tk, rule, x, dtype, chunk_size, use_o=use_o, use_S=use_S)
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        assert rel_err(a, np64(b)) <= TOL[dtype], f"{rule} d{name} {dtype}: {rel_err(a, np64(b))}"


# The fixed fast subset: each rule in float64 and a half dtype, gates near 0 and near 1, with and without an
# initial state, chunks of 16 and 32, T never a multiple of the chunk.
DELTA_GRAD_FAST = [
    pytest.param("delta", torch.float64, 16, "moderate", {"T": 37}, id="delta-f64"),
    pytest.param("gated_delta", torch.float64, 16, "near_zero", {"T": 29}, id="gdn-f64-near_zero"),
    pytest.param("gated_delta", torch.float64, 32, "near_one", {"T": 45, "initial": False}, id="gdn-f64-near_one-c32"),
    pytest.param("gated_delta", torch.float32, 16, "wide", {"T": 23, "B": 1, "H": 2}, id="gdn-f32"),
    pytest.param("delta", torch.bfloat16, 16, "moderate", {"T": 21, "initial": False}, id="delta-bf16"),
    pytest.param("gated_delta", torch.bfloat16, 16, "moderate", {"T": 21}, id="gdn-bf16"),
]


@pytest.mark.parametrize("rule,dtype,chunk_size,gates,shape", DELTA_GRAD_FAST)
def test_delta_backward_matches_float64_autograd(tk, rule, dtype, chunk_size, gates, shape):
    """The Triton backward of the delta rules (_delta_backward) against float64 autograd through the token loop on
    the same rounded inputs: dq, dk, dv, dg, dbeta and the initial state's gradient, from o and the final state."""
    check_delta_grads(tk, rule, dtype, chunk_size, gates, **shape)


@pytest.mark.parametrize("use_o,use_S", [(False, True), (True, False)], ids=["final-state-only", "output-only"])
def test_delta_backward_from_one_output(tk, use_o, use_S):
    """Only the final state (or only o) feeds the loss: the other gradient is None in the backward."""
    check_delta_grads(tk, "gated_delta", torch.float64, 16, "moderate", use_o=use_o, use_S=use_S, T=19, B=1)


def test_delta_forward_keeps_buffers_only_when_recording_a_graph(tk, monkeypatch):
    """Under torch.no_grad (inference, perf's forward timing) inputs that require grad must not make the forward
    keep the backward's buffers; with a graph it keeps them, and the backward then runs."""
    from linattn.kernels.triton import _delta

    seen = []
    real = _delta.chunk_delta

    def spy(*a, save=False, **kw):
        seen.append(save)
        return real(*a, save=save, **kw)

    monkeypatch.setattr(_delta, "chunk_delta", spy)
    x = make("delta", None, T=17, B=1, H=1)
    q, k, v, beta = (x[n].transpose(1, 2).to(DEVICE).requires_grad_() for n in ("q", "k", "v", "beta"))
    with torch.no_grad():
        tk.chunk_kernel("delta")(q, k, v, beta=beta, chunk_size=16)
    o, _ = tk.chunk_kernel("delta")(q, k, v, beta=beta, chunk_size=16)
    o.sum().backward()
    assert seen == [False, True] and q.grad is not None and torch.isfinite(q.grad).all()


def test_delta_backward_runs_twice_with_retain_graph(tk):
    """backward(retain_graph=True) then backward again: the saved buffers survive, and both give the same grads."""
    x = make("delta", None, T=17, B=1, H=1)
    q, k, v, beta = (x[n].transpose(1, 2).to(DEVICE).requires_grad_() for n in ("q", "k", "v", "beta"))
    o, _ = tk.chunk_kernel("delta")(q, k, v, beta=beta, chunk_size=16)
    loss = (o**2).sum()
    loss.backward(retain_graph=True)
    first = v.grad.clone()
    loss.backward()
    assert torch.allclose(v.grad, 2 * first)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_delta_backward_wide_sweep(tk, rule, chunk_size, dtype):
    """Two value blocks (Dv = 70), Dk = 33 (a 64-wide masked key block), T = 150, B*H = 4."""
    check_delta_grads(tk, rule, dtype, chunk_size, "wide", B=2, H=2, T=150, Dk=33, Dv=70, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("gates", ["near_zero", "near_one", "resets"])
def test_delta_backward_extreme_gates_float32(tk, gates):
    if gates == "resets":  # against the token loop through -inf: the floored gates' gradients are 0
        x = make("gated_delta", "head", gates="resets", T=29, dtype=torch.float32)
        names, got, _ = delta_grads(tk, "gated_delta", x, torch.float32, 16)
        dg = got[names.index("g")]
        assert (dg[:, :, 7] == 0).all() and (dg[:, :, 21] == 0).all() and all(torch.isfinite(a).all() for a in got)
    else:
        check_delta_grads(tk, "gated_delta", torch.float32, 16, gates, T=40)


# ------------------------------------------------------------------------------------------- chunk_size
@pytest.mark.parametrize("chunk_size", [32, 64])
def test_chunk_size_is_honoured(tk, chunk_size):
    """The delta kernels run chunks of exactly chunk_size tokens (the saved inverse is [T, chunk_size]) and match
    the reference; the linear kernel too."""
    from linattn.kernels.triton import _delta

    x = make("gated_delta", "head", T=70, B=1, H=2)
    o, S, saved = _delta.chunk_delta(*(heads_first(x[n], torch.float64) for n in ("q", "k", "v")),
                                     g=heads_first(x["g"], torch.float64), beta=heads_first(x["beta"], torch.float64),
                                     initial_state=x["S0"].to(DEVICE), chunk_size=chunk_size, scale=0.7, save=True)
    assert saved.BT == chunk_size and saved.ai.shape[-1] == chunk_size and saved.h.shape[2] == -(-70 // chunk_size)
    o_ref, S_ref = ref("gated_delta", x)
    assert rel_err(o.transpose(1, 2), o_ref) <= 1e-10 and rel_err(S, S_ref) <= 1e-10
    check_chunk(tk, "gated", "head", torch.float64, chunk_size, T=70, B=1, H=2)


@pytest.mark.parametrize("chunk_size", [8, 48, 128, 100])
def test_chunk_size_the_kernels_cannot_take_is_refused(tk, chunk_size):
    """A chunk_size the kernels cannot run is a ValueError naming chunk_size, at the kernel and through the API
    (backend='triton'), never a silent rounding."""
    import linattn

    x = make("gated", "head", T=9, B=1, H=2)
    with pytest.raises(ValueError, match=f"chunk_size: .*16, 32, 64.*got {chunk_size}"):
        run_chunk(tk, "gated", x, torch.float64, chunk_size)
    q = torch.randn(1, 9, 2, 4, device=DEVICE)
    with pytest.raises(ValueError, match=f"backend='triton'.*chunk_size: .*got {chunk_size}"):
        linattn.linear_attention(q, q, q, rule="delta", beta=torch.rand(1, 9, 2, device=DEVICE),
                                 chunk_size=chunk_size, backend="triton")


# ------------------------------------------------------------------------------------------- decode step
STEP_VARIANTS = VARIANTS + [("gated_delta", "reset")]


def step_inputs(rule, kind, dtype, Dv=7, augmented=False):
    x = make(rule, "head" if kind == "reset" else kind, T=1, Dv=Dv, dtype=dtype)
    if kind == "reset":
        x["g"][:] = float("-inf")
    S0 = x["S0"].to(dtype)
    if augmented:  # the [S | z] layout linattn.api builds: rows of Dv + 1 with unit stride, state = a strided view
        buf = torch.zeros(*S0.shape[:-1], Dv + 1, dtype=dtype)
        buf[..., :Dv] = S0
        return x, buf.to(DEVICE)[..., :Dv]
    return x, S0.to(DEVICE)


@pytest.mark.parametrize("inplace", [False, True], ids=["copy", "inplace"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("rule,kind", STEP_VARIANTS, ids=IDS + ["gated_delta-reset"])
def test_step_matches_reference(tk, rule, kind, dtype, inplace):
    x, S0 = step_inputs(rule, kind, dtype, augmented=inplace)
    before = S0.clone()
    step = tk.step_kernel(rule)

    def tok(n):
        return None if x[n] is None else x[n][:, 0].to(dtype).to(DEVICE)

    o, S = step(tok("q") * 0.7, tok("k"), tok("v"), g=tok("g"), beta=tok("beta"), state=S0, inplace=inplace)
    o_ref, S_ref = ref(rule, x)
    assert rel_err(o, o_ref[:, 0]) <= TOL[dtype] and rel_err(S, S_ref) <= TOL[dtype]
    if inplace:
        spare = S0.as_strided(S0.shape[:-1], S0.stride()[:-1], S0.storage_offset() + S0.shape[-1])
        assert S.data_ptr() == S0.data_ptr() and S0.stride(-2) == 8 and (spare == 0).all()  # the z slot untouched
    else:
        assert torch.equal(S0, before)


@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_step_half_inputs_float32_state(tk, rule, kind):
    """bfloat16 tokens into a float32 state: products in float32, the output in the state's dtype."""
    x, S0 = step_inputs(rule, kind, torch.bfloat16, Dv=70)
    S0 = S0.float()

    def tok(n):
        return None if x[n] is None else x[n][:, 0].to(torch.bfloat16).to(DEVICE)

    o, S = tk.step_kernel(rule)(tok("q"), tok("k"), tok("v"), g=tok("g"), beta=tok("beta"), state=S0)
    x["S0"] = S0.double().cpu()
    o_ref, S_ref = ref(rule, x, scale=1.0)
    assert o.dtype == torch.float32 and rel_err(o, o_ref[:, 0]) <= 1e-5 and rel_err(S, S_ref) <= 1e-5


def test_step_with_gradients_runs_the_torch_step(tk):
    x, S0 = step_inputs("gated", "channel", torch.float64)
    k, v, g = (x[n][:, 0].to(DEVICE) for n in ("k", "v", "g"))
    q = x["q"][:, 0].to(DEVICE).requires_grad_()
    o, _ = tk.step_kernel("gated")(q, k, v, g=g, state=S0)
    (gq,) = torch.autograd.grad(o.sum(), [q])
    assert rel_err(gq, np64((S0 * g[..., None].exp() + k[..., None] * v[:, :, None, :]).sum(-1))) <= 1e-12
    with pytest.raises(ValueError, match="inplace"):
        tk.step_kernel("gated")(q, k, v, g=g, state=S0, inplace=True)


# ------------------------------------------------------------------------------------------- availability
def test_unavailable_reasons(tk):
    assert tk.unavailable_reason(torch.device(DEVICE), torch.float32, 64) is None
    assert "feature width 4161" in tk.unavailable_reason(torch.device(DEVICE), torch.float32, 4161)
    assert "int32" in tk.unavailable_reason(torch.device(DEVICE), torch.int32, 64)


# ------------------------------------------------------------------------------------------- whole calls
@pytest.mark.parametrize("eps_mode", ["add", "clamp"])
@pytest.mark.parametrize("rule,kind", VARIANTS, ids=IDS)
def test_whole_call_with_feature_map_and_normalizer(tk, rule, kind, eps_mode):
    """The dispatch entry point: public layout, a feature map, the normalizer column and eps, an initial state,
    then decode steps continuing from its final state, all against the reference on the whole sequence."""
    from linattn.feature_maps import resolve_feature_map

    normalize = rule in ("accumulate", "gated")
    x = make(rule, kind, T=21, Dv=6, dtype=torch.float32)
    dev = {n: None if x[n] is None else x[n].float().to(DEVICE) for n in ("q", "k", "v", "g", "beta")}
    z0 = torch.rand(2, 3, 5, dtype=torch.float64) + 0.5
    S_aug = torch.cat([x["S0"], z0[..., None]], -1) if normalize else x["S0"]
    fmap_name = "elu1" if normalize else None
    fmap = resolve_feature_map(fmap_name)
    T0 = 17  # prefill 17 tokens in one call, then 4 decode steps
    pre = {n: None if t is None else t[:, :T0] for n, t in dev.items()}
    o, S = tk.linear_attention(rule=rule, **pre, state=S_aug.float().to(DEVICE), fmap=fmap, scale=None,
                               normalize=normalize, eps=1e-3, eps_mode=eps_mode)
    outs = [o]
    for t in range(T0, 21):
        qf, kf = (dev[n][:, t] if fmap is None else fmap(dev[n][:, t]) for n in ("q", "k"))
        o_t, S = tk.step(rule=rule, q=qf * 5 ** -0.5, k=kf, v=dev["v"][:, t], g=None if dev["g"] is None else
                         dev["g"][:, t], beta=None if dev["beta"] is None else dev["beta"][:, t], state=S,
                         normalize=normalize, eps=1e-3, eps_mode=eps_mode, inplace=True)
        outs.append(o_t[:, None])
    o_ref, S_ref, z_ref = reference.linear_attention(
        np64(x["q"]), np64(x["k"]), np64(x["v"]), rule=rule, feature_map=fmap_name, g=np64(x["g"]),
        beta=np64(x["beta"]), initial_S=np64(x["S0"]), initial_z=np64(z0) if normalize else None, eps=1e-3,
        eps_mode=eps_mode,
    )
    assert rel_err(torch.cat(outs, 1), o_ref) <= 1e-4
    assert rel_err(S[..., :6], S_ref) <= 1e-4 and (not normalize or rel_err(S[..., 6], z_ref) <= 1e-4)


# ------------------------------------------------------------------------------------------- the public API
@pytest.mark.parametrize("rule,kind", [("gated", "channel"), ("gated_delta", "head")], ids=["gated-channel", "gdn"])
def test_public_api_backend_triton(tk, rule, kind):
    """``backend="triton"`` through linattn.linear_attention and linattn.step: prefill, then decode in place,
    against the reference on the whole sequence (state made by the API, its record kept)."""
    import linattn

    normalize = rule == "gated"
    x = make(rule, kind, T=19, Dv=6, dtype=torch.float32)
    t32 = {n: None if x[n] is None else x[n].float().to(DEVICE) for n in ("q", "k", "v", "g", "beta")}
    fmap = "elu1" if normalize else None
    pre = {n: None if t is None else t[:, :15] for n, t in t32.items()}
    o, state = linattn.linear_attention(pre.pop("q"), pre.pop("k"), pre.pop("v"), rule=rule, feature_map=fmap,
                                        output_final_state=True, backend="triton", **pre)
    outs = [o]
    for t in range(15, 19):
        kw = {n: t32[n][:, t] for n in ("g", "beta") if t32[n] is not None}
        o_t, state = linattn.step(t32["q"][:, t], t32["k"][:, t], t32["v"][:, t], state, rule=rule, feature_map=fmap,
                                  backend="triton", inplace=True, **kw)
        outs.append(o_t[:, None])
    o_ref, S_ref, _ = reference.linear_attention(np64(x["q"]), np64(x["k"]), np64(x["v"]), rule=rule,
                                                 feature_map=fmap, g=np64(x["g"]), beta=np64(x["beta"]))
    assert rel_err(torch.cat(outs, 1), o_ref) <= 1e-4
    assert rel_err(state.S, S_ref) <= 1e-4 and state.rule == rule


def test_public_api_backend_triton_refuses_what_it_cannot_run(tk):
    """A forced "triton" names why it cannot run; "auto" never takes Triton for CPU tensors."""
    import linattn

    q = k = torch.randn(1, 9, 2, 4)
    v = torch.randn(1, 9, 4, 4)  # grouped value heads: not in the Triton kernels
    with pytest.raises(ValueError, match="backend='triton'.*value heads"):
        linattn.linear_attention(q, k, v, backend="triton")
    g = -torch.rand(1, 9, 2, 4)
    with pytest.raises(ValueError, match="backend='triton'.*one gate per head"):
        linattn.linear_attention(q, k, torch.randn(1, 9, 2, 4), rule="gated_delta", g=g, beta=torch.rand(1, 9, 2),
                                 backend="triton")
    qg = torch.randn(1, 2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="backend='triton'.*no backward"):
        linattn.step(qg, torch.randn(1, 2, 4), torch.randn(1, 2, 4), backend="triton")
