"""What a ``linattn perf`` run measures and the fixed work it counts: the run's configuration, the FLOP and byte
counts of every case (docs/perf.md), and case selection by name. Shared by the CPU and CUDA runs."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Protocol, TypeVar

from linattn.tools.perf import peers as pp

CHUNK_FLOPS = 64  # the chunk length written into the fixed FLOP counts, whatever chunk size a kernel uses
ELEM = 4  # bytes per element: the CPU runs are float32
CPU_IMPL = "linattn.cpu"  # impl name of the compiled CPU kernels (backend="cpu"); "linattn" is the torch form


@dataclass(frozen=True)
class PerfConfig:
    """What one CPU run measures. ``target``/``long`` are the (B, T) shapes the targets are judged at; each
    thread count in ``threads`` is one pass over every case, with the machine's rates measured again."""

    H: int = 8
    D: int = 64
    seq_shapes: tuple[tuple[int, int], ...] = ((1, 2048), (1, 8192), (1, 32768), (8, 2048))
    recurrent_shapes: tuple[tuple[int, int], ...] = ((1, 2048),)  # token loops: T=2048 only, they are slow
    decode_batches: tuple[int, ...] = (1, 64)
    target: tuple[int, int] = (1, 8192)
    long: tuple[int, int] = (1, 32768)
    threads: tuple[int, ...] = (1, 2)
    repeats: int = 5
    min_sample_s: float = 0.02  # a sample repeats a fast call until it lasts this long (timer resolution, noise)
    case_budget_s: float = 3.0  # slow cases take fewer samples (at least one) to stay within this
    max_call_s: float = 8.0  # skip a case whose time projected from a shorter T exceeds this per call
    budget_s: float = 540.0  # per thread count: cases not started within this many seconds of the pass are skipped
    matmul_n: int = 2048
    copy_numel: int = 1 << 26  # 256 MiB float32 per side
    memory: bool = True
    quick: bool = False


FULL = PerfConfig()
# A smoke run: every implementation once at one small shape, one thread count, no memory pass (seconds, not
# minutes; its numbers mean nothing and no target is judged on them).
QUICK = PerfConfig(
    H=2, D=16, seq_shapes=((1, 128),), recurrent_shapes=((1, 128),), decode_batches=(1,), target=(1, 128),
    long=(1, 128), threads=(1,), repeats=2, min_sample_s=0.001, case_budget_s=0.2, max_call_s=2.0, budget_s=30.0,
    matmul_n=256, copy_numel=1 << 20, memory=False, quick=True,
)


# --- fixed work counts (docs/perf.md) ----------------------------------------------------------------------------


def _check(variant: str, softmax: bool = False) -> None:
    if variant not in pp.VARIANTS and not (softmax and variant == "softmax"):
        raise ValueError(f"variant: unknown {variant!r}; expected one of {', '.join(map(str, pp.VARIANTS))}")


def rule_flops(variant: str, B: int, T: int, H: int, Dk: int, Dv: int, *, backward: bool = False) -> int:
    """One fixed FLOP count per rule, the same for every form and every implementation of it.

    accumulate and gated (gates are elementwise, not counted): ``B*T*H*(4*Dk*Dv + 2*64*(Dk+Dv))`` — per token the
    state read and write (2*Dk*Dv each) plus the intra-chunk scores and their product with V over 64 tokens.
    delta and gated delta: ``B*T*H*(6*Dk*Dv + 2*64*(3*Dk + 2*Dv))`` — the state is also read to predict v
    (W S), and the chunk builds K K^T and applies the WY transform to K and V (the 64x64 inverse is not counted).
    Forward+backward counts three times the forward.
    """
    _check(variant)
    C = CHUNK_FLOPS
    if pp.RULE_OF[variant] in ("delta", "gated_delta"):
        per_token = 6 * Dk * Dv + 2 * C * (3 * Dk + 2 * Dv)
    else:
        per_token = 4 * Dk * Dv + 2 * C * (Dk + Dv)
    return B * T * H * per_token * (3 if backward else 1)


def sdpa_flops(B: int, T: int, H: int, D: int, *, backward: bool = False) -> int:
    """Causal softmax attention: Q K^T and P V over the lower triangle, ``2*B*H*T*T*D`` (x3 with backward)."""
    return 2 * B * H * T * T * D * (3 if backward else 1)


def decode_flops(variant: str, B: int, H: int, Dk: int, Dv: int) -> int:
    """One decode step: write and read the state (4*Dk*Dv), plus the prediction S^T k for the delta rules."""
    _check(variant)
    per_head = (6 if pp.RULE_OF[variant] in ("delta", "gated_delta") else 4) * Dk * Dv
    return B * H * per_head


def _token_extra(variant: str, Dk: int) -> int:
    """Elements of gate and beta per token and head."""
    return {"gated_channel": Dk, "gated_head": 1, "gated_delta": 2, "delta": 1}.get(variant, 0)


def decode_bytes(variant: str, B: int, H: int, Dk: int, Dv: int, elem: int = ELEM) -> int:
    """Bytes one decode step must move at least: the state read once and written once (S, plus z as one more
    value column when normalized), and the token's q, k, v, o, gate and beta."""
    _check(variant)
    rule = pp.RULE_OF[variant]
    state = B * H * Dk * (Dv + (1 if rule in ("accumulate", "gated") else 0))
    token = B * H * (2 * Dk + 2 * Dv + _token_extra(variant, Dk))
    return (2 * state + token) * elem


def seq_bytes(variant: str, B: int, T: int, H: int, Dk: int, Dv: int, *, backward: bool = False,
              elem: int = ELEM) -> int:
    """Bytes a whole-sequence call must move at least: its inputs (q, k, v, gate, beta) read once and o written
    once. Forward+backward adds grad_o read, the inputs read again and their gradients written:
    ``3 * inputs + 2 * o``. ``variant`` may be "softmax" (q, k, v only)."""
    _check(variant, softmax=True)
    extra = 0 if variant == "softmax" else _token_extra(variant, Dk)
    inputs, out = B * T * H * (2 * Dk + Dv + extra), B * T * H * Dv
    return ((3 * inputs + 2 * out) if backward else (inputs + out)) * elem


# --- selection ----------------------------------------------------------------------------------------------------


class Named(Protocol):
    name: str


C = TypeVar("C", bound=Named)


def select(cases: list[C], only: tuple[str, ...]) -> list[C]:
    """Cases whose name matches any pattern (fnmatch; a pattern without wildcards matches as a substring)."""
    if not only:
        return cases
    pats = [p if any(c in p for c in "*?[") else f"*{p}*" for p in only]
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
    if not chosen:
        raise ValueError(f"only: no case matches {', '.join(only)}; names look like {cases[0].name!r} "
                         "(see --list)")
    return chosen
