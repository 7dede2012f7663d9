"""bfloat16 tokens through the one-call decode kernel (kernels/cpu_decode.py): the kernel widens bfloat16 q, k, v,
g and beta as it reads them, keeps the state in float32 and writes o in v's dtype, rounded to nearest even.

So a bfloat16 step must equal, bit for bit, the float32 step on the same values widened: the same state, and o
equal to torch's cast of that step's float32 output. The float32 step itself is tested against the float64
reference in test_decode_fast.py; here the bfloat16 decode is checked against the reference too (on the
widened inputs). A spy on the compiled entry proves the kernel ran, with which dtypes it was told."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State
from linattn.backends import policy
from linattn.kernels import cpu_decode, cpu_intrinsics

BF = torch.bfloat16
TOL = 2e-4  # float32 state, a dozen tokens, as test_decode_fast.py


def tokens(rule, gate, *, B=2, T=10, H=3, G=2, D=5, Dv=7, seed=0):
    """Inputs already rounded to bfloat16 (as float32 tensors): gates near 1, near 0 and -inf while decoding."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H * G, Dv, generator=gen)
    kw = {}
    if rule in ("gated", "gated_delta"):
        g = F.logsigmoid(torch.randn(B, T, H * G, *((D,) if gate == "channel" else ()), generator=gen) * 3)
        if T > 8:
            g[:, 5], g[:, 7], g[:, 8] = -1e-3, -30.0, -torch.inf
        kw["g"] = g
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(B, T, H * G, generator=gen) * 1.5
        k = F.normalize(k, dim=-1)
    q, k, v = (x.to(BF).float() for x in (q, k, v))
    return q, k, v, {n: x.to(BF).float() for n, x in kw.items()}


def run(q, k, v, kw, state, which, inplace, **opts):
    """Decode every token from ``state``; ``which``: the names of the inputs passed in bfloat16."""
    outs = []
    for t in range(q.shape[1]):
        tok = {n: x[:, t].contiguous() for n, x in dict(q=q, k=k, v=v, **kw).items()}
        tok = {n: x.to(BF) if n in which else x for n, x in tok.items()}
        o, state = linattn.step(state=state, inplace=inplace, **tok, **opts)
        outs.append(o)
    return torch.stack(outs, 1), state


def start(rule, normalize, B, HV, D, Dv, seed=1):
    """A float32 state in linattn's own layout: S and z the columns of one buffer (what the kernel updates)."""
    gen = torch.Generator().manual_seed(seed)
    buf = torch.randn(B, HV, D, Dv + normalize, generator=gen) * 0.3
    if normalize:
        buf[..., Dv] = buf[..., Dv].abs() + 0.5
        return State(buf[..., :Dv], buf[..., Dv])
    return State(buf)


CASES = [  # rule, gate kind, feature map, normalize
    ("accumulate", None, "elu1", True),
    ("accumulate", None, "relu1", False),
    ("gated", "head", "elu1", True),
    ("gated", "channel", "relu1", True),
    ("gated", "head", None, False),
    ("delta", None, "l2", False),
    ("gated_delta", "head", "l2", False),  # Qwen3-Next, Qwen3.5
    ("gated_delta", "channel", "l2", False),  # Kimi Delta
    ("gated_delta", "channel", None, False),
]


@pytest.mark.parametrize("rule,gate,fmap,normalize", CASES)
@pytest.mark.parametrize("inplace", [True, False])
def test_bf16_step_is_the_float32_step_on_the_widened_values(calls, rule, gate, fmap, normalize, inplace):
    q, k, v, kw = tokens(rule, gate)
    opts = dict(rule=rule, feature_map=fmap, normalize=normalize)
    B, T, _, D = q.shape
    HV, Dv = v.shape[2:]
    o32, s32 = run(q, k, v, kw, start(rule, normalize, B, HV, D, Dv), (), inplace, **opts)
    n32 = len(calls)
    which = ("q", "k", "v", *kw)
    o, s = run(q, k, v, kw, start(rule, normalize, B, HV, D, Dv), which, inplace, **opts)
    assert len(calls) == n32 + T and all(c[18] == 31 - 8 * (gate is None) - 16 * ("beta" not in kw)
                                         for c in calls[n32:])  # the kernel, told every input is bfloat16
    assert o.dtype == BF and s.S.dtype == torch.float32
    assert torch.equal(s.S, s32.S) and (not normalize or torch.equal(s.z, s32.z))
    assert torch.equal(o.view(torch.int16), o32.to(BF).view(torch.int16))  # torch's rounding, bit for bit
    init = start(rule, normalize, B, HV, D, Dv)
    o_ref, S_ref, z_ref = reference_call(q, k, v, initial_state=init, **kw, **opts)
    assert rel_err(o.float(), o_ref) < 4e-3  # bfloat16 output: half an ulp is 2^-9
    assert rel_err(s.S, S_ref) < TOL and (z_ref is None or rel_err(s.z, z_ref) < TOL)


@pytest.mark.parametrize("which", [("q", "k"), ("v",), ("q",), ("g",), ("beta",), ("k", "g", "beta"), ("v", "beta")])
def test_mixed_dtypes_take_the_kernel_and_o_follows_v(calls, which):
    """Any mix of float32 and bfloat16 inputs runs the kernel; o comes in v's dtype."""
    q, k, v, kw = tokens("gated_delta", "head", B=1, T=4, H=2, G=3, D=9, Dv=11)
    opts = dict(rule="gated_delta", feature_map="l2")
    o32, s32 = run(q, k, v, kw, start("gated_delta", False, 1, 6, 9, 11), (), True, **opts)
    o, s = run(q, k, v, kw, start("gated_delta", False, 1, 6, 9, 11), which, True, **opts)
    assert len(calls) == 8
    bits = {"q": 1, "k": 2, "v": 4, "g": 8, "beta": 16}
    assert calls[-1][18] == sum(bits[n] for n in which)
    assert torch.equal(s.S, s32.S)
    assert o.dtype == (BF if "v" in which else torch.float32)
    assert torch.equal(o, o32.to(o.dtype))


def test_decoder_reads_bf16_and_other_dtypes_take_the_full_path(calls):
    q, k, v, kw = tokens("gated", "head", B=1, T=3, H=2, G=1, D=8, Dv=8)
    state = start("gated", True, 1, 2, 8, 8)
    dec = linattn.Decoder(state, rule="gated", feature_map="elu1")
    ref = start("gated", True, 1, 2, 8, 8)
    for t in range(3):
        o = dec(q[:, t].to(BF), k[:, t].to(BF), v[:, t].to(BF), g=kw["g"][:, t].to(BF))
        o32, ref = linattn.step(q[:, t], k[:, t], v[:, t], ref, rule="gated", feature_map="elu1", g=kw["g"][:, t],
                                inplace=True)
        assert o.dtype == BF and torch.equal(o, o32.to(BF))
    assert len(calls) == 6 and torch.equal(dec.state.S, ref.S) and torch.equal(dec.state.z, ref.z)
    o16 = dec(q[:, 0].half(), k[:, 0].half(), v[:, 0].half(), g=kw["g"][:, 0])  # float16: not the kernel's
    assert len(calls) == 6 and o16.dtype == torch.float16


@pytest.mark.parametrize("bad", [float("nan"), 0.25])
@pytest.mark.parametrize("gate", ["head", "channel"])
def test_bad_bf16_gate_names_g_and_writes_nothing(calls, bad, gate):
    q, k, v, kw = tokens("gated_delta", gate, B=2, T=1, H=2, G=1, D=6, Dv=5)
    state = start("gated_delta", False, 2, 2, 6, 5)
    before = state.S.clone()
    g = kw["g"][:, 0].to(BF)
    g[1, 1] = bad
    with pytest.raises(ValueError, match="g must be <= 0"):
        linattn.step(q[:, 0].to(BF), k[:, 0].to(BF), v[:, 0].to(BF), state, rule="gated_delta", feature_map="l2",
                     g=g, beta=kw["beta"][:, 0].to(BF), inplace=True)
    assert len(calls) == 1 and calls[0][18] == 31  # the kernel saw the gate first and wrote nothing
    assert torch.equal(state.S, before)


def test_split_bf16_step_equals_the_serial_one_and_checks_bf16_gates(monkeypatch):
    """Split over threads (offsets per input in its own element size), the bfloat16 step equals the serial one;
    a bad bfloat16 gate in the last part stops every part before any writes."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread")
    q, k, v, kw = tokens("gated_delta", "channel", B=3, T=1, H=2, G=2, D=6, Dv=5)
    tok = dict(q=q[:, 0].to(BF), k=k[:, 0].to(BF), v=v[:, 0].to(BF), g=kw["g"][:, 0].to(BF), beta=kw["beta"][:, 0])
    opts = dict(rule="gated_delta", feature_map="l2", inplace=True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        o1, s1 = linattn.step(state=start("gated_delta", False, 3, 4, 6, 5), **tok, **opts)
        monkeypatch.setattr(policy, "DECODE_SPLIT_MIN_ENTRIES", 0)
        torch.set_num_threads(2)
        split = []
        real = cpu_decode.decode_split
        monkeypatch.setattr(cpu_decode, "decode_split", lambda n, *a, **kw: split.append(n) or real(n, *a, **kw))
        for per in ("batch", "heads"):  # B > 1 splits by sequence; one sequence by query/key head
            b = slice(None) if per == "batch" else slice(2, 3)
            o, s = linattn.step(state=State(start("gated_delta", False, 3, 4, 6, 5).S[b].contiguous()),
                                **{n: x[b].contiguous() for n, x in tok.items()}, **opts)
            assert torch.equal(o, o1[b]) and torch.equal(s.S, s1.S[b])
        assert len(split) == 2
        state = start("gated_delta", False, 3, 4, 6, 5)
        bad = dict(tok, g=tok["g"].clone())
        bad["g"][2, 3, 5] = 0.5
        with pytest.raises(ValueError, match="g must be <= 0"):
            linattn.step(state=state, **bad, **opts)
        assert len(split) == 3 and torch.equal(state.S, start("gated_delta", False, 3, 4, 6, 5).S)
    finally:
        torch.set_num_threads(before)


@numba.njit
def _round_all(x, out):
    for i in range(x.shape[0]):
        out[i] = cpu_intrinsics.bf16_round_jit(x[i])


def test_bf16_rounding_is_torchs_cast():
    """Nearest, ties to even, over random bit patterns, exact ties, subnormals, the overflow edge and infinities."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2**16, 1000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000  # exactly halfway
    edges = np.array([0, 0x80000000, 1, 0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000, 0x3F808000,
                      0x3F818000], dtype=np.uint32)
    x = np.concatenate([bits, ties, ties | 0x80000000, edges]).view(np.float32)
    x = x[~np.isnan(x)]
    out = np.empty(x.shape, np.int16)
    _round_all(x, out)
    want = torch.from_numpy(x).to(BF).view(torch.int16).numpy()
    assert np.array_equal(out, want)
    nan = np.empty(1, np.int16)
    _round_all(np.array([np.nan], np.float32), nan)
    assert torch.isnan(torch.from_numpy(nan).view(BF)).all()
