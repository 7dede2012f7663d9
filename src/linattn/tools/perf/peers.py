"""Implementations timed by ``linattn perf``: linattn itself, the optional peers, and softmax attention.

Every implementation is called on the same `Inputs` (``[B, T, H, D]``, the public layout) and returns
``o [B, T, H, Dv]``. Each peer adapter transposes to the peer's own layout and passes arguments so that the peer
computes exactly the function linattn computes for that variant (scale ``D**-0.5`` on the queries, output read
after the write, the same epsilon); `crosscheck` measures how closely they agree.

Peers are imported only when a selected case needs them. A peer whose import fails is reported as
``not installed`` with the import error; it never stops the run.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import linattn

# The benchmark's variants: rule, gate shape, and whether linattn normalizes (its default for the rule).
VARIANTS = ("accumulate", "gated_head", "gated_channel", "delta", "gated_delta")
RULE_OF = {
    "accumulate": "accumulate",
    "gated_head": "gated",
    "gated_channel": "gated",
    "delta": "delta",
    "gated_delta": "gated_delta",
}
# flash-linear-attention's normalized linear attention adds 1e-10 to the denominator; linattn uses the same value
# everywhere in the benchmark so both compute one function (the value does not change the cost).
EPS = 1e-10


class SkipCase(Exception):
    """A case that cannot run at this shape (e.g. T not a multiple of a peer's fixed chunk); not an error."""


@dataclass
class Inputs:
    """Random inputs of one case. Accumulate and gated use positive features (the normalizer needs them); the
    delta rules use L2-normalized keys and beta in (0, 1), where their writes converge."""

    variant: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor | None = None
    beta: torch.Tensor | None = None

    def leaves(self) -> list[torch.Tensor]:
        return [x for x in (self.q, self.k, self.v, self.g, self.beta) if x is not None]


def make_inputs(variant: str, B: int, T: int, H: int, D: int, *, seed: int = 0, grad: bool = False) -> Inputs:
    """Inputs for ``variant`` at ``[B, T, H, D]``; ``grad=True`` makes every tensor a leaf that requires grad."""
    if variant not in VARIANTS and variant != "softmax":
        raise ValueError(f"variant: unknown {variant!r}; expected one of {', '.join(map(str, VARIANTS))} or 'softmax'")
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    v = randn(B, T, H, D)
    g = beta = None
    if variant == "softmax":
        q, k = randn(B, T, H, D), randn(B, T, H, D)
    elif RULE_OF[variant] in ("accumulate", "gated"):
        q, k = F.elu(randn(B, T, H, D)) + 1, F.elu(randn(B, T, H, D)) + 1
    else:
        q, k = randn(B, T, H, D), F.normalize(randn(B, T, H, D), dim=-1)
        beta = torch.sigmoid(randn(B, T, H))
    if variant == "gated_channel":
        g = F.logsigmoid(randn(B, T, H, D) + 4.0)  # alpha around 0.98: memory of ~50 tokens
    elif variant in ("gated_head", "gated_delta"):
        g = F.logsigmoid(randn(B, T, H) + 4.0)
    inp = Inputs(variant, q, k, v, g, beta)
    if grad:
        for x in inp.leaves():
            x.requires_grad_(True)
    return inp


def linattn_call(form: str, backend: str = "torch") -> Callable[[Inputs], torch.Tensor]:
    """linattn's ``form`` for the variant of the inputs, with the benchmark's fixed settings. ``backend="torch"``
    times the torch form itself ("auto" would pick the compiled kernel); ``"cpu"`` the compiled kernel."""

    def call(inp: Inputs) -> torch.Tensor:
        o, _ = linattn.linear_attention(
            inp.q, inp.k, inp.v, rule=RULE_OF[inp.variant], form=form, g=inp.g, beta=inp.beta, eps=EPS,
            backend=backend,
        )
        return o

    return call


def sdpa(inp: Inputs) -> torch.Tensor:
    """Causal softmax attention (the reference point, not the same function): torch's fused kernel."""
    q, k, v = _heads_first(inp.q, inp.k, inp.v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def _heads_first(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.transpose(1, 2) for x in xs]


def _need_multiple(T: int, m: int, who: str) -> None:
    if T % m:
        raise SkipCase(f"{who} needs T to be a multiple of {m}, got T={T}")


# --- adapters: (peer function, inputs) -> o [B, T, H, Dv] -------------------------------------------------------


def _fla_chunk_linear(fn, inp: Inputs) -> torch.Tensor:
    _need_multiple(inp.q.shape[1], 64, "naive_chunk_linear_attn")  # its chunk size is fixed at 64, no padding
    o = fn(inp.q, inp.k, inp.v, normalize=True)  # [B, T, H, D]; adds 1e-10 to the denominator
    return o[0] if isinstance(o, tuple) else o


def _fla_recurrent_linear(fn, inp: Inputs) -> torch.Tensor:
    return fn(inp.q, inp.k, inp.v, normalize=True)[0]


def _fla_delta_chunk(fn, inp: Inputs) -> torch.Tensor:
    _need_multiple(inp.q.shape[1], 32, "delta_rule_chunkwise")  # default chunk_size=32 and asserts divisibility
    q, k, v, beta = _heads_first(inp.q, inp.k, inp.v, inp.beta)  # this peer wants [B, H, T, D]
    return fn(q, k, v, beta)[0].transpose(1, 2)


def _fla_delta_recurrent(fn, inp: Inputs) -> torch.Tensor:
    q, k, v, beta = _heads_first(inp.q, inp.k, inp.v, inp.beta)
    return fn(q, k, v, beta)[0].transpose(1, 2)


def _fla_gdr_chunk(fn, inp: Inputs) -> torch.Tensor:
    return fn(inp.q, inp.k, inp.v, inp.g, inp.beta)[0]


def _fla_gdr_recurrent(fn, inp: Inputs) -> torch.Tensor:
    return fn(inp.q, inp.k, inp.v, inp.beta, inp.g)[0]  # note the order: beta before g


def _hf_gdr_chunk(fn, inp: Inputs) -> torch.Tensor:
    return fn(inp.q, inp.k, inp.v, inp.g, inp.beta)[0]  # scales q by D**-0.5 itself; no q/k L2 norm by default


@dataclass(frozen=True)
class Peer:
    """One peer function. ``unwrap``: call the plain function under decorators. HF wraps
    ``torch_chunk_gated_delta_rule`` so that, once flash-linear-attention is installed, it dispatches to fla's
    Triton kernel, which cannot run on a CPU; the pure-torch fallback is the function it wraps."""

    name: str
    module: str
    attr: str
    variant: str
    form: str
    adapter: Callable[[Callable, Inputs], torch.Tensor]
    distribution: str
    unwrap: bool = False
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def load(self) -> Callable[[Inputs], torch.Tensor]:
        """The ready-to-call implementation; raises ImportError (with the pip hint) if the peer is missing."""
        if "fn" not in self._cache:
            try:
                with warnings.catch_warnings():  # fla warns that Triton cannot run here; expected on a CPU
                    warnings.simplefilter("ignore")
                    fn = getattr(importlib.import_module(self.module), self.attr)
            except Exception as exc:  # a broken optional dependency (e.g. no triton) counts as missing too
                raise ImportError(
                    f"{self.module}.{self.attr} unavailable ({type(exc).__name__}: {exc}); "
                    f"pip install {self.distribution} (or linattn[peers])"
                ) from exc
            if self.unwrap:
                fn = inspect.unwrap(fn)
            self._cache["fn"] = fn
        fn = self._cache["fn"]
        return lambda inp: self.adapter(fn, inp)


FLA = "flash-linear-attention"
PEERS: tuple[Peer, ...] = (
    Peer("fla.naive_chunk_linear_attn", "fla.ops.linear_attn.naive", "naive_chunk_linear_attn",
         "accumulate", "chunk", _fla_chunk_linear, FLA),
    Peer("fla.delta_rule_chunkwise", "fla.ops.delta_rule.naive", "delta_rule_chunkwise",
         "delta", "chunk", _fla_delta_chunk, FLA),
    Peer("fla.naive_chunk_gated_delta_rule", "fla.ops.gated_delta_rule.naive", "naive_chunk_gated_delta_rule",
         "gated_delta", "chunk", _fla_gdr_chunk, FLA),
    Peer("hf.torch_chunk_gated_delta_rule", "transformers.models.qwen3_next.modeling_qwen3_next",
         "torch_chunk_gated_delta_rule", "gated_delta", "chunk", _hf_gdr_chunk, "transformers", unwrap=True),
    Peer("fla.naive_recurrent_linear_attn", "fla.ops.linear_attn.naive", "naive_recurrent_linear_attn",
         "accumulate", "recurrent", _fla_recurrent_linear, FLA),
    Peer("fla.delta_rule_recurrence", "fla.ops.delta_rule.naive", "delta_rule_recurrence",
         "delta", "recurrent", _fla_delta_recurrent, FLA),
    Peer("fla.naive_recurrent_gated_delta_rule", "fla.ops.gated_delta_rule.naive", "naive_recurrent_gated_delta_rule",
         "gated_delta", "recurrent", _fla_gdr_recurrent, FLA),
)


def crosscheck(peers: tuple[Peer, ...], *, B: int = 2, T: int = 128, H: int = 2, D: int = 32,
               tol: float = 1e-3) -> list[dict]:
    """Each peer against linattn's same form on one small case: max |o_peer - o_linattn| / max(1, max |o|).

    ``status`` is ``match`` (below ``tol``), ``MISMATCH``, ``not installed`` or ``error``; a mismatch means the
    speed ratio compares different functions and the report says so.
    """
    rows = []
    for peer in peers:
        row = {"peer": peer.name, "variant": peer.variant, "form": peer.form, "shape": {"B": B, "T": T, "H": H, "D": D},
               "max_abs_diff": None, "rel_diff": None, "tol": tol}
        try:
            fn = peer.load()
        except ImportError as exc:
            rows.append({**row, "status": "not installed", "reason": str(exc)})
            continue
        try:
            inp = make_inputs(peer.variant, B, T, H, D, seed=1)
            with torch.no_grad():
                ours, theirs = linattn_call(peer.form)(inp), fn(inp)
            if theirs.shape != ours.shape:
                raise ValueError(f"peer output shape {tuple(theirs.shape)} != linattn {tuple(ours.shape)}")
            diff = float((theirs.float() - ours.float()).abs().max())
            rel = diff / max(1.0, float(ours.abs().max()))
            rows.append({**row, "max_abs_diff": diff, "rel_diff": rel, "status": "match" if rel <= tol else "MISMATCH"})
        except Exception as exc:
            rows.append({**row, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]})
    return rows
