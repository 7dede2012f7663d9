"""``linattn perf``: CPU kernel benchmark, linattn against its peers and the machine's own rates, in one run.

Times linattn's ``chunk`` forward and forward+backward for five variants (accumulate, gated per head, gated per
channel, delta, gated delta), its ``recurrent`` form and its decode ``step``, next to flash-linear-attention's and
HF transformers' pure-torch functions (when installed) and causal ``scaled_dot_product_attention``, and next to the
float32 matmul rate and copy bandwidth measured in the same run. Writes JSON and a Markdown table and evaluates
the targets of issue 5 (judged and rendered in :mod:`linattn.tools.perf.report`). Counts: docs/perf.md.
"""

from __future__ import annotations

import fnmatch
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import torch
from tqdm import tqdm

import linattn
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness.machine import BusyMeter, cpu_peak_bytes
from linattn.tools.harness.results import atomic_write, write_result
from linattn.tools.perf import peers as pp
from linattn.tools.perf.report import attach_ratios, evaluate_targets, render_markdown

SCHEMA = "linattn.perf/1"
CPU_IMPL = "linattn.cpu"  # impl name of the compiled CPU kernels (backend="cpu"); "linattn" is the torch form
CHUNK_FLOPS = 64  # the chunk length written into the fixed FLOP counts, whatever chunk size a kernel uses


@dataclass(frozen=True)
class PerfConfig:
    """What one run measures. ``target``/``long`` are the (B, T) shapes the issue's targets are judged at."""

    H: int = 8
    D: int = 64
    seq_shapes: tuple[tuple[int, int], ...] = ((1, 2048), (1, 8192), (1, 32768), (8, 2048))
    recurrent_shapes: tuple[tuple[int, int], ...] = ((1, 2048),)  # token loops: T=2048 only, they are slow
    decode_batches: tuple[int, ...] = (1, 64)
    target: tuple[int, int] = (1, 8192)
    long: tuple[int, int] = (1, 32768)
    repeats: int = 5
    min_sample_s: float = 0.02  # a sample repeats a fast call until it lasts this long (timer resolution, noise)
    case_budget_s: float = 3.0  # slow cases take fewer samples (at least one) to stay within this
    max_call_s: float = 8.0  # skip a case whose time projected from a shorter T exceeds this per call
    budget_s: float = 540.0  # cases not started within this many seconds are skipped (the run stays < 10 min)
    matmul_n: int = 2048
    copy_numel: int = 1 << 26  # 256 MiB float32 per side
    memory: bool = True
    quick: bool = False


FULL = PerfConfig()
QUICK = PerfConfig(
    H=2, D=16, seq_shapes=((1, 128), (1, 512), (2, 128)), recurrent_shapes=((1, 128),), decode_batches=(1, 4),
    target=(1, 128), long=(1, 512), repeats=2, min_sample_s=0.002, case_budget_s=0.5, max_call_s=2.0, budget_s=120.0,
    matmul_n=256, copy_numel=1 << 20, quick=True,
)


# --- fixed work counts (docs/perf.md) ----------------------------------------------------------------------------


def rule_flops(variant: str, B: int, T: int, H: int, Dk: int, Dv: int, *, backward: bool = False) -> int:
    """One fixed FLOP count per rule, the same for every form and every implementation of it.

    accumulate and gated (gates are elementwise, not counted): ``B*T*H*(4*Dk*Dv + 2*64*(Dk+Dv))`` — per token the
    state read and write (2*Dk*Dv each) plus the intra-chunk scores and their product with V over 64 tokens.
    delta and gated delta: ``B*T*H*(6*Dk*Dv + 2*64*(3*Dk + 2*Dv))`` — the state is also read to predict v
    (W S), and the chunk builds K K^T and applies the WY transform to K and V (the 64x64 inverse is not counted).
    Forward+backward counts three times the forward.
    """
    if variant not in pp.VARIANTS:
        raise ValueError(f"variant: unknown {variant!r}; expected one of {list(pp.VARIANTS)}")
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
    per_head = (6 if pp.RULE_OF[variant] in ("delta", "gated_delta") else 4) * Dk * Dv
    return B * H * per_head


def decode_bytes(variant: str, B: int, H: int, Dk: int, Dv: int, elem: int = 4) -> int:
    """Bytes one decode step must move at least: the state read once and written once (S, plus z as one more
    value column when normalized), and the token's q, k, v, o, gate and beta."""
    rule = pp.RULE_OF[variant]
    state = B * H * Dk * (Dv + (1 if rule in ("accumulate", "gated") else 0))
    token = B * H * (2 * Dk + 2 * Dv)
    extra = {"gated_channel": B * H * Dk, "gated_head": B * H, "gated_delta": 2 * B * H, "delta": B * H}
    token += extra.get(variant, 0)
    return (2 * state + token) * elem


# --- cases ---------------------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    group: str
    variant: str  # one of pp.VARIANTS, or "softmax"
    impl: str  # "linattn", "torch.sdpa" or a peer name
    B: int
    T: int | None
    setup: Callable[[], Callable[[], object]]  # builds inputs (untimed), returns the call to time
    flops: int
    bytes_moved: int | None = None
    exponent: int = 1  # how time grows with T, for projecting from a shorter run
    peer: pp.Peer | None = None


def _seq_call(impl: Callable[[pp.Inputs], torch.Tensor], variant: str, B: int, T: int, H: int, D: int,
              backward: bool) -> Callable[[], Callable[[], object]]:
    def setup() -> Callable[[], object]:
        inp = pp.make_inputs(variant, B, T, H, D, grad=backward)
        if not backward:
            return lambda: impl(inp)
        grad_o = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(2))
        leaves = inp.leaves()
        return lambda: torch.autograd.grad(impl(inp), leaves, grad_o)

    return setup


def _decode_call(variant: str, B: int, H: int, D: int, backend: str = "torch") -> Callable[[], Callable[[], object]]:
    def setup() -> Callable[[], object]:
        full = pp.make_inputs(variant, B, 1, H, D)
        q, k, v = (x[:, 0] for x in (full.q, full.k, full.v))
        kw = dict(rule=pp.RULE_OF[variant], g=None if full.g is None else full.g[:, 0],
                  beta=None if full.beta is None else full.beta[:, 0], eps=pp.EPS, backend=backend)
        state = [linattn.step(q, k, v, None, **kw)[1]]  # allocate the state once, then update it in place

        def call() -> None:
            state[0] = linattn.step(q, k, v, state[0], inplace=True, **kw)[1]

        return call

    return setup


def build_cases(cfg: PerfConfig, peers: tuple[pp.Peer, ...] | None = None) -> list[Case]:
    """Every case of a run in execution order: decode and recurrent (short), then the sequence shapes by number
    of tokens, forward before forward+backward. Shorter T runs first so longer ones can be projected and capped,
    and a run that reaches its time budget loses only its longest cases."""
    peers = pp.PEERS if peers is None else peers
    H, D = cfg.H, cfg.D
    cases: list[Case] = []
    for B in cfg.decode_batches:
        for variant in pp.VARIANTS:
            for impl, backend in (("linattn", "torch"), (CPU_IMPL, "cpu")):
                cases.append(Case(f"decode/{variant}/{impl}/B{B}", "decode", variant, impl, B, None,
                                  _decode_call(variant, B, H, D, backend), decode_flops(variant, B, H, D, D),
                                  bytes_moved=decode_bytes(variant, B, H, D, D)))

    def sequence_cases(group: str, form: str, B: int, T: int, backward: bool) -> None:
        for variant in pp.VARIANTS:
            fl = rule_flops(variant, B, T, H, D, D, backward=backward)
            impls = [("linattn", pp.linattn_call(form), None)]
            if form == "chunk":  # the compiled token loop (issue 12), with its compiled backward in fwdbwd
                impls.append((CPU_IMPL, pp.linattn_call(form, backend="cpu"), None))
            impls += [(p.name, _lazy(p), p) for p in peers if p.form == form and p.variant == variant]
            for impl, fn, peer in impls:
                cases.append(Case(f"{group}/{variant}/{impl}/B{B}_T{T}", group, variant, impl, B, T,
                                  _seq_call(fn, variant, B, T, H, D, backward), fl, peer=peer))

    for B, T in cfg.recurrent_shapes:
        sequence_cases("recurrent", "recurrent", B, T, False)
    for B, T in sorted(cfg.seq_shapes, key=lambda s: (s[0] * s[1], s[0])):
        for group, backward in (("fwd", False), ("fwdbwd", True)):
            sequence_cases(group, "chunk", B, T, backward)
            cases.append(Case(f"{group}/softmax/torch.sdpa/B{B}_T{T}", group, "softmax", "torch.sdpa", B, T,
                              _seq_call(pp.sdpa, "softmax", B, T, H, D, backward),
                              sdpa_flops(B, T, H, D, backward=backward), exponent=2))
    return cases


def _lazy(peer: pp.Peer) -> Callable[[pp.Inputs], torch.Tensor]:
    """Import the peer on first call (inside the case, so a missing peer fails that case only)."""
    return lambda inp: peer.load()(inp)


def select(cases: list[Case], only: tuple[str, ...]) -> list[Case]:
    """Cases whose name matches any pattern (fnmatch; a pattern without wildcards matches as a substring)."""
    if not only:
        return cases
    pats = [p if any(c in p for c in "*?[") else f"*{p}*" for p in only]
    chosen = [c for c in cases if any(fnmatch.fnmatchcase(c.name, p) for p in pats)]
    if not chosen:
        raise ValueError(f"only: no case matches {list(only)}; names look like {cases[0].name!r} (see --list)")
    return chosen


# --- measurement ---------------------------------------------------------------------------------------------------


def _measure(fn: Callable[[], object], repeats: int, min_sample_s: float, budget_s: float) -> dict[str, Any]:
    """Median seconds per call. The first call warms up (and sizes the samples); fast calls are repeated inside a
    sample so that one sample lasts ``min_sample_s``; slow calls get fewer samples, at least one."""
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    inner = max(1, math.ceil(min_sample_s / max(warm, 1e-7)))
    n = max(1, min(repeats, int(budget_s // max(warm * inner, 1e-9))))
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples": n, "calls_per_sample": inner,
            "warmup_s": warm}


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes held by torch's CPU allocator during one call, above what was live before it (inputs excluded,
    outputs and autograd buffers included); see linattn.tools.harness.machine."""
    return cpu_peak_bytes(fn) or 0


def machine_rates(cfg: PerfConfig, state_numel: int) -> dict[str, Any]:
    """float32 matmul rate (n x n, median) and copy bandwidth (read + write bytes over time), large and at the
    size of the largest decode state (which may sit in cache)."""
    n = cfg.matmul_n
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.empty(n, n)
    mm = _measure(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), max(cfg.repeats, 5), cfg.min_sample_s, 10.0)
    out = {"matmul": {"n": n, "median_ms": mm["median_s"] * 1e3, "gflops": 2 * n**3 / mm["median_s"] / 1e9}}
    del a, b, c
    for key, numel in (("copy", cfg.copy_numel), ("copy_state_size", state_numel)):
        src = torch.ones(numel)
        dst = torch.empty_like(src)
        cp = _measure(lambda d=dst, s=src: d.copy_(s), max(cfg.repeats, 5), cfg.min_sample_s, 10.0)
        nbytes = 2 * src.numel() * src.element_size()
        out[key] = {"bytes_per_side": nbytes // 2, "median_ms": cp["median_s"] * 1e3,
                    "gbps": nbytes / cp["median_s"] / 1e9}
        del src, dst
    return out


def _run_case(case: Case, cfg: PerfConfig, history: dict, rates: dict, elapsed_s: float) -> dict[str, Any]:
    res: dict[str, Any] = {
        "name": case.name, "group": case.group, "variant": case.variant, "impl": case.impl,
        "shape": {"B": case.B, "T": case.T, "H": cfg.H, "D": cfg.D}, "flops": case.flops,
        "bytes_moved": case.bytes_moved, "status": "ok", "reason": None, "median_ms": None, "min_ms": None,
        "samples": 0, "tokens_per_s": None, "gflops": None, "frac_matmul": None, "gbps": None, "frac_copy": None,
        "peak_mem_bytes": None,
    }
    if case.peer is not None:
        try:
            case.peer.load()
        except ImportError as exc:
            return {**res, "status": "not installed", "reason": str(exc)}
    if elapsed_s > cfg.budget_s:
        return {**res, "status": "skipped", "reason": f"run budget of {cfg.budget_s:g} s used up"}
    key = (case.group, case.variant, case.impl, case.B)
    if case.T is not None and key in history:
        T0, s0 = history[key]
        projected = s0 * (case.T / T0) ** case.exponent
        if projected > cfg.max_call_s:
            return {**res, "status": "skipped", "reason": (
                f"projected {projected:.1f} s per call from {s0 * 1e3:.0f} ms at T={T0} exceeds max_call_s="
                f"{cfg.max_call_s:g}")}
    gc.collect()
    try:
        fn = case.setup()
        m = _measure(fn, cfg.repeats, cfg.min_sample_s, cfg.case_budget_s)
        if cfg.memory:
            try:
                res["peak_mem_bytes"] = peak_bytes(fn)
            except Exception as exc:  # e.g. a torch whose profiler lacks memory events: keep the timing
                res["memory_error"] = f"{type(exc).__name__}: {exc}"[:200]
        del fn
    except pp.SkipCase as exc:
        return {**res, "status": "skipped", "reason": str(exc)}
    except Exception as exc:
        return {**res, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:300]}
    s = m["median_s"]
    if case.T is not None:
        history[key] = (case.T, s)
    tokens = case.B * (case.T or 1)
    res.update(median_ms=s * 1e3, min_ms=m["min_s"] * 1e3, samples=m["samples"], calls_per_sample=m["calls_per_sample"],
               tokens_per_s=tokens / s, gflops=case.flops / s / 1e9)
    res["frac_matmul"] = res["gflops"] / rates["matmul"]["gflops"]
    if case.bytes_moved:
        res["gbps"] = case.bytes_moved / s / 1e9
        res["frac_copy"] = res["gbps"] / rates["copy"]["gbps"]
    return res


# --- the run -------------------------------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    out = {}
    for dist in ("torch", "linattn", "flash-linear-attention", "fla-core", "transformers", "triton", "einops", "numba"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(cfg: PerfConfig = FULL, *, only: tuple[str, ...] = (), peers: tuple[pp.Peer, ...] | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Measure everything selected and return the result document (see docs/perf.md for each field)."""
    start = time.perf_counter()
    peers = pp.PEERS if peers is None else peers
    load_before = os.getloadavg()
    busy = BusyMeter().start()
    cases = select(build_cases(cfg, peers), only)
    used = {c.peer.name for c in cases if c.peer is not None}
    checks = pp.crosscheck(tuple(p for p in peers if p.name in used),
                           **({"T": 64, "D": 16} if cfg.quick else {}))
    state_numel = max(cfg.decode_batches) * cfg.H * cfg.D * (cfg.D + 1)
    rates = machine_rates(cfg, state_numel)
    history: dict = {}
    results = []
    bar = tqdm(cases, desc="linattn perf", unit="case", file=sys.stderr, disable=not progress)
    for case in bar:
        bar.set_postfix_str(case.name)
        results.append(_run_case(case, cfg, history, rates, time.perf_counter() - start))
    bar.close()
    attach_ratios(results)
    wall = time.perf_counter() - start
    others = busy.stop()  # average number of cores that other processes kept busy while this run measured
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {k: (list(map(list, v)) if k.endswith("shapes") else list(v) if isinstance(v, tuple) else v)
                   for k, v in asdict(cfg).items()},
        "only": list(only),
        "environment": {
            "cpu": _cpu_model(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "platform": platform.platform(), "versions": _versions(),
            "loadavg_before": list(load_before), "others_cpu_cores": others,
        },
        "machine": rates,
        "crosscheck": checks,
        "cases": results,
        "targets": evaluate_targets(results, rates, cfg, checks),
        "elapsed_s": wall,
    }


# --- CLI -----------------------------------------------------------------------------------------------------------


def missing_peers(cases: list[Case]) -> dict[str, str]:
    """Peer name -> why it cannot load, for the peers the selected cases use (imports them now, once)."""
    missing = {}
    for peer in dict.fromkeys(c.peer for c in cases if c.peer is not None):
        try:
            peer.load()
        except ImportError as exc:
            missing[peer.name] = str(exc)
    return missing


def peer_warning(cases: list[Case]) -> str | None:
    """The warning printed before measuring when some or all of the peers the cases compare against are missing."""
    used = {c.peer.name for c in cases if c.peer is not None}
    missing = missing_peers(cases)
    if not missing:
        return None
    hint = 'pip install -c constraints.txt ".[peers]"'
    if len(missing) == len(used):
        return (f"warning: no peer is installed ({', '.join(sorted(missing))}); this run times linattn and softmax "
                f"only, with no speedups. Install them first: {hint}")
    return f"warning: peers not installed, their rows will say so: {', '.join(sorted(missing))} ({hint})"


@click.command(name="perf")
@click.option("--output", "output", type=cli_files.FILE, default=None, help="Write the JSON result here.")
@click.option("--markdown", "markdown", type=cli_files.FILE, default=None,
              help="Write the Markdown tables here (they are printed to stdout either way).")
@click.option("--quick", is_flag=True, help="Tiny smoke configuration: checks the tool, measures nothing real.")
@click.option("--only", "only", multiple=True,
              help="Run only cases matching these patterns (fnmatch on names like 'fwd/delta/linattn/B1_T8192'; "
                   "no wildcard = substring). Repeatable or comma-separated.")
@click.option("--repeats", type=click.IntRange(min=1), default=None, help="Timed samples per case (default 5).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch.set_num_threads (default: torch's).")
@click.option("--max-call-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Skip a case projected (from a shorter T) to take longer than this per call (default 8 s).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory pass (one profiled call per case).")
@click.option("--list", "list_only", is_flag=True, help="Print the case names and exit (with --device cuda: a dry "
              "run that needs no GPU, with each case's FLOPs and the time budget).")
@click.option("--overwrite", is_flag=True, help="Replace existing --output/--markdown files.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: linattn's Triton chunk kernels against flash-linear-attention's Triton kernels and SDPA "
                   "on the GPU (linattn.tools.perf.cuda).")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Cases not started within this many seconds are skipped (default 540 on cpu, 200 on cuda).")
def command(output, markdown, quick, only, repeats, threads, max_call_s, no_memory, list_only, overwrite, device,
            budget_s) -> None:
    """Kernel benchmark: linattn vs its peers and softmax, next to the machine's own rates, in one run. CPU by
    default (flash-linear-attention / HF pure-torch peers); --device cuda times the Triton kernels on a GPU."""
    patterns = tuple(p.strip() for arg in only for p in arg.split(",") if p.strip())
    if device == "cuda":
        _cuda_command(output, markdown, quick, patterns, repeats, max_call_s, list_only, overwrite, budget_s)
        return
    cfg = QUICK if quick else FULL
    if budget_s is not None:
        cfg = replace(cfg, budget_s=budget_s)
    changes = {k: v for k, v in (("repeats", repeats), ("max_call_s", max_call_s)) if v is not None}
    cfg = replace(cfg, memory=not no_memory, **changes)
    try:
        cases = select(build_cases(cfg), patterns)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("only: "), param_hint="--only") from None
    if list_only:
        click.echo("\n".join(c.name for c in cases))
        return
    cli_files.check_outputs(overwrite, {"--output": output, "--markdown": markdown})
    warning = peer_warning(cases)  # at the start, not after minutes of measuring
    if warning:
        click.echo(warning, err=True)
    if threads:
        torch.set_num_threads(threads)
    doc = run(cfg, only=patterns)
    text = render_markdown(doc)
    click.echo(text)
    if output:
        cli_files.write("--output", lambda p, overwrite: write_result(doc, p, "perf", overwrite=overwrite), output,
                        overwrite=overwrite)
    if markdown:
        cli_files.write("--markdown", lambda p, overwrite: atomic_write(
            p, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite), markdown, overwrite=overwrite)


def _cuda_command(output, markdown, quick, patterns, repeats, max_call_s, list_only, overwrite, budget_s) -> None:
    """``--device cuda``: plan (``--list`` needs no GPU), refuse clearly without one, measure, write."""
    from linattn.tools.perf import cuda as pc
    from linattn.tools.perf.cuda_report import render_markdown

    cfg = pc.QUICK if quick else pc.FULL
    changes = {k: v for k, v in (("repeats", repeats), ("max_call_s", max_call_s), ("budget_s", budget_s))
               if v is not None}
    cfg = replace(cfg, **changes)
    try:
        cases = select(pc.plan(cfg), patterns)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("only: "), param_hint="--only") from None
    if list_only:
        for c in cases:
            click.echo(f"{c.name}  {c.flops / 1e9:.1f} GFLOP")
        est = pc.estimate(cases, cfg)
        click.echo(f"{len(cases)} cases; timed calls take about {est['timed_calls_s']:.1f} s at an assumed "
                   f"{est['assumed_tflops']:g} TFLOP/s, plus compilation and fla's autotuning; no case starts "
                   f"after {cfg.budget_s:g} s")
        return
    try:
        pc.require_cuda()
    except pc.NoCudaDevice as exc:
        raise click.ClickException(str(exc)) from None
    cli_files.check_outputs(overwrite, {"--output": output, "--markdown": markdown})
    doc = pc.run(cfg, only=patterns, progress=lambda name: click.echo(f"  {name}", err=True))
    text = render_markdown(doc)
    click.echo(text)
    if output:
        cli_files.write("--output", lambda p, overwrite: write_result(doc, p, "perf_cuda", overwrite=overwrite),
                        output, overwrite=overwrite)
    if markdown:
        cli_files.write("--markdown", lambda p, overwrite: atomic_write(
            p, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite), markdown, overwrite=overwrite)
