"""The decode step of HF's Gated DeltaNet and Kimi Delta Attention (``recurrent_gated_delta_rule``,
``recurrent_kimi_delta_attention``) in its usual case (a cache's float32 state, float32 or bfloat16 tokens,
outside autograd): one call of the one-call decode kernel on HF's own tensors, no Decoder made, the state
updated where it lies; against HF's own (undecorated) torch function, against the general path (a
`linattn.Decoder` on the same state: the same kernel, bit for bit) and the float64 reference. Unusual calls
(autograd, float64, a non-contiguous state, torch.func) take the general path with the same results."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_tiny import modeling  # noqa: E402

import linattn  # noqa: E402
from linattn import reference  # noqa: E402
from linattn.decode import DECODERS  # noqa: E402
from linattn.integrations import transformers as lt  # noqa: E402
from linattn.state import State  # noqa: E402

torch.set_num_threads(1)
F64, BF16 = torch.float64, torch.bfloat16


def hf(model_type, name):
    return inspect.unwrap(lt.original(modeling(model_type), name))


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def bf16_ulp(x):
    a = x.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def tokens(gen, B, H, HV, K, Dv, per_channel, gate, T=3):
    """q, k ``[B, T, H, K]``, v ``[B, T, HV, Dv]``, g, beta, S0 in float64; q, k, v split from one projection (as
    HF's layer passes them: at batch > 1 their rows are strided). ``gate``: "mid" uniform in (-0.5, 0], "zero"
    within 1e-4 of 0, "off" near -30 (exp(g) ~ 1e-13: the state forgotten)."""
    proj = torch.randn(B, T, 2 * H * K + HV * Dv + 5, generator=gen, dtype=F64)
    q, k, v = (t.reshape(B, T, -1, d) for t, d in zip(proj[..., 5:].split([H * K, H * K, HV * Dv], -1),
                                                      (K, K, Dv), strict=True))
    shape = (B, T, HV, *((K,) if per_channel else ()))
    u = torch.rand(shape, generator=gen, dtype=F64)
    g = {"mid": -u * 0.5, "zero": -u * 1e-4, "off": -30 - u}[gate]
    beta = torch.rand(B, T, HV, generator=gen, dtype=F64)
    S0 = torch.randn(B, HV, K, Dv, generator=gen, dtype=F64)
    return q, k, v, g, beta, S0


def reference_run(q, k, v, g, beta, S0, l2, scale):
    o, S, _ = reference.linear_attention(q.numpy(), k.numpy(), v.numpy(), rule="gated_delta",
                                         feature_map="l2" if l2 else None, g=g.numpy(), beta=beta.numpy(),
                                         initial_S=S0.numpy(), scale=scale)
    return torch.from_numpy(np.asarray(o)), torch.from_numpy(np.asarray(S))


CASES = [  # family, B, H, HV, K, Dv, gate, l2, scale
    ("gated_delta", 1, 2, 4, 16, 9, "mid", True, None),
    ("gated_delta", 1, 3, 3, 13, 7, "zero", True, None),
    ("gated_delta", 3, 2, 4, 13, 9, "off", True, None),
    ("gated_delta", 3, 3, 3, 8, 5, "mid", False, None),
    ("gated_delta", 1, 2, 4, 13, 9, "mid", False, 0.3),
    ("gated_delta", 3, 1, 2, 9, 11, "zero", True, 0.7),
    ("kda", 1, 3, 3, 13, 9, "mid", True, None),
    ("kda", 3, 2, 2, 16, 7, "off", True, None),
    ("kda", 1, 2, 2, 9, 5, "zero", False, 0.25),
]


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_usual_step_is_one_kernel_call_and_agrees(calls, dtype, case):
    family, B, H, HV, K, Dv, gate, l2, scale = case
    kda = family == "kda"
    gen = torch.Generator().manual_seed(B * 100 + K)
    q, k, v, g, beta, S0 = tokens(gen, B, H, HV, K, Dv, kda, gate)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    g = g.float()
    ours, module, name = ((lt.recurrent_kimi_delta_attention, "kimi_linear", "recurrent_kimi_delta_attention")
                          if kda else (lt.recurrent_gated_delta_rule, "qwen3_next", "torch_recurrent_gated_delta_rule"))
    S, S_hf = S0.float(), S0.float()
    general = linattn.Decoder(State(S0.float()), rule="gated_delta", feature_map="l2" if l2 else None, scale=scale)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=l2)
    with torch.no_grad():
        for t in range(q.shape[1]):
            step = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
            before = len(calls)
            ptr = S.data_ptr()
            o, S_out = ours(*step, initial_state=S, scale=scale, **kw)
            assert S_out is S and S.data_ptr() == ptr and o.dtype == dtype and o.shape == (B, 1, HV, Dv)
            assert o.is_contiguous() and o.stride() == (HV * Dv, HV * Dv, Dv, 1)
            assert len(calls) == before + 1 and calls[-1][5] == calls[-1][6] == ptr  # one call, in place
            if B == 1:  # HF's own token tensors read where they lie: no copy
                assert calls[-1][:5] == tuple(x.data_ptr() for x in step)
            # the general path on the same values: the same kernel, bit for bit
            o_gen = general(*(x[:, 0].contiguous() for x in step))
            assert torch.equal(o[:, 0], o_gen) and torch.equal(S, general.state.S)
            # HF's torch step: its scale is 1/sqrt(K) on the (normalized) query; without l2, another scale is
            # the query rescaled (in float32: in bfloat16 that query would round again)
            q_hf = step[0] if scale is None else step[0] * (scale * K**0.5)
            if scale is None or (not l2 and dtype == torch.float32):
                o_hf, S_hf = hf(module, name)(q_hf, *step[1:], initial_state=S_hf, **kw)
                assert o_hf.dtype == dtype and rel(S, S_hf) <= 1e-5
                if dtype == BF16:
                    assert ((o.double() - o_hf.double()).abs() <= bf16_ulp(o_hf) + 1e-30).all()
                else:
                    assert rel(o, o_hf) <= 1e-5
    assert S not in DECODERS  # the general path (a Decoder kept per state tensor) never ran
    o_ref, S_ref = reference_run(*(x.double() for x in (q, k, v, g, beta)), S0, l2, scale)
    assert rel(S, S_ref) <= 1e-5
    assert rel(o[:, 0], o_ref[:, -1]) <= (1e-5 if dtype == torch.float32 else 2**-8)


def test_gates_at_minus_30_forget_the_state(calls):
    """exp(-30) ~ 1e-13: after the step the old state is gone, the new one is beta k u^T with u = beta v."""
    gen = torch.Generator().manual_seed(3)
    q, k, v, g, beta, S0 = (x.float() for x in tokens(gen, 1, 2, 2, 16, 8, False, "off", T=1))
    S = S0 * 1e3
    with torch.no_grad():
        lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)
    kn = torch.nn.functional.normalize(k[0, 0].double(), dim=-1, eps=1e-6)
    want = torch.einsum("hk,hv->hkv", kn, beta[0, 0, :, None].double() * v[0, 0].double())
    assert len(calls) == 1 and rel(S[0], want) <= 1e-5


def general_case_inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(5)
    return [x.to(dtype) for x in tokens(gen, 2, 2, 4, 9, 7, False, "mid", T=1)]


def test_grad_takes_the_general_path_and_leaves_the_state(calls):
    """Under autograd (an input requiring grad) the step records a graph, as HF's does, and leaves the state as
    it was (HF's own function does not write it either)."""
    q, k, v, g, beta, S0 = general_case_inputs()
    v.requires_grad_(True)
    S = S0.clone()
    o, S_new = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                             use_qk_l2norm_in_kernel=True)
    o_hf, S_hf = hf("qwen3_next", "torch_recurrent_gated_delta_rule")(
        q, k, v, g, beta, initial_state=S0.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert not calls and torch.equal(S, S0) and o.requires_grad
    assert rel(o, o_hf) <= 1e-5 and rel(S_new, S_hf) <= 1e-5
    (gv,) = torch.autograd.grad(o.sum(), v)
    (gv_hf,) = torch.autograd.grad(o_hf.sum(), v)
    assert rel(gv, gv_hf) <= 1e-5


def test_float64_takes_the_general_path():
    q, k, v, g, beta, S0 = general_case_inputs(F64)
    S = S0.clone()
    with torch.no_grad():
        o, S_out = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
    o_ref, S_ref = reference_run(q, k, v, g, beta, S0, True, None)
    assert S_out is S and S in DECODERS  # the Decoder kept for the state tensor ran it
    assert rel(o, o_ref) <= 1e-10 and rel(S, S_ref) <= 1e-10


def test_non_contiguous_state_takes_the_general_path(calls):
    """A state that is a transposed view (not the kernel's layout): the general path, the same values as a
    contiguous state's step."""
    q, k, v, g, beta, S0 = general_case_inputs()
    S_t = S0.transpose(-1, -2).contiguous().transpose(-1, -2)  # [B, HV, K, Dv] values, Dv-major memory
    assert not S_t.is_contiguous()
    S = S0.clone()
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        o_t, S_t_out = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S_t, **kw)
        n = len(calls)
        o, _ = lt.recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, **kw)
    assert len(calls) == n + 1  # the contiguous state's step was the one kernel call
    assert rel(o_t, o) <= 1e-6 and rel(S_t_out, S) <= 1e-6


def test_torch_func_takes_the_general_path(calls):
    """Under torch.func (grad here) the step runs the functional path: HF's gradient, the state untouched."""
    q, k, v, g, beta, S0 = general_case_inputs()
    S = S0.clone()
    hf_fn = hf("qwen3_next", "torch_recurrent_gated_delta_rule")

    def loss(fn, v_):
        return fn(q, k, v_, g, beta, initial_state=S, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)[0].pow(2).sum()

    got = torch.func.grad(lambda v_: loss(lt.recurrent_gated_delta_rule, v_))(v)
    want = torch.func.grad(lambda v_: loss(hf_fn, v_))(v)
    assert not calls and torch.equal(S, S0) and rel(got, want) <= 1e-5
