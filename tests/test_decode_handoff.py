"""The decode step shared with awake workers (kernels/cpu_handoff.py through cpu_decode.decode_handoff): bit for
bit the serial kernel's result for every way the work splits (sequences, query/key heads, value heads of one
group), in chunks of any size, in place and not; a bad gate anywhere leaves everything unwritten; a worker that
has gone to sleep is woken (or its chunks run by the caller)."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("numba")
import numba  # noqa: E402

from linattn.kernels import cpu_decode, cpu_handoff  # noqa: E402

pytestmark = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2 or not cpu_handoff.supported(),
                                reason="needs two numba threads on x86-64 Linux")


def make(B, Hq, HV, D, Dv, *, gate_width, delta, normalize, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, Hq, D, generator=gen), torch.randn(B, Hq, D, generator=gen)
    v = torch.randn(B, HV, Dv, generator=gen)
    g = -torch.rand(B, HV, max(gate_width, 1), generator=gen)
    beta = torch.rand(B, HV, generator=gen)
    S = torch.randn(B, HV, D, Dv + normalize, generator=gen) * 0.1
    code = cpu_decode.FEATURE_CODES["l2" if delta else "elu1"]
    return q, k, v, g, beta, S, code


def args_of(t, S_in, S_out, o, B, Hq, HV, D, Dv, gate_width, code, normalize, delta):
    q, k, v, g, beta = t
    return (q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), S_in.data_ptr(),
            S_out.data_ptr(), o.data_ptr(), B, Hq, HV, D, Dv, gate_width, code, 0, int(normalize), int(delta),
            D**-0.5, 1e-6)


# (B, Hq, HV, D, Dv): sequences; query/key heads with grouped value heads; one group's value heads (Mamba-2)
SHAPES = [(3, 2, 4, 5, 7), (1, 5, 10, 16, 9), (1, 1, 7, 12, 5)]


@pytest.mark.parametrize("shape", SHAPES, ids=["batch", "qk-heads", "value-heads"])
@pytest.mark.parametrize("rule", ["gated", "gated_delta-channel", "delta"])
@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "copy"])
@pytest.mark.parametrize("chunk_entries", [1, 1 << 15], ids=["one-unit-chunks", "default-chunks"])
def test_handoff_equals_the_serial_kernel(monkeypatch, shape, rule, inplace, chunk_entries):
    monkeypatch.setattr(cpu_decode, "SPLIT_CHUNK_ENTRIES", chunk_entries)
    B, Hq, HV, D, Dv = shape
    delta = "delta" in rule
    gate_width = 0 if rule == "delta" else (D if "channel" in rule else 1)
    normalize = not delta
    q, k, v, g, beta, S0, code = make(B, Hq, HV, D, Dv, gate_width=gate_width, delta=delta, normalize=normalize)
    results = []
    for fn in (lambda *a: cpu_decode.decode(*a), lambda *a: cpu_decode.decode_handoff(2, *a)):
        for step in range(3):  # a few steps: the workers see consecutive tasks
            S = S0.clone()
            out = S if inplace else torch.full_like(S, float("nan"))
            o = torch.full((B, HV, Dv), float("nan"))
            tok = (q * (step + 1), k, v, g, beta)
            assert fn(*args_of(tok, S, out, o, B, Hq, HV, D, Dv, gate_width, code, normalize, delta)) == 0
            results.append((o, out, S))
    serial, split = results[:3], results[3:]
    for (o1, out1, S1), (o2, out2, S2) in zip(serial, split, strict=True):
        assert torch.equal(o1, o2) and torch.equal(out1, out2) and torch.equal(S1, S2)
    assert not torch.equal(serial[0][1], S0)  # the step wrote


@pytest.mark.parametrize("shape", SHAPES, ids=["batch", "qk-heads", "value-heads"])
def test_handoff_with_a_bad_gate_writes_nothing(monkeypatch, shape):
    monkeypatch.setattr(cpu_decode, "SPLIT_CHUNK_ENTRIES", 1)
    B, Hq, HV, D, Dv = shape
    q, k, v, g, beta, S, code = make(B, Hq, HV, D, Dv, gate_width=D, delta=True, normalize=False)
    g = torch.full((B, HV, D), -0.5)
    g.view(-1)[-1] = 0.25  # the very last gate
    S0, o = S.clone(), torch.zeros(B, HV, Dv)
    a = args_of((q, k, v, g, beta), S, S, o, B, Hq, HV, D, Dv, D, code, False, True)
    assert cpu_decode.decode_handoff(2, *a) == cpu_decode.BAD_GATE
    assert torch.equal(S, S0) and not o.any()
    g.view(-1)[-1] = float("nan")
    assert cpu_decode.decode_handoff(2, *a) == cpu_decode.BAD_GATE and torch.equal(S, S0)


def test_a_sleeping_worker_is_woken_and_the_result_stays_exact(monkeypatch):
    """After more than the spin time idle the worker sleeps; the next calls still give the serial result (its
    chunks taken by the worker once woken, or by the caller)."""
    monkeypatch.setattr(cpu_decode, "SPLIT_CHUNK_ENTRIES", 1)
    B, Hq, HV, D, Dv = 1, 4, 8, 8, 8
    q, k, v, g, beta, S0, code = make(B, Hq, HV, D, Dv, gate_width=1, delta=True, normalize=False)
    outs = []
    for fn in (cpu_decode.decode, lambda *a: cpu_decode.decode_handoff(2, *a)):
        S, o = S0.clone(), torch.empty(B, HV, Dv)
        for _ in range(4):
            time.sleep(cpu_decode.HANDOFF_SPIN_US * 1e-6 * 20)
            assert fn(*args_of((q, k, v, g, beta), S, S, o, B, Hq, HV, D, Dv, 1, code, False, True)) == 0
        outs.append((o.clone(), S))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
