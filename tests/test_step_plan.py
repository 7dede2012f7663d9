"""One decode step is planned once: `linattn.step` asks `linattn.backends.plan_step` once and both its paths follow
that plan (the one-call kernel, or the checked full path, which settles the plan on the tensors and never asks
again); a `Decoder` plans once for all its calls, and so do nn's decode and the transformers integration's, which
decode through one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linattn
from linattn import backends

pytest.importorskip("numba")


@pytest.fixture
def asked(monkeypatch):
    """How often `plan_step` and `settle` ran (they still run)."""
    seen = {"plan_step": 0, "settle": 0}
    for name in seen:
        real = getattr(backends, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(backends, name, spy)
    return seen


def token(B=2, H=3, D=5, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, D, generator=gen, dtype=dtype) for _ in range(3))
    return q, F.normalize(k, dim=-1), v, F.logsigmoid(torch.randn(B, H, generator=gen, dtype=dtype))


def test_step_asks_once_on_either_path(asked, calls):
    q, k, v, g = token()
    state = linattn.State.zeros(2, 3, 5, 5)
    linattn.step(q, k, v, state, rule="gated", g=g, inplace=True)  # the plain case: the one-call kernel
    assert (asked, len(calls)) == ({"plan_step": 1, "settle": 0}, 1)
    o, _ = linattn.step(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, state, rule="gated", g=g)  # strided q
    assert asked == {"plan_step": 2, "settle": 1} and len(calls) == 1
    want, _ = linattn.step(q, k, v, state, rule="gated", g=g, backend="torch")
    assert torch.allclose(o, want, atol=1e-6) and asked == {"plan_step": 3, "settle": 2}
    linattn.step(*(x.double() for x in (q, k, v)), rule="gated", g=g.double())  # float64: the torch step
    assert asked == {"plan_step": 4, "settle": 3} and len(calls) == 1


def test_decoder_plans_once_for_all_its_calls(asked, calls):
    q, k, v, g = token()
    dec = linattn.Decoder(linattn.State.zeros(2, 3, 5, 5), rule="gated")
    assert asked == {"plan_step": 1, "settle": 0}
    for _ in range(3):
        dec(q, k, v, g=g)
    dec(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, g=g)  # off the one-call path: settled, not re-planned
    assert asked == {"plan_step": 1, "settle": 1} and len(calls) == 3


def test_nn_and_transformers_decode_plan_once_per_kept_decoder(asked):
    from linattn.integrations.transformers.gated_delta import recurrent_gated_delta_rule
    from linattn.nn import LinearAttention

    torch.manual_seed(0)
    layer = LinearAttention(16, 2, 8, rule="gated_delta")
    x = torch.randn(1, 5, 16)
    with torch.no_grad():
        _, cache = layer(x[:, :3])
        for t in range(3, 5):
            _, cache = layer(x[:, t:t + 1], cache)
    assert asked["plan_step"] == 1
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 2, 8, generator=gen) for _ in range(3))
    g, beta = F.logsigmoid(torch.randn(1, 1, 2, generator=gen)), torch.rand(1, 1, 2, generator=gen)
    S = torch.zeros(1, 2, 8, 8)
    # HF's step makes its one kernel call itself: it plans once per process, when it loads the kernel (in an earlier
    # test or here), and never per step
    before = asked["plan_step"]
    for _ in range(3):
        recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True)
    assert asked["plan_step"] - before <= 1
    before = asked["plan_step"]
    for _ in range(3):
        recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S, output_final_state=True)
    assert asked["plan_step"] == before


def test_a_forced_backend_refused_by_the_plan_names_bad_arguments_first():
    """Under a transform the plan of a forced "cpu" holds its refusal; running the plan raises it, after the
    checks, so a bad argument is still the error that names it. A Decoder is neither made nor called there."""
    q, k, v, g = token(B=1)

    def one(q_, **kw):
        return linattn.step(q_, k, v, g=g, backend="cpu", **kw)[0]

    qs = q.expand(3, -1, -1, -1)  # vmapped over its first dimension: q_ is [1, 3, 5]
    with pytest.raises(ValueError, match="rule: unknown rule 'nope'"):
        torch.func.vmap(lambda q_: one(q_, rule="nope"))(qs)
    with pytest.raises(ValueError, match="backend='cpu' cannot run this call: it reads raw tensor memory"):
        torch.func.vmap(lambda q_: one(q_, rule="gated"))(qs)
    with pytest.raises(ValueError, match="Decoder: made under a torch.func transform"):
        torch.func.vmap(lambda q_: linattn.Decoder(linattn.State.zeros(1, 3, 5, 5), rule="gated")(q_, k, v, g=g))(qs)
