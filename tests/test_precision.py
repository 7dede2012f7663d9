"""The precision devices the kernels rely on, each shown to matter by an input where skipping it fails.

* Cumulative log-gates are summed in float64 (``linattn.ops.common.log_cumsum``): after a strong decay |G| is in
  the hundreds, and a float32 sum loses ~|G| * 6e-8 in every later difference G_i - G_j.
* A half-precision running state is carried in float32 across chunks (``carry_dtype``) and across the chunk
  form's slabs: adding a chunk's write to a large bfloat16/float16 sum rounds it away (the sum stagnates).
* ``state_dtype=bfloat16/float16`` in every form of every rule agrees with the float64 reference to a few units
  of the half precision's roundoff.

docs/testing.md derives each tolerance from the roundoff ``u`` of the dtype and what the forms measure.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err
from test_forms import fixed_case, make_inputs

import linattn
import linattn.prefill as prefill
from linattn import State

U = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}  # unit roundoff
HALF = (torch.bfloat16, torch.float16)


# ------------------------------------------------------------------------------------------------- gate sums
def strong_then_weak_gates(rule: str, per_channel: bool = False, T: int = 256):
    """Float32 inputs whose gates decay by 20 nats per token for the first half of every 64 tokens, then barely
    (g = -1e-3): the cumulative log-gate reaches |G| ~ 640 inside a chunk (and ~2500 over the sequence) while the
    later tokens' differences G_i - G_j stay small."""
    gen = torch.Generator().manual_seed(0)
    B, H, D = 1, 2, 8
    q, k, v = (torch.rand(B, T, H, D, generator=gen) for _ in range(3))
    g_t = torch.where(torch.arange(T) % 64 < 32, -20.0, -1e-3)
    shape = (B, T, H, D) if per_channel else (B, T, H)
    g = g_t.view(1, T, *([1] * (len(shape) - 2))).expand(shape).contiguous()
    kwargs = {"rule": rule, "g": g}
    if rule == "gated_delta":
        k = F.normalize(k, dim=-1)
        kwargs["beta"] = torch.rand(B, T, H, generator=gen)
    return (q, k, v), kwargs


@pytest.mark.parametrize(("rule", "per_channel"), [("gated", False), ("gated", True), ("gated_delta", False)],
                         ids=["gated", "gated-per-channel", "gated_delta"])
def test_gate_sums_in_float64_keep_float32_exact_after_strong_decay(rule, per_channel):
    # Measured with float64 sums: <= 3.7e-7 (6.2 u) in every form; summing in float32 gives 2.2e-5 (chunk) to
    # 8.9e-5 (parallel), 80 to 380 times more (the token loop and the scan take no cumulative sums). Tolerance 16 u.
    (q, k, v), kwargs = strong_then_weak_gates(rule, per_channel)
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    for form in linattn.supported_forms(rule):
        o, state = linattn.linear_attention(q, k, v, form=form, output_final_state=True, **kwargs)
        errors = {"o": rel_err(o, o_ref), "S": rel_err(state.S, S_ref)}
        assert max(errors.values()) <= 16 * U[torch.float32], f"{rule}/{form}: {errors}"


# ------------------------------------------------------------------------------------------------- carry
def stagnating_sum(rule: str, state_dtype: torch.dtype):
    """Inputs whose exact running state is a sum that a half-precision accumulator cannot hold.

    Accumulate and gated (g = 0): q = k = v = 1 and an initial state S_0 = 4096 (bfloat16) or 32768 (float16), so
    S_t = S_0 + t exactly and every chunk of 16 tokens adds 16: half a spacing (32) of the half dtype at S_0, so in
    that dtype S_0 + 16 rounds back to S_0 (ties to even) and the sum never grows. Delta rules (bfloat16): k = e_1,
    v = 1, beta = 2^-10 and S_0 = 7/8, so S_t = 1 - (1 - S_0)(1 - beta)^t -> 1; a chunk's correction
    16 beta (1 - S) <= 2^-9 is at most half a bfloat16 spacing there. Every input is exact in the half dtype.
    """
    B, T, H = 1, 1024, 1
    if rule in ("accumulate", "gated"):
        kwargs = {"normalize": False, "scale": 1.0}
        S0 = 4096.0 if state_dtype == torch.bfloat16 else 32768.0
    else:
        kwargs = {"beta": torch.full((B, T, H), 2.0**-10), "scale": 1.0}
        S0 = 0.875
    if rule in ("gated", "gated_delta"):
        kwargs["g"] = torch.zeros(B, T, H)
    ones = torch.ones(B, T, H, 1)
    initial = State(torch.full((B, H, 1, 1), S0))
    return (ones, ones, ones), {"rule": rule, "chunk_size": 16, "state_dtype": state_dtype, "initial_state": initial,
                                **kwargs}


CARRY_CASES = [(r, dt) for dt in HALF for r in linattn.RULES if dt == torch.bfloat16 or r in ("accumulate", "gated")]


def _check_carry(rule, state_dtype):
    # Measured with the float32 carry: 1.6 u (bfloat16 accumulate, gated), 1.9 u (float16), 2.6 u (delta rules);
    # carried in the half dtype: 51 u, 62 u and 21 u. Tolerance 6 u.
    (q, k, v), kwargs = stagnating_sum(rule, state_dtype)
    o_ref, S_ref, _ = reference_call(q, k, v, **kwargs)
    o, state = linattn.linear_attention(q, k, v, output_final_state=True, **kwargs)
    assert state.S.dtype == state_dtype
    errors = {"o": rel_err(o, o_ref), "S": rel_err(state.S, S_ref)}
    assert max(errors.values()) <= 6 * U[state_dtype], f"{rule} {state_dtype}: {errors}"


@pytest.mark.parametrize(("rule", "state_dtype"), CARRY_CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_half_state_is_carried_in_float32_across_chunks(rule, state_dtype):
    _check_carry(rule, state_dtype)


@pytest.mark.parametrize(("rule", "state_dtype"), CARRY_CASES, ids=lambda x: str(x).removeprefix("torch."))
def test_half_state_is_carried_in_float32_across_slabs(monkeypatch, rule, state_dtype):
    # Slabs of one chunk: the state crosses a slab boundary every 16 tokens, as a long sequence does every few
    # thousand; between slabs it must stay in float32 too.
    monkeypatch.setattr(prefill, "slab_tokens", lambda heads, width, chunk_size, elem_bytes: chunk_size)
    _check_carry(rule, state_dtype)


# ------------------------------------------------------------------------------------------------- state_dtype
@pytest.mark.parametrize("T", [16, 128])
@pytest.mark.parametrize("state_dtype", HALF, ids=["bfloat16", "float16"])
@pytest.mark.parametrize("rule", linattn.RULES)
def test_half_state_dtype_every_form_matches_reference(rule, state_dtype, T):
    """Float32 inputs, the state (and every product) in a half dtype, against the float64 reference.

    The inputs are rounded to the half dtype inside the call, so the floor is about 1 u; the token loop also rounds
    the state at every token, which grows like sqrt(T). Measured on these inputs: 1.0 to 3.1 u at T = 16 and 1.0
    to 6.8 u at T = 128 (accumulate's token loop the worst). Tolerance u (4 + sqrt(T)): 8 u and 15 u.
    """
    fmap = "elu1" if rule in ("accumulate", "gated") else "identity"
    tol = U[state_dtype] * (4 + math.sqrt(T))
    for per_channel in (False, True) if rule == "gated" else (False,):
        case = fixed_case(rule, fmap, T=T, Dk=8, Dv=8, chunk_size=16, per_channel=per_channel)
        (q, k, v), kwargs = make_inputs(case, torch.float32)
        o_ref, S_ref, z_ref = reference_call(q, k, v, **kwargs)
        for form in linattn.supported_forms(rule):
            o, state = linattn.linear_attention(q, k, v, form=form, output_final_state=True, state_dtype=state_dtype,
                                                **kwargs)
            assert o.dtype == torch.float32 and state.S.dtype == state_dtype
            errors = {"o": rel_err(o, o_ref), "S": rel_err(state.S, S_ref)}
            if z_ref is not None:
                errors["z"] = rel_err(state.z, z_ref)
            assert max(errors.values()) <= tol, f"{rule}/{form} per-channel {per_channel}: {errors} > {tol:.1e}"
