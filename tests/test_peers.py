"""The real peers of ``linattn perf`` (flash-linear-attention's pure-torch functions, HF's Qwen3-Next fallback) through
their adapters: each computes linattn's function on small inputs, and a wrongly wired adapter is reported.

Skipped where the peers are not installed (``pip install -c constraints.txt ".[peers]"``; CI installs them).
"""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from linattn.tools.perf import peers as pp

# Found, not imported: importing fla and transformers at collection costs every run of the suite seconds.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("fla") is None or importlib.util.find_spec("transformers") is None,
    reason="flash-linear-attention or transformers (linattn[peers]) not installed",
)

# T = 64: a multiple of every peer's fixed chunk (64 for fla's linear attention, 32 for its delta rule).
SHAPE = {"B": 1, "T": 64, "H": 2, "D": 16}


@pytest.fixture(scope="module")
def checks():
    return {row["peer"]: row for row in pp.crosscheck(pp.PEERS, **SHAPE)}


@pytest.mark.parametrize("peer", pp.PEERS, ids=lambda p: p.name)
def test_every_peer_matches_linattn(checks, peer):
    row = checks[peer.name]
    assert row["status"] == "match", row
    assert row["rel_diff"] < 1e-5  # float32 agreement, far inside the cross-check's 1e-3


def _swap_gate_and_beta(adapter):
    """The adapter, called with g and beta exchanged: the argument-order slip the cross-check must catch."""

    def swapped(fn, inp: pp.Inputs):
        return adapter(fn, dataclasses.replace(inp, g=inp.beta, beta=inp.g))

    return swapped


@pytest.mark.parametrize("peer", [p for p in pp.PEERS if p.variant == "gated_delta"], ids=lambda p: p.name)
def test_peer_with_gate_and_beta_swapped_is_a_mismatch(peer):
    wrong = dataclasses.replace(peer, name=peer.name + ".swapped", adapter=_swap_gate_and_beta(peer.adapter),
                                _cache={})
    (row,) = pp.crosscheck((wrong,), **SHAPE)
    assert row["status"] == "MISMATCH", row
