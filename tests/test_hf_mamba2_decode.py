"""The compiled Mamba-2 decode step behind the HF adapter (`linattn.kernels.cpu_ssm`, through
``mamba2_selective_state_update``) against HF's own torch function (``inspect.unwrap``) and a float64 definition:
float32 and bfloat16 inputs, one and several groups, batch > 1, odd head dims and state sizes, each optional input,
both state layouts, gates near 0 and 1, the state updated where it lies.

Tolerances: float32 against HF's float32 code and against float64, 1e-5 of the largest value (both sides round to
float32: measured up to about 1e-6). bfloat16: the output is computed in float32 from the widened inputs and
rounded once, so it is compared with HF's float32 code on the same widened inputs, cast to bfloat16: within one
bfloat16 unit in the last place of that value (2**-7 of it; where the two float32 results straddle a rounding
boundary they round apart), equal for most elements, and closer than HF's own bfloat16 path (which rounds dt, dt
B and x, and the state before the read, to bfloat16)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from hf_tiny import modeling  # noqa: E402

from linattn import backends  # noqa: E402
from linattn.backends import cpu as cpu_backend  # noqa: E402
from linattn.integrations import transformers as lt  # noqa: E402
from linattn.integrations.transformers import mamba2 as m2  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64


def hf_step():
    return inspect.unwrap(lt.original(modeling("mamba2"), "mamba2_selective_state_update"))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def step_args(seed, B=2, H=4, G=2, P=5, N=7, bias=True, D=True, z=True, dt=None, A=None, dtype=torch.float32):
    """One token's arguments as HF's layers pass them (dt, A, D, dt_bias expanded from one value per head; A in
    float32, as HF's ``-exp(A_log.float())``), and the per-head values for the reference."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, P, generator=gen).to(dtype)
    dt_h = (torch.randn(B, H, generator=gen) - 1 if dt is None else dt).to(dtype)
    A_h = -torch.rand(H, generator=gen) * 4 - 0.1 if A is None else A
    Bm, Cm = (torch.randn(B, G, N, generator=gen).to(dtype) for _ in range(2))
    D_h = torch.randn(H, generator=gen).to(dtype) if D else None
    bias_h = torch.randn(H, generator=gen).to(dtype) if bias else None
    zz = torch.randn(B, H, P, generator=gen).to(dtype) if z else None
    args = (x, dt_h[:, :, None].expand(-1, -1, P), A_h[:, None, None].expand(-1, P, N), Bm, Cm)
    kw = dict(D=None if D_h is None else D_h[:, None].expand(-1, P),
              dt_bias=None if bias_h is None else bias_h[:, None].expand(-1, P), z=zz)
    return args, kw, (x, dt_h, A_h, Bm, Cm, D_h, bias_h, zz)


def reference(S, x, dt_h, A_h, Bm, Cm, D_h, bias_h, z, softplus, limit=None):
    """One token of Mamba-2 in float64 on the state ``S [B, H, P, N]``: (y, new state)."""
    S, x, dt_h, A_h, Bm, Cm = (t.double() for t in (S, x, dt_h, A_h, Bm, Cm))
    rep = x.shape[1] // Bm.shape[1]
    d = dt_h if bias_h is None else dt_h + bias_h.double()
    if softplus:
        d = F.softplus(d)
    if limit is not None:
        d = d.clamp(*limit)
    Bh, Ch = Bm.repeat_interleave(rep, 1), Cm.repeat_interleave(rep, 1)
    S = S * torch.exp(d * A_h)[..., None, None] + (d[..., None] * x)[..., None] * Bh[:, :, None, :]
    y = (S @ Ch[..., None])[..., 0]
    if D_h is not None:
        y = y + x * D_h.double()[:, None]
    if z is not None:
        y = y * F.silu(z.double())
    return y, S


def in_layout(base, layout):
    """``base [B, H, P, N]`` in HF's own memory layout, or in linattn's (the transposed memory a patched prefill
    leaves in HF's cache)."""
    return base.clone() if layout == "hf" else base.transpose(-1, -2).contiguous().transpose(-1, -2)


OPTIONS = {"all": dict(bias=True, D=True, z=True, softplus=True),
           "no-bias-no-D": dict(bias=False, D=False, z=True, softplus=True),
           "no-z": dict(bias=True, D=True, z=False, softplus=True),
           "bare": dict(bias=False, D=False, z=False, softplus=False)}


@pytest.mark.parametrize("layout", ["hf", "linattn"])
@pytest.mark.parametrize("B, G", [(1, 1), (3, 2)])
@pytest.mark.parametrize("P, N", [(5, 7), (64, 128), (64, 64), (3, 128)])
@pytest.mark.parametrize("options", list(OPTIONS))
def test_float32_step_is_one_call_that_matches_hf_and_float64(calls, layout, B, G, P, N, options):
    opt = dict(OPTIONS[options])
    softplus = opt.pop("softplus")
    H = 4
    # without softplus, dt as HF's layers never give it raw: positive, so the decay stays below 1
    dt = None if softplus else torch.rand(B, H, generator=torch.Generator().manual_seed(2)) + 0.01
    args, kw, raw = step_args(1, B=B, H=H, G=G, P=P, N=N, dt=dt, **opt)
    base = torch.randn(B, H, P, N, generator=torch.Generator().manual_seed(3))
    state, hf_state, ref_state = in_layout(base, layout), base.clone(), base.double()
    ptr, strides = state.data_ptr(), state.stride()
    with torch.no_grad():
        assert m2.decode_plan(state, *args, **kw).kernel == "cpu"
        for t in range(3):
            version = state._version
            y = lt.mamba2_selective_state_update(state, *args, dt_softplus=softplus, **kw)
            y_hf = hf_step()(hf_state, *args, dt_softplus=softplus, **kw)
            y_ref, ref_state = reference(ref_state, *raw, softplus)
            assert len(calls) == t + 1 and calls[-1][27] == ptr  # one compiled call, on the state where it lies
            assert state._version > version  # autograd is told of the write
            assert y.dtype == torch.float32 and y.shape == (B, H, P)
            assert rel(y, y_hf) <= 1e-5 and rel(state, hf_state) <= 1e-5
            assert rel(y, y_ref) <= 1e-5 and rel(state, ref_state) <= 1e-5
    assert state.data_ptr() == ptr and state.stride() == strides and not torch.equal(state, base)


@pytest.mark.parametrize("layout", ["hf", "linattn"])
def test_gates_near_one_and_near_zero(layout):
    """dt far below 0 (softplus about 1e-13: decay 1, nothing written), far above softplus' threshold of 20 (dt
    itself, decay exp(-400) = 0: the state forgets), at the threshold, and ordinary."""
    dt = torch.tensor([[-30.0, 40.0, 20.0, -1.0], [25.0, -40.0, 19.5, 0.5]])
    A = torch.tensor([-1e-3, -10.0, -0.5, -1.0])
    args, kw, raw = step_args(4, dt=dt, A=A, bias=False)
    base = torch.randn(2, 4, 5, 7, generator=torch.Generator().manual_seed(5))
    state, hf_state = in_layout(base, layout), base.clone()
    with torch.no_grad():
        y = lt.mamba2_selective_state_update(state, *args, dt_softplus=True, **kw)
        y_hf = hf_step()(hf_state, *args, dt_softplus=True, **kw)
    y_ref, S_ref = reference(base, *raw, True)
    assert rel(y, y_ref) <= 1e-5 and rel(state, S_ref) <= 1e-5
    assert rel(y, y_hf) <= 1e-5 and rel(state, hf_state) <= 1e-5
    assert torch.equal(state[0, 0], base[0, 0])  # decay 1 and a write of 1e-13 relative: the state as it was
    forgot = S_ref[0, 1].float()  # decay 0: only the new write remains
    assert torch.allclose(state[0, 1], forgot, rtol=1e-6, atol=0)


@pytest.mark.parametrize("layout", ["hf", "linattn"])
def test_the_kernel_clamps_dt_to_its_limit(layout):
    """The kernel's clamp of dt (HF's decode step passes none; its chunk scan clamps to dt_limit)."""
    args, kw, raw = step_args(6, B=3, G=1)
    base = torch.randn(3, 4, 5, 7, generator=torch.Generator().manual_seed(7))
    state = in_layout(base, layout)
    kd = cpu_backend.kernel("cpu_ssm")
    with torch.no_grad():
        y = m2.compiled_step(kd, state, *args, kw["D"], kw["dt_bias"], kw["z"], True, dt_limit=(0.05, 0.5))
    y_ref, S_ref = reference(base, *raw, True, limit=(0.05, 0.5))
    assert rel(y, y_ref) <= 1e-5 and rel(state, S_ref) <= 1e-5
    y_free, _ = reference(base, *raw, True)
    assert rel(y_free, y_ref) > 1e-2  # the clamp mattered


@pytest.mark.parametrize("layout", ["hf", "linattn"])
@pytest.mark.parametrize("B, G, P, N", [(1, 1, 64, 128), (3, 2, 5, 7)])
@pytest.mark.parametrize("z", [False, True])
def test_bfloat16_inputs_are_widened_in_the_kernel(calls, layout, B, G, P, N, z):
    """bfloat16 inputs (A float32, as HF's layers give it), float32 state: one compiled call; y in bfloat16 within
    one unit in the last place of HF's float32 code on the widened inputs (equal for most elements), closer than
    HF's own bfloat16 path; the state as HF's float32 code leaves it."""
    args, kw, raw = step_args(8, B=B, H=4, G=G, P=P, N=N, z=z, dtype=torch.bfloat16)
    base = torch.randn(B, 4, P, N, generator=torch.Generator().manual_seed(9))
    state, hf32_state, hf16_state = in_layout(base, layout), base.clone(), base.clone()
    wide = lambda t: None if t is None else t.float()  # noqa: E731
    with torch.no_grad():
        assert m2.decode_plan(state, *args, **kw).kernel == "cpu"
        y = lt.mamba2_selective_state_update(state, *args, dt_softplus=True, **kw)
        y32 = hf_step()(hf32_state, *map(wide, args), dt_softplus=True, **{k: wide(v) for k, v in kw.items()})
        y16 = hf_step()(hf16_state, *args, dt_softplus=True, **kw)
    assert len(calls) == 1 and y.dtype == torch.bfloat16
    ref = y32.to(torch.bfloat16).float()
    err = (y.float() - ref).abs()
    assert bool((err <= ref.abs() * 2**-7).all())  # at most one bfloat16 unit in the last place
    assert float((err == 0).double().mean()) >= 0.9
    assert err.max() <= (y16.float() - ref).abs().max()
    assert rel(state, hf32_state) <= 1e-5
    y_ref, S_ref = reference(base, *raw, True)
    assert rel(y, y_ref) <= 2**-8 and rel(state, S_ref) <= 1e-5


def test_split_over_threads_equals_the_serial_step(monkeypatch):
    """Past the decode split's threshold the (sequence, head) units are split over threads: the same values, bit
    for bit (each unit is computed alone)."""
    args, kw, _ = step_args(10, B=3, H=6, G=3, P=5, N=7)
    base = torch.randn(3, 6, 5, 7, generator=torch.Generator().manual_seed(11))
    serial, split = in_layout(base, "linattn"), in_layout(base, "linattn")
    with torch.no_grad():
        y1 = lt.mamba2_selective_state_update(serial, *args, dt_softplus=True, **kw)
        monkeypatch.setattr("linattn.backends.policy.DECODE_SPLIT_MIN_ENTRIES", 0)
        monkeypatch.setattr(backends, "decode_threads", lambda entries: 2)
        y2 = lt.mamba2_selective_state_update(split, *args, dt_softplus=True, **kw)
    assert torch.equal(y1, y2) and torch.equal(serial, split)


def test_calls_the_kernel_does_not_take_keep_the_torch_path_and_say_why():
    """A float64 state, a bfloat16 state, float16 inputs, an input that records a graph, a state whose heads are
    not contiguous: each has its reason in the plan, and the step still equals HF's."""
    args, kw, _ = step_args(12, B=2, G=2)
    half_args, half_kw, _ = step_args(12, B=2, G=2, dtype=torch.float16)
    base = torch.randn(2, 4, 5, 7, generator=torch.Generator().manual_seed(13))
    cases = {
        "float64": (base.double(), args, "float32 state"),
        "bfloat16 state": (base.to(torch.bfloat16), args, "float32 state"),
        "float16": (base.clone(), half_args, "float32 and bfloat16 inputs"),
        "grad": (base.clone(), (args[0].clone().requires_grad_(), *args[1:]), "no backward"),
        "strided": (torch.randn(2, 4, 5, 14, generator=torch.Generator().manual_seed(14))[..., ::2], args,
                    "contiguous"),
    }
    for name, (state, a, why) in cases.items():
        k = half_kw if name == "float16" else kw
        plan = m2.decode_plan(state, *a, **k)
        assert plan.kernel is None and why in plan.why, (name, plan)
        hf_state = state.detach().clone()
        y = lt.mamba2_selective_state_update(state, *a, dt_softplus=True, **k)
        y_hf = hf_step()(hf_state, *a, dt_softplus=True, **k)
        tol = {"bfloat16 state": 2e-2, "float16": 2e-3}.get(name, 1e-5)
        assert rel(y, y_hf) <= tol and rel(state, hf_state) <= tol, name


def test_forced_torch_backend_runs_the_torch_path():
    args, kw, _ = step_args(15)
    state = torch.randn(2, 4, 5, 7, generator=torch.Generator().manual_seed(16))
    plan = m2.decode_plan(state, *args, **kw, backend="torch")
    assert plan.kernel is None and "torch" in plan.why
    hf_state = state.clone()
    y = lt.mamba2_selective_state_update(state, *args, **kw, dt_softplus=True, backend="torch")
    y_hf = hf_step()(hf_state, *args, **kw, dt_softplus=True)
    assert rel(y, y_hf) <= 1e-5 and rel(state, hf_state) <= 1e-5


@pytest.mark.parametrize("model_type", ["mamba2", "falcon_h1"])
def test_bfloat16_model_decodes_through_the_compiled_step(calls, model_type):
    """A tiny bfloat16 model (Falcon-H1: with the z gate) through the patch: one compiled step per Mamba layer and
    token, the cache's state float32, logits at bfloat16 rounding from the float32 model with the same (bfloat16)
    weights run by HF's own code (measured 4e-3 to 6e-3, HF's own bfloat16 path 5e-3 to 8e-3)."""
    import copy

    from hf_tiny import V, make_model

    ids = torch.randint(3, V, (2, 12), generator=torch.Generator().manual_seed(1))
    m16 = make_model(transformers, model_type, torch.float32).to(torch.bfloat16)
    m32 = copy.deepcopy(m16).float()

    def run(model):
        with torch.no_grad():
            out = model(ids[:, :6], use_cache=True)
            cache, logits = out.past_key_values, []
            calls.clear()
            for t in range(6, 12):
                out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits)
        return torch.cat(logits, dim=1), [layer.recurrent_states[0] for layer in cache.layers
                                          if getattr(layer, "recurrent_states", None)]

    with lt.use_hf_torch_fallback((model_type,)):
        ref, _ = run(m32)
    with lt.patch((model_type,)):
        ours, states = run(m16)
    assert states and len(calls) == 6 * len(states) and all(S.dtype == torch.float32 for S in states)
    assert rel(ours, ref) <= 3e-2
