"""``linattn perf --device cuda``: linattn's Triton chunk kernels against flash-linear-attention's, on one GPU.

For each shape (fla's published B=1, T=8192, H=96, D=128 and B=2, T=16384, H=16, D=128; linattn bench's largest
size B=1, T=8192, H=8, D=64) and each variant (accumulate, gated per head, gated per key channel, delta, gated delta) it
times, forward and forward+backward, bfloat16:

* ``linattn.triton``: the public ``linattn.linear_attention(..., backend="triton", normalize=False)``;
* fla's Triton chunk function of the same rule (``chunk_linear_attn``, ``chunk_simple_gla``, ``chunk_gla``,
  ``chunk_delta_rule``, ``chunk_gated_delta_rule``), called so that it computes the same function;
* causal ``scaled_dot_product_attention`` (FlashAttention on the device) once per shape, as the softmax point;

next to the device's bfloat16 matmul rate and copy bandwidth measured in the same run. Before any timing, every
implementation's output and gradients at a small shape are compared with linattn's torch chunk form in float64.
Times are CUDA events around a batch of calls after a warmup, and per-call events for the median; peak memory
from ``torch.cuda.max_memory_allocated``. A case that fails is recorded with its error; cases not started within
``budget_s`` are recorded as skipped. Work counts are `linattn.tools.perf.work.rule_flops`/``sdpa_flops``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import torch
import torch.nn.functional as F

import linattn
from linattn.tools.harness import machine
from linattn.tools.harness.timer import synchronize, time_batch, time_call, time_turns
from linattn.tools.perf import peers as pp
from linattn.tools.perf.cuda_report import LINATTN, SDPA, attach_ratios
from linattn.tools.perf.work import rule_flops, sdpa_flops, select

SCHEMA = "linattn.perf_cuda/1"
FLA = {"accumulate": "fla.chunk_linear_attn", "gated_head": "fla.chunk_simple_gla", "gated_channel": "fla.chunk_gla",
       "delta": "fla.chunk_delta_rule", "gated_delta": "fla.chunk_gated_delta_rule"}
ASSUMED_TFLOPS = 50.0  # for the dry run's estimate only: a tenth of an H100's dense bfloat16 rate


class NoCudaDevice(RuntimeError):
    """``--device cuda`` on a machine where torch sees no CUDA device (or where the Triton interpreter is on)."""


@dataclass(frozen=True)
class CudaConfig:
    """What one CUDA run measures. Shapes are (B, T, H, D) with Dk = Dv = D."""

    shapes: tuple[tuple[int, int, int, int], ...] = ((1, 8192, 96, 128), (2, 16384, 16, 128), (1, 8192, 8, 64))
    check_shape: tuple[int, int, int, int] = (1, 1000, 8, 64)
    chunk_size: int = 64
    warmup: int = 2
    repeats: int = 10  # timed calls per forward case; forward+backward cases take half (at least 3)
    samples: int = 10  # single calls timed one by one for the median
    budget_s: float = 200.0  # cases not started within this many seconds are skipped
    max_call_s: float = 2.0  # a case whose warmup call takes longer than this is timed on that call alone
    matmul_n: int = 8192
    copy_numel: int = 1 << 29  # 1 GiB of bfloat16 per side
    quick: bool = False


FULL = CudaConfig()
QUICK = CudaConfig(shapes=((1, 256, 2, 32), (2, 200, 3, 16)), check_shape=(1, 100, 2, 16), warmup=1, repeats=2,
                   samples=2, budget_s=60.0, matmul_n=512, copy_numel=1 << 20, quick=True)


@dataclass(frozen=True)
class CudaCase:
    name: str  # e.g. "fwdbwd/gated_delta/linattn.triton/B1_T8192_H96_D128"
    group: str  # "fwd" or "fwdbwd"
    variant: str  # one of perf_peers.VARIANTS, or "softmax"
    impl: str  # LINATTN, an FLA name or SDPA
    shape: tuple[int, int, int, int]
    flops: int


def plan(cfg: CudaConfig = FULL) -> list[CudaCase]:
    """Every case in execution order: per shape, SDPA, then per variant linattn and fla side by side, forward
    before forward+backward (so one implementation's compile or autotuning never sits between the other's)."""
    cases = []
    for B, T, H, D in cfg.shapes:
        tag = f"B{B}_T{T}_H{H}_D{D}"
        for group in ("fwd", "fwdbwd"):
            back = group == "fwdbwd"
            cases.append(CudaCase(f"{group}/softmax/{SDPA}/{tag}", group, "softmax", SDPA, (B, T, H, D),
                                  sdpa_flops(B, T, H, D, backward=back)))
        for variant in pp.VARIANTS:
            for group in ("fwd", "fwdbwd"):
                fl = rule_flops(variant, B, T, H, D, D, backward=group == "fwdbwd")
                for impl in (LINATTN, FLA[variant]):
                    cases.append(CudaCase(f"{group}/{variant}/{impl}/{tag}", group, variant, impl, (B, T, H, D), fl))
    return cases


def estimate(cases: list[CudaCase], cfg: CudaConfig, tflops: float = ASSUMED_TFLOPS) -> dict[str, float]:
    """Seconds of timed calls if every call ran at ``tflops`` (compilation and fla's autotuning not included:
    they are what ``budget_s`` bounds)."""
    calls = {"fwd": cfg.warmup + cfg.repeats + cfg.samples, "fwdbwd": cfg.warmup + max(3, cfg.repeats // 2)
             + cfg.samples}
    timed_s = sum(c.flops / (tflops * 1e12) * calls[c.group] for c in cases)
    return {"assumed_tflops": tflops, "timed_calls_s": timed_s, "budget_s": cfg.budget_s}


# --- inputs and implementations ------------------------------------------------------------------------------------


def make_inputs(variant: str, B: int, T: int, H: int, D: int, device: str, dtype: torch.dtype,
                seed: int = 0) -> pp.Inputs:
    """Inputs in ``[B, T, H, D]`` as leaves that require grad: positive features for accumulate and gated,
    unit keys and beta in (0, 1) for the delta rules, log-gates near 0.95 (perf_peers.make_inputs, on the device)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    g = beta = None
    if variant == "softmax":
        q, k = rnd(B, T, H, D), rnd(B, T, H, D)
    elif pp.RULE_OF[variant] in ("accumulate", "gated"):
        q, k = F.elu(rnd(B, T, H, D)) + 1, F.elu(rnd(B, T, H, D)) + 1
    else:
        q, k = rnd(B, T, H, D), F.normalize(rnd(B, T, H, D), dim=-1)
        beta = torch.sigmoid(rnd(B, T, H))
    v = rnd(B, T, H, D)
    if variant == "gated_channel":
        g = F.logsigmoid(rnd(B, T, H, D) + 4.0)
    elif variant in ("gated_head", "gated_delta"):
        g = F.logsigmoid(rnd(B, T, H) + 4.0)

    def leaf(x):
        return None if x is None else x.to(dtype).requires_grad_()

    return pp.Inputs(variant, leaf(q), leaf(k), leaf(v), leaf(g), leaf(beta))


def linattn_fn(chunk_size: int, backend: str = "triton") -> Callable[[pp.Inputs], torch.Tensor]:
    """The public API on the Triton kernels, unnormalized (the function fla computes), scale D**-0.5."""

    def call(inp: pp.Inputs) -> torch.Tensor:
        o, _ = linattn.linear_attention(inp.q, inp.k, inp.v, rule=pp.RULE_OF[inp.variant], g=inp.g, beta=inp.beta,
                                        normalize=False, chunk_size=chunk_size, backend=backend)
        return o

    return call


def fla_fn(variant: str) -> Callable[[pp.Inputs], torch.Tensor]:
    """fla's Triton chunk function for ``variant`` in its own [B, T, H, D] layout, the same scale, unnormalized."""
    if variant == "accumulate":
        from fla.ops.linear_attn import chunk_linear_attn

        return lambda x: chunk_linear_attn(x.q, x.k, x.v, scale=x.q.shape[-1] ** -0.5, normalize=False)[0]
    if variant == "gated_channel":
        from fla.ops.gla import chunk_gla

        return lambda x: chunk_gla(x.q, x.k, x.v, x.g, scale=x.q.shape[-1] ** -0.5)[0]
    if variant == "gated_head":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda x: chunk_simple_gla(x.q, x.k, x.v, x.g, scale=x.q.shape[-1] ** -0.5)[0]
    if variant == "delta":
        from fla.ops.delta_rule import chunk_delta_rule

        return lambda x: chunk_delta_rule(x.q, x.k, x.v, x.beta, scale=x.q.shape[-1] ** -0.5)[0]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return lambda x: chunk_gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, scale=x.q.shape[-1] ** -0.5)[0]


def impl_fn(impl: str, variant: str, cfg: CudaConfig) -> Callable[[pp.Inputs], torch.Tensor]:
    if impl == LINATTN:
        return linattn_fn(cfg.chunk_size)
    if impl == SDPA:
        return pp.sdpa
    return fla_fn(variant)


# --- measurement ---------------------------------------------------------------------------------------------------


def timed(fn: Callable[[], object], cfg: CudaConfig, repeats: int, device: str) -> dict[str, Any]:
    """Through the harness timer: warmup (the first call compiles, timed apart), a batch of ``repeats`` calls for
    the mean, then ``cfg.samples`` single calls for the median; a call slower than ``max_call_s`` is timed once.
    Peak memory above what was allocated before."""
    first = time_call(fn, repeats=1, warmup=cfg.warmup, device=device)  # warm-up, then one timed call
    if device == "cuda":
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    if first.first_call_s > cfg.max_call_s:
        ms = first.median_s * 1e3
        out = {"mean_ms": ms, "median_ms": ms, "calls": 1, "first_call_s": first.first_call_s}
    else:
        mean_s, _, _ = time_batch(fn, repeats, device=device)
        singles = time_turns([fn], repeats=cfg.samples, device=device)[0]
        out = {"mean_ms": mean_s * 1e3, "median_ms": singles.median_s * 1e3, "calls": repeats + cfg.samples,
               "first_call_s": first.first_call_s}
    synchronize(device)
    out["peak_extra_bytes"] = int(torch.cuda.max_memory_allocated() - before) if device == "cuda" else None
    return out


def _call(fn: Callable[[pp.Inputs], torch.Tensor], inp: pp.Inputs, backward: bool, device: str):
    if not backward:
        def fwd():
            with torch.no_grad():
                return fn(inp)
        return fwd
    gen = torch.Generator(device=device).manual_seed(2)
    grad_o = torch.randn(inp.v.shape, generator=gen, device=device, dtype=inp.v.dtype)
    leaves = inp.leaves()
    return lambda: torch.autograd.grad(fn(inp), leaves, grad_o)


def machine_rates(cfg: CudaConfig, device: str) -> dict[str, Any]:
    """bfloat16 matmul (n x n x n, TFLOP/s) and copy bandwidth (read + write bytes over time, GB/s)."""
    mm = machine.matmul_rate(cfg.matmul_n, dtype="bfloat16", device=device, repeats=cfg.samples)
    cp = machine.copy_bandwidth(cfg.copy_numel, dtype="bfloat16", device=device, repeats=cfg.samples)
    return {"matmul": {"n": mm["n"], "median_ms": mm["median_ms"], "tflops": mm["gflops"] / 1e3},
            "copy": {"bytes_per_side": cp["bytes_per_side"], "median_ms": cp["median_ms"], "gbps": cp["gbps"]}}


def crosscheck(cfg: CudaConfig, device: str, impls: Callable = impl_fn) -> list[dict[str, Any]]:
    """Output and gradient errors of every implementation at ``check_shape`` (bfloat16 inputs) against linattn's
    torch chunk form in float64 on the same values: max |x - ref| / max(1, max |ref|)."""
    B, T, H, D = cfg.check_shape
    rows = []
    for variant in pp.VARIANTS:
        x = make_inputs(variant, B, T, H, D, device, torch.bfloat16, seed=1)
        x64 = pp.Inputs(variant, *(None if t is None else t.detach().double().requires_grad_()
                                   for t in (x.q, x.k, x.v, x.g, x.beta)))
        ref = linattn_fn(cfg.chunk_size, backend="torch")(x64)
        grad_o = torch.randn(ref.shape, generator=torch.Generator(device=device).manual_seed(3), device=device,
                             dtype=torch.float64)
        ref_grads = torch.autograd.grad(ref, x64.leaves(), grad_o)

        def err(a, b):
            a, b = a.detach().double(), b.detach()
            return float((a - b).abs().max() / b.abs().max().clamp_min(1))

        row: dict[str, Any] = {"variant": variant, "shape": list(cfg.check_shape),
                               "reference": "linattn torch chunk form, float64, the same bfloat16-rounded inputs"}
        for impl in (LINATTN, FLA[variant]):
            try:
                o = impls(impl, variant, cfg)(x)
                grads = torch.autograd.grad(o, x.leaves(), grad_o.to(o.dtype))
                row[impl] = {"out_max_rel_err": err(o, ref),
                             "grad_max_rel_err": max(err(a, b) for a, b in zip(grads, ref_grads, strict=True))}
            except Exception as exc:  # recorded, the run goes on
                row[impl] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        rows.append(row)
    return rows


def blank(case: CudaCase, status: str = "ok", reason: str | None = None) -> dict[str, Any]:
    """A case's result row before (or instead of) measuring it."""
    return {"name": case.name, "group": case.group, "variant": case.variant, "impl": case.impl,
            "shape": dict(zip("BTHD", case.shape, strict=True)), "flops": case.flops, "status": status,
            "reason": reason, "median_ms": None, "mean_ms": None, "tflops": None, "frac_matmul": None,
            "peak_extra_bytes": None}


def run_case(case: CudaCase, cfg: CudaConfig, device: str, impls: Callable = impl_fn) -> dict[str, Any]:
    B, T, H, D = case.shape
    res = blank(case)
    try:
        fn = impls(case.impl, case.variant, cfg)
        inp = make_inputs(case.variant, B, T, H, D, device, torch.bfloat16)
        backward = case.group == "fwdbwd"
        m = timed(_call(fn, inp, backward, device), cfg, max(3, cfg.repeats // 2) if backward else cfg.repeats,
                  device)
    except Exception as exc:  # an implementation that fails at this shape is a result, not the end of the run
        return {**res, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    res.update(median_ms=m["median_ms"], mean_ms=m["mean_ms"], calls=m["calls"], first_call_s=m["first_call_s"],
               peak_extra_bytes=m["peak_extra_bytes"], tflops=case.flops / m["median_ms"] / 1e9)
    return res


def require_cuda() -> None:
    """Raise `NoCudaDevice` unless torch sees a CUDA device and the kernels would run compiled."""
    if not torch.cuda.is_available():
        raise NoCudaDevice("--device cuda: no CUDA device is present (torch.cuda.is_available() is False); run it "
                           "on a CUDA machine, or leave out --device for the CPU benchmark")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise NoCudaDevice("--device cuda: TRITON_INTERPRET=1 is set, which would time Triton's interpreter; unset it")


def run(cfg: CudaConfig = FULL, *, only: tuple[str, ...] = (), device: str = "cuda", impls: Callable = impl_fn,
        progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure the selected cases and return the result document (``device`` other than "cuda" and ``impls``
    are for tests of this code on a CPU)."""
    if device == "cuda":
        require_cuda()
    start = time.perf_counter()
    cases = select(plan(cfg), only)
    rates = machine_rates(cfg, device)
    checks = crosscheck(cfg, device, impls)
    results = []
    for case in cases:
        if progress:
            progress(case.name)
        if time.perf_counter() - start > cfg.budget_s:
            results.append(blank(case, "skipped", f"run budget of {cfg.budget_s:g} s used up"))
            continue
        res = run_case(case, cfg, device, impls)
        if res["tflops"] is not None:
            res["frac_matmul"] = res["tflops"] / rates["matmul"]["tflops"]
        results.append(res)
    attach_ratios(results)
    import triton  # installed wherever the Triton kernels ran

    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {k: ([list(s) for s in v] if k == "shapes" else list(v) if isinstance(v, tuple) else v)
                   for k, v in asdict(cfg).items()},
        "only": list(only),
        "environment": {"device": torch.cuda.get_device_name() if device == "cuda" else device,
                        "cuda": torch.version.cuda, "triton": triton.__version__, "dtype": "bfloat16",
                        "versions": machine.versions()},
        "machine": rates,
        "crosscheck": checks,
        "cases": results,
        "estimate": estimate(cases, cfg),
        "elapsed_s": time.perf_counter() - start,
    }
