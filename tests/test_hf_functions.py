"""Each function linattn's transformers integration puts in HF's place, against HF's own torch function
(``inspect.unwrap``: HF's undecorated code) and against the model's definition in float64.

HF's torch functions of the three rules compute in float32 whatever the input dtype (they call ``.float()``), so
against them the tolerance is float32 rounding; the float64 checks at 1e-10 are against the definition: the
float64 reference (:mod:`linattn.reference`) for the delta rules and a token loop of Mamba-2's recurrence (as
HF's decode step writes it) for the scan. HF's convolution keeps the input dtype: it is compared in float64."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from hf_tiny import modeling  # noqa: E402

from linattn import reference  # noqa: E402
from linattn.integrations import transformers as lt  # noqa: E402

torch.set_num_threads(1)
MAMBA, KIMI, QWEN = "mamba2", "kimi_linear", "qwen3_next"  # model types; modules imported when a test needs one

F64 = torch.float64


def hf(model_type, name):
    """HF's own (undecorated) function ``name`` of ``model_type``'s modeling file."""
    return inspect.unwrap(lt.original(modeling(model_type), name))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# ------------------------------------------------------------------------------------------------ Mamba-2
def ssm_inputs(T, gen, B=2, H=4, G=2, P=3, N=5, dtype=F64):
    x = torch.randn(B, T, H, P, generator=gen, dtype=dtype)
    dt = torch.randn(B, T, H, generator=gen, dtype=dtype)
    A = -torch.rand(H, generator=gen, dtype=dtype) * 2 - 0.1
    Bm, Cm = (torch.randn(B, T, G, N, generator=gen, dtype=dtype) for _ in range(2))
    D, dt_bias = torch.randn(H, generator=gen, dtype=dtype), torch.randn(H, generator=gen, dtype=dtype)
    S0 = torch.randn(B, H, P, N, generator=gen, dtype=dtype)
    return x, dt, A, Bm, Cm, D, dt_bias, S0


def ssm_loop(x, dt, A, Bm, Cm, D, dt_bias, S0, dt_limit=(0.0, float("inf"))):
    """Mamba-2 token by token in float64: S = exp(dt A) S + (dt x) B^T, y = S C + D x, state [B, H, P, N]."""
    B, T, H, P = x.shape
    rep = H // Bm.shape[2]
    dt = F.softplus(dt + dt_bias).clamp(*dt_limit)
    S = torch.zeros(B, H, P, Bm.shape[-1], dtype=F64) if S0 is None else S0.clone()
    ys = []
    for t in range(T):
        Bt, Ct = Bm[:, t].repeat_interleave(rep, 1), Cm[:, t].repeat_interleave(rep, 1)
        S = S * torch.exp(dt[:, t] * A)[..., None, None] + (dt[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None]
        ys.append((S @ Ct[..., None])[..., 0] + D[:, None] * x[:, t])
    return torch.stack(ys, 1), S


@pytest.mark.parametrize("T", [1, 7, 8, 9, 13, 70])
@pytest.mark.parametrize("with_state", [False, True])
def test_mamba2_chunk_scan(T, with_state):
    gen = torch.Generator().manual_seed(T + 100 * with_state)
    x, dt, A, Bm, Cm, D, dt_bias, S0 = ssm_inputs(T, gen)
    S0 = S0 if with_state else None
    limit = (0.0, float("inf")) if T % 2 else (0.05, 1.5)
    kw = dict(chunk_size=8, D=D, dt_bias=dt_bias, initial_states=S0, dt_softplus=True, dt_limit=limit,
              return_final_states=True)
    y, S = lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, **kw)
    y_ref, S_ref = ssm_loop(x, dt, A, Bm, Cm, D, dt_bias, S0, limit)
    assert y.dtype == F64 and S.shape == S_ref.shape
    assert rel(y, y_ref) <= 1e-10 and rel(S, S_ref) <= 1e-10
    y_hf, S_hf = hf(MAMBA, "mamba2_chunk_scan")(x, dt, A, Bm, Cm, **kw)  # float32 inside
    assert rel(y, y_hf) <= 1e-5 and rel(S, S_hf) <= 1e-5
    y32, S32 = lt.mamba2_chunk_scan(*(t.float() for t in (x, dt, A, Bm, Cm)), chunk_size=8, D=D.float(),
                                    dt_bias=dt_bias.float(), initial_states=None if S0 is None else S0.float(),
                                    dt_softplus=True, dt_limit=limit, return_final_states=True)
    assert y32.dtype == torch.float32 and rel(y32, y_ref) <= 1e-5 and rel(S32, S_ref) <= 1e-5


@pytest.mark.parametrize("skip", ["head", "head_dim", None])
@pytest.mark.parametrize("with_state", [True, False])
def test_mamba2_chunk_scan_long_float32_runs_the_grouped_chunk_form(monkeypatch, skip, with_state):
    """Long enough, with enough heads per group, a float32 prefill runs the grouped chunk form (matmuls) on CPU,
    with dt and D handed to it (no dt x buffer, no pass of its own for D x); D per head, per head and channel, or
    none."""
    from linattn.backends import cpu as cpu_backend
    from linattn.backends import policy

    T = policy.GROUPED_CHUNK_MIN_TOKENS + 45
    gen = torch.Generator().manual_seed(11)
    inputs = list(ssm_inputs(T, gen, H=2 * policy.GROUPED_CHUNK_MIN_GROUP, G=2, P=5, N=7))
    H, P = inputs[0].shape[2:]
    D_full = {"head": inputs[5][:, None].expand(H, P), "head_dim": torch.randn(H, P, generator=gen, dtype=F64),
              None: torch.zeros(H, P, dtype=F64)}[skip]
    if not with_state:
        inputs[7] = None
    x, dt, A, Bm, Cm, D, dt_bias, S0 = (None if t is None else t.float() for t in inputs)
    D = {"head": D, "head_dim": D_full.float(), None: None}[skip]
    ran = []
    real = cpu_backend.grouped_prefill
    monkeypatch.setattr(cpu_backend, "grouped_prefill", lambda *a, **kw: ran.append(kw) or real(*a, **kw))
    y, S = lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, initial_states=S0, dt_softplus=True,
                                return_final_states=True)
    assert len(ran) == 1 and ran[0]["skip"] is D and ran[0]["v_scale"] is not None and y.dtype == torch.float32
    inputs[5] = torch.zeros(H, dtype=F64)
    y_ref, S_ref = ssm_loop(*inputs)
    y_ref = y_ref + D_full * inputs[0]
    assert rel(y, y_ref) <= 1e-5 and rel(S, S_ref) <= 1e-5


def test_mamba2_chunk_scan_gradients_match_the_loop():
    gen = torch.Generator().manual_seed(3)
    inputs = [t.requires_grad_() for t in ssm_inputs(11, gen)]
    w = torch.randn(2, 11, 4, 3, generator=gen, dtype=F64)
    y, S = lt.mamba2_chunk_scan(*inputs[:5], chunk_size=8, D=inputs[5], dt_bias=inputs[6], initial_states=inputs[7],
                                dt_softplus=True, return_final_states=True)
    grads = torch.autograd.grad((y * w).sum() + S.sum(), inputs)
    y_ref, S_ref = ssm_loop(*inputs)
    ref = torch.autograd.grad((y_ref * w).sum() + S_ref.sum(), inputs)
    for got, want in zip(grads, ref, strict=True):
        assert rel(got, want) <= 1e-10


@pytest.mark.parametrize("grad_on", [None, "D", "hidden_states"])
def test_mamba2_chunk_scan_leaves_its_inputs_and_grads_only_what_asked(grad_on):
    """Outside autograd the skip term is added into linattn's own output and dt x goes to a fresh buffer: the
    inputs keep their values, and one input requiring grad (the skip weight D alone, or x) still gets the
    loop's gradient, with the same output either way (float32 on the compiled kernel)."""
    gen = torch.Generator().manual_seed(17)
    x, dt, A, Bm, Cm, D, dt_bias, _ = (t.float() for t in ssm_inputs(13, gen))
    kept = [t.clone() for t in (x, dt, A, Bm, Cm, D, dt_bias)]
    named = {"D": D, "hidden_states": x}
    if grad_on:
        named[grad_on].requires_grad_()
    y = lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, chunk_size=8, D=D, dt_bias=dt_bias, dt_softplus=True)
    for now, before in zip((x, dt, A, Bm, Cm, D, dt_bias), kept, strict=True):
        assert torch.equal(now, before)
    y_ref, _ = ssm_loop(*(t.detach().double() for t in (x, dt, A, Bm, Cm, D, dt_bias)), None)
    assert rel(y, y_ref) <= 1e-5
    if grad_on:
        (got,) = torch.autograd.grad(y.double().pow(2).sum(), named[grad_on])
        leaf = named[grad_on].detach().double().requires_grad_()
        args = [t.detach().double() for t in (x, dt, A, Bm, Cm, D, dt_bias)]
        args[0 if grad_on == "hidden_states" else 5] = leaf
        (want,) = torch.autograd.grad(ssm_loop(*args, None)[0].pow(2).sum(), leaf)
        assert rel(got, want) <= 1e-4


@pytest.mark.parametrize("packing", ["seq_idx", "cu_seqlens", "cu_seq_lens_q"])
def test_mamba2_chunk_scan_packed_equals_each_sequence_alone(packing):
    gen = torch.Generator().manual_seed(4)
    lengths = [5, 1, 9, 3]
    T = sum(lengths)
    x, dt, A, Bm, Cm, D, dt_bias, _ = ssm_inputs(T, gen, B=1)
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    S0 = torch.randn(len(lengths), 4, 3, 5, generator=gen, dtype=F64)
    packed = {"seq_idx": torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None].int(),
              "cu_seqlens": cu, "cu_seq_lens_q": cu}[packing]
    y, S = lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, chunk_size=8, D=D, dt_bias=dt_bias, initial_states=S0,
                                dt_softplus=True, return_final_states=True, **{packing: packed})
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        y_i, S_i = ssm_loop(x[:, a:b], dt[:, a:b], A, Bm[:, a:b], Cm[:, a:b], D, dt_bias, S0[i:i + 1])
        assert rel(y[:, a:b], y_i) <= 1e-10 and rel(S[i:i + 1], S_i) <= 1e-10


def decode_args(gen, B=2, H=4, G=2, P=3, N=5, dtype=F64):
    """The arguments of HF's decode step as HF's layers pass them: per-head values expanded over P (and N)."""
    x = torch.randn(B, H, P, generator=gen, dtype=dtype)
    dt = torch.randn(B, H, 1, generator=gen, dtype=dtype).expand(-1, -1, P)
    A = (-torch.rand(H, generator=gen, dtype=torch.float32) - 0.1)[:, None, None].expand(-1, P, N)
    Bm, Cm = (torch.randn(B, G, N, generator=gen, dtype=dtype) for _ in range(2))
    D = torch.randn(H, generator=gen, dtype=dtype)[:, None].expand(-1, P)
    dt_bias = torch.randn(H, generator=gen, dtype=dtype)[:, None].expand(-1, P)
    z = torch.randn(B, H, P, generator=gen, dtype=dtype)
    return x, dt, A, Bm, Cm, D, dt_bias, z


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("layout", ["hf", "linattn"])
def test_mamba2_decode_step_updates_the_state_in_place(dtype, layout):
    """The state is updated where it lies, in HF's own layout or in linattn's (the transposed memory a patched
    prefill leaves in HF's cache); output and state equal HF's step and the token loop."""
    gen = torch.Generator().manual_seed(5)
    x, dt, A, Bm, Cm, D, dt_bias, z = decode_args(gen, dtype=dtype)
    base = torch.randn(2, 4, 3, 5, generator=gen, dtype=dtype)
    state = base.clone() if layout == "hf" else base.transpose(-1, -2).contiguous().transpose(-1, -2)
    ptr, stride = state.data_ptr(), state.stride()
    hf_state = base.clone()
    kw = dict(D=D, dt_bias=dt_bias, dt_softplus=True, z=z)
    with torch.no_grad():
        for _ in range(3):
            y = lt.mamba2_selective_state_update(state, x, dt, A, Bm, Cm, **kw)
            y_hf = hf(MAMBA, "mamba2_selective_state_update")(hf_state, x, dt, A, Bm, Cm, **kw)
    assert state.data_ptr() == ptr and state.stride() == stride
    tol = 1e-5 if dtype == torch.float32 else 1e-6  # HF's decay exp(dt A) is float32 even for float64 inputs
    assert y.dtype == dtype and rel(y, y_hf) <= tol and rel(state, hf_state) <= tol
    if dtype == F64:  # three tokens of the definition
        loop_state = base.clone()
        for _ in range(3):
            y_ref, loop_state = ssm_loop(x[:, None], dt[:, None, :, 0], A[:, 0, 0].double(), Bm[:, None],
                                         Cm[:, None], D[:, 0], dt_bias[:, 0], loop_state)
        assert rel(y, y_ref[:, 0] * F.silu(z)) <= 1e-12 and rel(state, loop_state) <= 1e-12


def test_mamba2_decode_step_under_autograd_writes_like_hf():
    gen = torch.Generator().manual_seed(6)
    x, dt, A, Bm, Cm, D, dt_bias, _ = decode_args(gen)
    x.requires_grad_()
    state = torch.randn(2, 4, 3, 5, generator=gen, dtype=F64)
    hf_state = state.clone()
    y = lt.mamba2_selective_state_update(state, x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, dt_softplus=True)
    y_hf = hf(MAMBA, "mamba2_selective_state_update")(hf_state, x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias,
                                                       dt_softplus=True)
    assert rel(y, y_hf) <= 1e-6 and rel(state, hf_state) <= 1e-6
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gx_hf,) = torch.autograd.grad(y_hf.sum(), x)
    assert rel(gx, gx_hf) <= 1e-6


def test_mamba2_decode_step_with_per_channel_values_takes_hf_code():
    """dt varying along the head dim has no gated-rule equivalent: HF's own torch step runs it."""
    gen = torch.Generator().manual_seed(7)
    x, dt, A, Bm, Cm, D, dt_bias, _ = decode_args(gen)
    dt = dt + torch.randn(dt.shape, generator=gen, dtype=F64)
    fb = lt.original(modeling(MAMBA), "mamba2_selective_state_update")
    s1, s2 = (torch.randn(2, 4, 3, 5, generator=gen, dtype=F64),) * 2
    s1, s2 = s1.clone(), s2.clone()
    y = lt.mamba2_selective_state_update(s1, x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, dt_softplus=True, fallback=fb)
    y_hf = hf(MAMBA, "mamba2_selective_state_update")(s2, x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, dt_softplus=True)
    assert torch.equal(y, y_hf) and torch.equal(s1, s2)
    with pytest.raises(ValueError, match="^dt: .*head dim"):
        lt.mamba2_selective_state_update(s1, x, dt, A, Bm, Cm, D=D, dt_bias=dt_bias, dt_softplus=True)


def _recording_hf_step(seen):
    """HF's own decode step (undecorated), recording each call: proof of which code ran."""
    theirs = hf(MAMBA, "mamba2_selective_state_update")

    def spy(*args, **kw):
        seen.append(args)
        return theirs(*args, **kw)

    return spy


def _per_head_args(gen, dtype, dt_form, A_form, bias_form, D_form, with_z, B=2, H=4, G=2, P=4, N=5):
    """A decode token's arguments with each per-head tensor in a given form: "expanded" (HF's stride-0 views),
    "dense" (the same values, materialized: proven by value), "varying" (values differ along the expanded dims),
    "head" (D or dt_bias as [H]), or None."""
    def form(values, shape, how):
        if how is None:
            return None
        if how == "head":
            return values
        view = values.reshape(values.shape + (1,) * (len(shape) - values.dim())).expand(shape)
        if how == "expanded":
            return view
        dense = view.contiguous()
        if how == "varying":
            dense = dense + torch.randn(dense.shape, generator=gen, dtype=dense.dtype)
        return dense

    x = torch.randn(B, H, P, generator=gen, dtype=dtype)
    dt = form(torch.randn(B, H, generator=gen, dtype=dtype), (B, H, P), dt_form)
    A = form(-torch.rand(H, generator=gen) - 0.1, (H, P, N), A_form)  # HF's A is float32 (A_log.float())
    Bm, Cm = (torch.randn(B, G, N, generator=gen, dtype=dtype) for _ in range(2))
    dt_bias = form(torch.randn(H, generator=gen, dtype=dtype), (H, P), bias_form)
    D = form(torch.randn(H, generator=gen, dtype=dtype), (H, P), D_form)
    z = torch.randn(B, H, P, generator=gen, dtype=dtype) if with_z else None
    return (x, dt, A, Bm, Cm), dict(D=D, dt_bias=dt_bias, dt_softplus=True, z=z)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("with_z", [False, True])
@pytest.mark.parametrize("forms", [("expanded", "expanded", "expanded", "expanded"),
                                   ("dense", "dense", "dense", "varying"),
                                   ("expanded", "expanded", None, "head"),
                                   ("dense", "expanded", "expanded", None)],
                         ids=["hf", "dense", "D-head", "no-D"])
def test_mamba2_decode_step_runs_linattn_for_one_value_per_head(dtype, with_z, forms):
    """dt, A, dt_bias with one value per head (HF's expanded views, proven by strides; or materialized, proven by
    value) run on linattn, not HF's code; D of any shape HF's code takes ([H, P] expanded or varying, or [H],
    which HF's code broadcasts over P) and z None or given give HF's step; the state is updated where it lies."""
    gen = torch.Generator().manual_seed(31)
    args, kw = _per_head_args(gen, dtype, *forms, with_z)
    base = torch.randn(2, 4, 4, 5, generator=gen, dtype=dtype)
    state, hf_state = base.transpose(-1, -2).contiguous().transpose(-1, -2), base.clone()
    seen = []
    with torch.no_grad():
        for _ in range(2):
            y = lt.mamba2_selective_state_update(state, *args, **kw, fallback=_recording_hf_step(seen))
            y_hf = hf(MAMBA, "mamba2_selective_state_update")(hf_state, *args, **kw)
    assert not seen  # linattn ran
    tol = 2e-5 if dtype == torch.float32 else 1e-6  # HF's decay exp(dt A) is float32 even for float64 inputs
    assert y.dtype == dtype and rel(y, y_hf) <= tol and rel(state, hf_state) <= tol


@pytest.mark.parametrize("name", ["dt", "A", "dt_bias", "dt_bias [H]"])
def test_mamba2_decode_step_with_values_varying_along_the_head_dim_takes_hf_code(name):
    """A per-head tensor whose values vary along the dims HF expands (or dt_bias as [H], which HF's code adds
    along P) has no gated-rule equivalent: HF's own code runs it, bit for bit; without HF's function to go to, a
    ValueError names it and nothing is written."""
    gen = torch.Generator().manual_seed(32)
    forms = {"dt": ("varying", "expanded", "expanded"), "A": ("expanded", "varying", "expanded"),
             "dt_bias": ("expanded", "expanded", "varying"), "dt_bias [H]": ("expanded", "expanded", "head")}[name]
    args, kw = _per_head_args(gen, torch.float32, *forms, "expanded", True)
    s0 = torch.randn(2, 4, 4, 5, generator=gen)
    s1, s2, s3 = s0.clone(), s0.clone(), s0.clone()
    seen = []
    y = lt.mamba2_selective_state_update(s1, *args, **kw, fallback=_recording_hf_step(seen))
    y_hf = hf(MAMBA, "mamba2_selective_state_update")(s2, *args, **kw)
    assert len(seen) == 1 and torch.equal(y, y_hf) and torch.equal(s1, s2)
    with pytest.raises(ValueError, match=f"^{name.split()[0]}: "):
        lt.mamba2_selective_state_update(s3, *args, **kw)
    assert torch.equal(s3, s0) and not torch.equal(s1, s0)


def test_mamba2_decode_step_names_a_D_that_does_not_broadcast():
    gen = torch.Generator().manual_seed(33)
    args, kw = _per_head_args(gen, torch.float32, "expanded", "expanded", "expanded", None, False)
    with pytest.raises(ValueError, match=r"^D: expected \[H, P\] = \(4, 4\)"):
        lt.mamba2_selective_state_update(torch.zeros(2, 4, 4, 5), *args, **{**kw, "D": torch.ones(3)})


@pytest.mark.parametrize("with_z", [False, True])
def test_mamba2_decode_step_is_one_kernel_call_on_hf_memory(calls, with_z):
    """At batch 1 in float32 with HF's expanded arguments, the step is one call of the compiled kernel on the
    state where it lies (the layout a patched prefill leaves in HF's cache)."""
    gen = torch.Generator().manual_seed(34)
    args, kw = _per_head_args(gen, torch.float32, "expanded", "expanded", "expanded", "expanded", with_z, B=1)
    base = torch.randn(1, 4, 4, 5, generator=gen)
    state, hf_state = base.transpose(-1, -2).contiguous().transpose(-1, -2), base.clone()
    with torch.no_grad():
        for t in range(3):
            y = lt.mamba2_selective_state_update(state, *args, **kw)
            y_hf = hf(MAMBA, "mamba2_selective_state_update")(hf_state, *args, **kw)
            assert len(calls) == t + 1 and calls[-1][27] == state.data_ptr()  # cpu_ssm.step's state
    assert rel(y, y_hf) <= 2e-5 and rel(state, hf_state) <= 2e-5


@pytest.mark.parametrize("move", ["set_", "grad"])
def test_mamba2_decode_step_follows_the_state_tensor_between_steps(move):
    """The decoder kept per state tensor is reused only while the tensor lies where it was found: re-pointed by
    ``set_`` (in HF's own layout now), the step updates the new memory and leaves the old one; a step that records
    a graph takes the functional path; each equals HF."""
    gen = torch.Generator().manual_seed(35)
    args, kw = _per_head_args(gen, torch.float32, "expanded", "expanded", "expanded", "expanded", True, B=1)
    base = torch.randn(1, 4, 4, 5, generator=gen)
    hf_state = base.clone()
    state = base.transpose(-1, -2).contiguous().transpose(-1, -2)
    with torch.no_grad():
        lt.mamba2_selective_state_update(state, *args, **kw)
        hf(MAMBA, "mamba2_selective_state_update")(hf_state, *args, **kw)
    old, old_memory = state.clone(), state.view_as(state)  # (a view keeps the memory set_ leaves)
    if move == "set_":
        moved = torch.randn(1, 4, 4, 5, generator=gen)
        hf_state.copy_(moved)
        state.set_(moved.clone())
    x = args[0].clone().requires_grad_(move == "grad")
    with torch.enable_grad() if move == "grad" else torch.no_grad():
        y = lt.mamba2_selective_state_update(state, x, *args[1:], **kw)
        y_hf = hf(MAMBA, "mamba2_selective_state_update")(hf_state.clone() if move == "grad" else hf_state, x,
                                                          *args[1:], **kw)
    if move == "grad":
        hf(MAMBA, "mamba2_selective_state_update")(hf_state, x.detach(), *args[1:], **kw)
    assert rel(y, y_hf) <= 2e-5 and rel(state, hf_state) <= 2e-5
    if move == "set_":
        assert torch.equal(old_memory, old)


def test_off_cpu_calls_go_to_hf_choice_unless_a_backend_is_forced():
    seen = []

    def spy(*args, **kwargs):
        seen.append(args[0].device.type)
        return "hf"

    x = torch.empty(1, 3, 4, 2, device="meta")
    assert lt.mamba2_chunk_scan(x, x[..., 0], x[0, 0, :, 0], x, x, 8, fallback=spy) == "hf"
    assert lt.causal_conv1d_fn(x[0], x[0, 0], fallback=spy) == "hf"
    assert lt.chunk_kimi_delta_attention(x, x, x, x, x[..., 0], fallback=spy) == "hf"
    assert lt.mamba2_split_conv1d_scan_combined(x, x, None, x, x, x, 8, fallback=spy) == "hf"
    assert seen == ["meta"] * 4
    cpu = torch.zeros(1, 3, 4, 2)
    assert lt.mamba2_split_conv1d_scan_combined(cpu, cpu, None, cpu, cpu, cpu, 8, fallback=spy) is None


# ------------------------------------------------------------------------------------------------ delta rules
def delta_inputs(T, gen, per_channel, B=2, H=2, HV=4, K=8, Dv=6, dtype=F64):
    q, k = (torch.randn(B, T, H, K, generator=gen, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, HV, Dv, generator=gen, dtype=dtype)
    g = -torch.rand(B, T, HV, *((K,) if per_channel else ()), generator=gen, dtype=dtype) * 0.5
    beta = torch.rand(B, T, HV, generator=gen, dtype=dtype)
    S0 = torch.randn(B, HV, K, Dv, generator=gen, dtype=dtype)
    return q, k, v, g, beta, S0


def delta_ref(q, k, v, g, beta, S0):
    o, S, _ = reference.linear_attention(q.numpy(), k.numpy(), v.numpy(), rule="gated_delta", feature_map="l2",
                                         g=g.numpy(), beta=beta.numpy(),
                                         initial_S=None if S0 is None else S0.numpy())
    return torch.from_numpy(np.asarray(o)), torch.from_numpy(np.asarray(S))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B", [1, 2])
def test_gated_delta_prefill_on_split_views(dtype, B):
    """q, k, v as HF's Gated DeltaNet layer passes them (views split from one projection: strided rows), copied
    together into one buffer for the compiled loop: the float64 reference's values, the projection untouched."""
    gen = torch.Generator().manual_seed(23 + B)
    T, H, HV, K, Dv = 37, 2, 4, 8, 6
    proj = torch.randn(B, T, 2 * H * K + HV * Dv + 3, generator=gen).to(dtype)
    kept = proj.clone()
    q, k, v = (t.reshape(B, T, -1, d) for t, d in zip(proj[..., 3:].split([H * K, H * K, HV * Dv], -1), (K, K, Dv),
                                                       strict=True))
    g = -torch.rand(B, T, HV, generator=gen) * 0.5
    beta = torch.rand(B, T, HV, generator=gen)
    o, S = lt.chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, S_ref = delta_ref(*(t.double() for t in (q, k, v, g, beta)), None)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert o.dtype == dtype and rel(o, o_ref) <= tol and rel(S, S_ref) <= 1e-5
    assert torch.equal(proj, kept)


@pytest.mark.parametrize("family", ["kda", "gated_delta"])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 13])
@pytest.mark.parametrize("with_state", [False, True])
def test_delta_rule_prefill(family, T, with_state):
    """Chunk (prefill) functions: float64 against the reference at 1e-10, float32 against HF's torch code."""
    gen = torch.Generator().manual_seed(T + 7 * with_state)
    q, k, v, g, beta, S0 = delta_inputs(T, gen, per_channel=family == "kda", HV=2 if family == "kda" else 4)
    S0 = S0 if with_state else None
    ours, module, name = ((lt.chunk_kimi_delta_attention, KIMI, "chunk_kimi_delta_attention") if family == "kda"
                          else (lt.chunk_gated_delta_rule, QWEN, "torch_chunk_gated_delta_rule"))
    kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, S = ours(q, k, v, g, beta, **kw)
    o_ref, S_ref = delta_ref(q, k, v, g, beta, S0)
    assert rel(o, o_ref) <= 1e-10 and rel(S, S_ref) <= 1e-10
    f32 = [t.float() for t in (q, k, v, g, beta)]
    kw32 = dict(kw, initial_state=None if S0 is None else S0.float())
    o32, S32 = ours(*f32, **kw32)
    o_hf, S_hf = hf(module, name)(*f32, **kw32)
    assert rel(o32, o_hf) <= 2e-5 and rel(S32, S_hf) <= 2e-5


@pytest.mark.parametrize("family", ["kda", "gated_delta"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_delta_rule_decode_steps_in_place(family, dtype):
    gen = torch.Generator().manual_seed(8)
    q, k, v, g, beta, S0 = delta_inputs(4, gen, per_channel=family == "kda", HV=2 if family == "kda" else 4,
                                        dtype=dtype)
    ours, module, name = ((lt.recurrent_kimi_delta_attention, KIMI, "recurrent_kimi_delta_attention")
                          if family == "kda" else
                          (lt.recurrent_gated_delta_rule, QWEN, "torch_recurrent_gated_delta_rule"))
    S, S_hf = S0.clone(), S0.clone()
    ptr = S.data_ptr()
    with torch.no_grad():
        for t in range(4):
            step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
            o, S_out = ours(*step, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
            o_hf, S_hf = hf(module, name)(*step, initial_state=S_hf, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
            assert S_out is S and S.data_ptr() == ptr
            assert rel(o, o_hf) <= 1e-5
    assert rel(S, S_hf) <= 1e-5
    o_ref, S_ref = delta_ref(*(x.double() for x in (q, k, v, g, beta, S0)))
    assert rel(S, S_ref) <= (1e-10 if dtype == F64 else 1e-5)
    with pytest.raises(ValueError, match="g"):  # a bad gate: the general path names it, nothing written
        before = S.clone()
        ours(*[x[:, :1] for x in (q, k, v, g.abs() + 1, beta)], initial_state=S, output_final_state=True,
             use_qk_l2norm_in_kernel=True)
    assert torch.equal(S, before)


@pytest.mark.parametrize("family", ["kda", "gated_delta"])
def test_delta_rule_decode_step_is_one_kernel_call_on_hf_memory(calls, family):
    """At batch 1 in float32 (HF's decode step) the step is one call of the compiled kernel that reads HF's own
    token tensors and updates HF's state where it lies: no copy of the state or of an input, per step."""
    kda = family == "kda"
    gen = torch.Generator().manual_seed(9)
    q, k, v, g, beta, S0 = (x.float() for x in delta_inputs(3, gen, per_channel=kda, B=1, H=2, HV=2 if kda else 4,
                                                            K=16, Dv=9))
    ours = lt.recurrent_kimi_delta_attention if kda else lt.recurrent_gated_delta_rule
    S = S0.clone()
    with torch.no_grad():
        for t in range(3):
            step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
            o, S_out = ours(*step, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
            assert S_out is S
            assert calls[-1][:8] == (*(x.data_ptr() for x in step), S.data_ptr(), S.data_ptr(), calls[-1][7])
    assert len(calls) == 3 and calls[-1][13] == (16 if kda else 1)  # the gate width the kernel read
    o_ref, S_ref = delta_ref(*(x.double() for x in (q, k, v, g, beta, S0)))
    assert rel(o[:, 0], o_ref[:, 2]) <= 1e-5 and rel(S, S_ref) <= 1e-5


def test_kda_packed_equals_each_sequence_alone():
    gen = torch.Generator().manual_seed(9)
    lengths = [3, 0, 70, 1]
    q, k, v, g, beta, _ = delta_inputs(sum(lengths), gen, per_channel=True, B=1, HV=2)
    S0 = torch.randn(len(lengths), 2, 8, 6, generator=gen, dtype=F64)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    o, S = lt.chunk_kimi_delta_attention(q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True, cu_seq_lens_q=cu)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        if a == b:
            assert torch.equal(S[i], S0[i])
            continue
        o_i, S_i = delta_ref(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], S0[i:i + 1])
        assert rel(o[:, a:b], o_i) <= 1e-10 and rel(S[i:i + 1], S_i) <= 1e-10


# ------------------------------------------------------------------------------------------------ convolution
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("with_bias", [False, True])
def test_convolution_prefill_and_update(dtype, activation, with_bias):
    """Prefill and one-token updates against HF's torch code (which keeps the dtype), the window in place."""
    gen = torch.Generator().manual_seed(10)
    C, K, L = 6, 4, 9
    x = torch.randn(2, L + 3, C, generator=gen, dtype=dtype).transpose(1, 2)  # HF passes a transposed view
    w = torch.randn(C, K, generator=gen, dtype=dtype)
    b = torch.randn(C, generator=gen, dtype=dtype) if with_bias else None
    tol = 1e-12 if dtype == F64 else 1e-5
    y = lt.causal_conv1d_fn(x[..., :L], w, b, activation=activation)
    assert y.shape == (2, C, L) and rel(y, hf(MAMBA, "causal_conv1d_fn")(x[..., :L], w, b, activation)) <= tol
    window = x[..., L - K:L].contiguous()
    hf_window = window.clone()
    ptr = window.data_ptr()
    with torch.no_grad():
        for t in range(L, L + 3):
            y_t = lt.causal_conv1d_update(x[..., t:t + 1], window, w, b, activation)
            y_hf = hf(MAMBA, "causal_conv1d_update")(x[..., t:t + 1], hf_window, w, b, activation)
            assert y_t.shape == (2, C, 1) and rel(y_t, y_hf) <= tol
    assert window.data_ptr() == ptr and torch.equal(window, hf_window)
    full = hf(MAMBA, "causal_conv1d_fn")(x, w, b, activation)
    assert rel(y_t[..., 0], full[..., -1]) <= tol


@pytest.mark.parametrize("L", [1, 2, 3, 5, 130])
@pytest.mark.parametrize("C", [1, 7])
@pytest.mark.parametrize("layout", ["view", "contiguous"])
def test_convolution_prefill_short_and_odd(L, C, layout):
    """Prefill shorter than the kernel, odd channel counts, HF's transposed view (read in place) and a contiguous
    [B, C, L] tensor (as HF's cache hands back after padding or concatenating) against HF's code in float64."""
    gen = torch.Generator().manual_seed(L * 10 + C)
    K = 4
    x = torch.randn(3, L, C, generator=gen).transpose(1, 2)
    if layout == "contiguous":
        x = x.contiguous()
    w, b = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    for activation in ("silu", None):
        y = lt.causal_conv1d_fn(x, w, b, activation=activation)
        ref = hf(MAMBA, "causal_conv1d_fn")(x.double(), w.double(), b.double(), activation)
        assert y.shape == (3, C, L) and y.dtype == torch.float32 and rel(y, ref) <= 1e-6


@pytest.mark.parametrize("packing", ["seq_idx", "cu_seq_lens_q"])
def test_convolution_packed_equals_each_sequence_alone_and_grads(packing):
    gen = torch.Generator().manual_seed(11)
    lengths = [2, 7, 1, 5]
    C, K, L = 5, 4, sum(lengths)
    x = torch.randn(1, C, L, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(C, K, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(C, generator=gen, dtype=F64, requires_grad=True)
    cu = torch.tensor([0, *lengths]).cumsum(0)
    packed = cu if packing != "seq_idx" else torch.repeat_interleave(torch.arange(4), torch.tensor(lengths))[None]
    y = lt.causal_conv1d_fn(x, w, b, "silu", **{packing: packed})
    loss = (y * torch.arange(L, dtype=F64)).sum()
    grads = torch.autograd.grad(loss, (x, w, b))
    parts = [hf(MAMBA, "causal_conv1d_fn")(x[..., a:e], w, b, "silu") for a, e in zip(cu[:-1], cu[1:], strict=True)]
    ref = torch.cat(parts, -1)
    ref_grads = torch.autograd.grad((ref * torch.arange(L, dtype=F64)).sum(), (x, w, b))
    assert rel(y, ref) <= 1e-12
    for got, want in zip(grads, ref_grads, strict=True):
        assert rel(got, want) <= 1e-12
    y32 = lt.causal_conv1d_fn(x.float(), w.float(), b.float(), "silu", **{packing: packed})  # the compiled pass
    assert rel(y32, ref) <= 1e-5


# ------------------------------------------------------------------------------------------------ every model type
# Every model type's own modeling file, every function the patch replaces there (the fused Mamba-2 split-conv-scan,
# which HF's torch code and linattn both decline on a CPU, has its own test above).
OWN = [(model, name) for _, (models, functions) in lt.FAMILIES.items() for model in models for name in functions
       if name != "mamba2_split_conv1d_scan_combined"]


def _own_case(name, gen):
    """(positional args, keyword args, the index of the argument both update in place or None) for ``name``,
    float32 as HF's layers call it."""
    if name in ("torch_chunk_gated_delta_rule", "chunk_kimi_delta_attention",
                "torch_recurrent_gated_delta_rule", "recurrent_kimi_delta_attention"):
        kda = "kimi" in name
        T = 13 if "chunk" in name else 1
        q, k, v, g, beta, S0 = (x.float() for x in delta_inputs(T, gen, per_channel=kda, HV=2 if kda else 4))
        kw = dict(initial_state=S0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return (q, k, v, g, beta), kw, None  # (HF returns its new state; the final states are compared)
    if name == "mamba2_chunk_scan":
        x, dt, A, Bm, Cm, D, dt_bias, S0 = (t.float() for t in ssm_inputs(9, gen))
        kw = dict(chunk_size=8, D=D, dt_bias=dt_bias, initial_states=S0, dt_softplus=True,
                  dt_limit=(0.0, float("inf")), return_final_states=True)
        return (x, dt, A, Bm, Cm), kw, None
    if name == "mamba2_selective_state_update":
        x, dt, A, Bm, Cm, D, dt_bias, z = decode_args(gen, dtype=torch.float32)
        state = torch.randn(2, 4, 3, 5, generator=gen)
        return (state, x, dt, A, Bm, Cm), dict(D=D, dt_bias=dt_bias, dt_softplus=True, z=z), 0
    C, K = 6, 4
    w, b = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    if name == "causal_conv1d_fn":
        return (torch.randn(2, C, 9, generator=gen), w, b), dict(activation="silu"), None
    assert name == "causal_conv1d_update", name
    window = torch.randn(2, C, K, generator=gen)
    return (torch.randn(2, C, 1, generator=gen), window, w, b, "silu"), {}, 1


def _copies(args, kw):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args], {
        n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in kw.items()}


def _flat(out):
    return [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("model_type,name", OWN, ids=[f"{m}-{n}" for m, n in OWN])
def test_every_model_types_own_function_against_its_hf_torch_code(model_type, name):
    """linattn's replacement against the undecorated HF torch function of that model type's own file, on the same
    float32 inputs: outputs, final states and any state updated in place agree to float32 rounding."""
    ours = lt.FAMILIES[lt.FAMILY_OF[model_type]][1][name][1]
    theirs = hf(model_type, name)
    args, kw, in_place = _own_case(name, torch.Generator().manual_seed(12))
    (a1, k1), (a2, k2) = _copies(args, kw), _copies(args, kw)
    with torch.no_grad():
        got, want = ours(*a1, **k1), theirs(*a2, **k2)
    pairs = list(zip(_flat(got), _flat(want), strict=True))
    if in_place is not None:  # the state both update where it lies
        pairs.append((a1[in_place], a2[in_place]))
    assert pairs
    for a, b in pairs:
        assert a.shape == b.shape and rel(a, b) <= 2e-5, (model_type, name)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One bfloat16 ulp at each |x| (8 significant bits): 2^(floor(log2 |x|) - 7), the smallest normal's below."""
    a = x.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


@pytest.mark.parametrize("family", ["kda", "gated_delta"])
@pytest.mark.parametrize("g_dtype", [torch.float32, torch.bfloat16])
def test_delta_rule_decode_in_bf16_is_one_kernel_call_and_agrees_with_hf(calls, family, g_dtype):
    """A bfloat16 checkpoint's decode step (q, k, v, beta in bfloat16; g as HF computes it, float32, or bfloat16;
    the cache's state float32): one kernel call on HF's own tensors, the output in bfloat16 as HF returns it.
    Both compute in float32 and round once to bfloat16, in another summation order: outputs agree to one bfloat16
    ulp (the two float32 results may straddle a rounding boundary), states to float32 rounding."""
    kda = family == "kda"
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta, S0 = delta_inputs(4, gen, per_channel=kda, B=2, H=3, HV=3 if kda else 6, K=13, Dv=9,
                                        dtype=torch.float32)
    q, k, v, beta = (x.to(torch.bfloat16) for x in (q, k, v, beta))
    g = g.to(g_dtype)
    ours, module, name = ((lt.recurrent_kimi_delta_attention, KIMI, "recurrent_kimi_delta_attention") if kda else
                          (lt.recurrent_gated_delta_rule, QWEN, "torch_recurrent_gated_delta_rule"))
    S, S_hf = S0.clone(), S0.clone()
    with torch.no_grad():
        for t in range(4):
            step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
            o, S_out = ours(*step, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
            o_hf, S_hf = hf(module, name)(*step, initial_state=S_hf, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
            assert S_out is S and o.dtype == o_hf.dtype == torch.bfloat16 and S_hf.dtype == torch.float32
            assert ((o.double() - o_hf.double()).abs() <= bf16_ulp(o_hf)).all()
            assert rel(S, S_hf) <= 1e-5
    assert len(calls) == 4 and calls[-1][18] == 1 | 2 | 4 | 16 | (8 if g_dtype == torch.bfloat16 else 0)
    o_ref, S_ref = delta_ref(*(x.double() for x in (q, k, v, g, beta, S0)))
    assert rel(S, S_ref) <= 1e-5
    assert rel(o[:, 0], o_ref[:, 3]) <= 2**-8  # the last output, rounded to bfloat16
