"""Definitions made once and shared: the rule names (``linattn.ops``) and the division by the normalizer
(``linattn.ops.common.normalized_read``), which every torch path (forms, packing, sequence parallelism) uses."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import linattn
from linattn import api, decode, distributed, ops, packing, prefill, reference
from linattn.nn import linear_attention
from linattn.ops import common
from linattn.tools import stability

SRC = Path(linattn.__file__).resolve().parent


def test_rule_names_are_defined_once():
    for module in (api, distributed, linear_attention, stability):
        for name in ("RULES", "GATED_RULES", "DELTA_RULES"):
            if hasattr(module, name):
                assert getattr(module, name) is getattr(ops, name), (module.__name__, name)
    assert api.EPS_MODES is ops.EPS_MODES
    # The NumPy reference keeps its own copy on purpose (it shares no code with what it checks): same values.
    assert (reference.RULES, reference.GATED_RULES, reference.DELTA_RULES, reference.EPS_MODES) == (
        ops.RULES, ops.GATED_RULES, ops.DELTA_RULES, ops.EPS_MODES)
    own = {"reference.py"}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel in own or rel == "ops/__init__.py":
            continue
        assert not re.search(r"^(RULES|GATED_RULES|DELTA_RULES|EPS_MODES)\s*=", path.read_text(), re.M), rel


@pytest.mark.parametrize("eps_mode", ["add", "clamp"])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 0.3])
def test_normalized_read_is_the_reference_division(eps_mode, eps):
    gen = torch.Generator().manual_seed(0)
    num = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    den = torch.tensor([1e-9, 0.2, 0.31, 2.0, 7.5], dtype=torch.float64).expand(3, 5).clone()
    o = common.normalized_read(torch.cat([num, den[..., None]], dim=-1), eps, eps_mode)
    d = den.numpy()[..., None]
    want = num.numpy() / ((d + eps) if eps_mode == "add" else np.maximum(d, eps))
    np.testing.assert_allclose(o.numpy(), want, rtol=1e-15, atol=0)
    out = torch.empty_like(num)
    common.normalized_read(torch.cat([num, den[..., None]], dim=-1), eps, eps_mode, out=out)
    assert torch.equal(out, o)


def test_every_torch_path_divides_in_normalized_read(monkeypatch):
    """Replace the one helper and the unpacked, packed and sequence-parallel reads all change with it."""
    calls = []

    def spy(num_den, eps, eps_mode, out=None):
        calls.append(eps_mode)
        return common.normalized_read(num_den, eps, eps_mode, out=out)

    for module in (prefill, packing, decode, distributed):
        monkeypatch.setattr(module, "normalized_read", spy)
    q = torch.randn(1, 6, 2, 4)
    linattn.linear_attention(q, q, q, eps_mode="clamp", backend="torch")
    linattn.linear_attention(q, q, q, eps_mode="clamp", cu_seqlens=torch.tensor([0, 2, 6]), backend="torch")
    linattn.step(q[:, 0], q[:, 0], q[:, 0], eps_mode="clamp", backend="torch")
    assert calls.count("clamp") == 3
    assert distributed.normalized_read is spy  # (the distributed read runs under torch.distributed: tests there)
