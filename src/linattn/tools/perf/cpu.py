"""``linattn perf`` on the CPU: linattn's kernels against their peers and the machine's own rates, in one run.

Times linattn's ``chunk`` forward and forward+backward for five variants (accumulate, gated per head, gated per
channel, delta, gated delta), its ``recurrent`` form and its decode ``step``, next to flash-linear-attention's and
HF transformers' pure-torch functions (when installed) and causal ``scaled_dot_product_attention``. Each thread
count is one pass: the float32 matmul rate and the copy bandwidth are measured again at that count, and every
case is reported as a fraction of both; a case run at two thread counts gets its thread-scaling ratio. Judged and
rendered in `linattn.tools.perf.report`; counts in `linattn.tools.perf.work` (docs/perf.md).
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import torch
from tqdm import tqdm

import linattn
from linattn.backends import policy
from linattn.tools.harness import machine
from linattn.tools.harness.peak import cpu_peak_bytes
from linattn.tools.harness.timer import time_call
from linattn.tools.perf import peers as pp
from linattn.tools.perf.report import attach_ratios, evaluate_targets, scaling_targets, thread_scaling
from linattn.tools.perf.work import (
    CPU_IMPL,
    FULL,
    PerfConfig,
    decode_bytes,
    decode_flops,
    rule_flops,
    sdpa_flops,
    select,
    seq_bytes,
)

SCHEMA = "linattn.perf/2"


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
            if form == "chunk":  # the compiled token loop, with its compiled backward in fwdbwd
                impls.append((CPU_IMPL, pp.linattn_call(form, backend="cpu"), None))
            impls += [(p.name, _lazy(p), p) for p in peers if p.form == form and p.variant == variant]
            for impl, fn, peer in impls:
                cases.append(Case(f"{group}/{variant}/{impl}/B{B}_T{T}", group, variant, impl, B, T,
                                  _seq_call(fn, variant, B, T, H, D, backward), fl,
                                  bytes_moved=seq_bytes(variant, B, T, H, D, D, backward=backward), peer=peer))

    for B, T in cfg.recurrent_shapes:
        sequence_cases("recurrent", "recurrent", B, T, False)
    for B, T in sorted(cfg.seq_shapes, key=lambda s: (s[0] * s[1], s[0])):
        for group, backward in (("fwd", False), ("fwdbwd", True)):
            sequence_cases(group, "chunk", B, T, backward)
            cases.append(Case(f"{group}/softmax/torch.sdpa/B{B}_T{T}", group, "softmax", "torch.sdpa", B, T,
                              _seq_call(pp.sdpa, "softmax", B, T, H, D, backward),
                              sdpa_flops(B, T, H, D, backward=backward),
                              bytes_moved=seq_bytes("softmax", B, T, H, D, D, backward=backward), exponent=2))
    return cases


def _lazy(peer: pp.Peer) -> Callable[[pp.Inputs], torch.Tensor]:
    """Import the peer on first call (inside the case, so a missing peer fails that case only)."""
    return lambda inp: peer.load()(inp)


# --- measurement ---------------------------------------------------------------------------------------------------


def _measure(fn: Callable[[], object], repeats: int, min_sample_s: float, budget_s: float) -> dict[str, Any]:
    """Median seconds per call through the harness timer: the first call warms up and sizes the samples."""
    t = time_call(fn, repeats=repeats, min_sample_s=min_sample_s, budget_s=budget_s)
    return {"median_s": t.median_s, "min_s": t.min_s, "samples": len(t.samples_s),
            "calls_per_sample": t.calls_per_sample, "warmup_s": t.first_call_s}


def peak_bytes(fn: Callable[[], object]) -> int:
    """Peak bytes held by torch's CPU allocator during one call, above what was live before it (inputs excluded,
    outputs and autograd buffers included); see linattn.tools.harness.peak."""
    return cpu_peak_bytes(fn) or 0


def machine_rates(cfg: PerfConfig, state_numel: int) -> dict[str, Any]:
    """float32 matmul rate (n x n, median) and copy bandwidth (read + write bytes over time), large and at the
    size of the largest decode state (which may sit in cache), at the current thread count."""
    kw = {"repeats": max(cfg.repeats, 5), "min_sample_s": cfg.min_sample_s}
    return {"matmul": machine.matmul_rate(cfg.matmul_n, **kw), "copy": machine.copy_bandwidth(cfg.copy_numel, **kw),
            "copy_state_size": machine.copy_bandwidth(state_numel, **kw)}


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
    if case.bytes_moved:  # the decode state may sit in cache: judged against the large copy all the same
        res["gbps"] = case.bytes_moved / s / 1e9
        res["frac_copy"] = res["gbps"] / rates["copy"]["gbps"]
    return res


# --- the run -------------------------------------------------------------------------------------------------------


def _one_pass(cases: list[Case], cfg: PerfConfig, threads: int, progress: bool) -> dict[str, Any]:
    """Every case at one thread count, with the machine's rates measured at that count first."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        load_before = machine.load_info()["loadavg"]
        busy = machine.BusyMeter().start()
        rates = machine_rates(cfg, max(cfg.decode_batches) * cfg.H * cfg.D * (cfg.D + 1))
        history: dict = {}
        results = []
        bar = tqdm(cases, desc=f"linattn perf ({threads} thread{'s' if threads > 1 else ''})", unit="case",
                   file=sys.stderr, disable=not progress)
        for case in bar:
            bar.set_postfix_str(case.name)
            results.append(_run_case(case, cfg, history, rates, time.perf_counter() - start))
        bar.close()
        attach_ratios(results)
        return {"threads": torch.get_num_threads(), "loadavg_before": load_before, "machine": rates,
                "cases": results, "others_cpu_cores": busy.stop(), "elapsed_s": time.perf_counter() - start}
    finally:
        torch.set_num_threads(before)


def run(cfg: PerfConfig = FULL, *, only: tuple[str, ...] = (), peers: tuple[pp.Peer, ...] | None = None,
        progress: bool = True) -> dict[str, Any]:
    """Measure everything selected once per thread count in ``cfg.threads`` and return the result document
    (see docs/perf.md for each field)."""
    start = time.perf_counter()
    peers = pp.PEERS if peers is None else peers
    load_before = machine.load_info()["loadavg"]
    busy = machine.BusyMeter().start()
    cases = select(build_cases(cfg, peers), only)
    used = {c.peer.name for c in cases if c.peer is not None}
    checks = pp.crosscheck(tuple(p for p in peers if p.name in used),
                           **({"T": 64, "D": 16} if cfg.quick else {}))
    runs = []
    # Everything imported so far (torch, the peers) to the permanent generation: the full collection before each
    # case then scans only what the cases made (with fla and triton loaded it took 0.6 s a case, most of --quick).
    gc.freeze()
    try:
        for threads in cfg.threads:
            runs.append(_one_pass(cases, cfg, threads, progress))
    finally:
        gc.unfreeze()
    for one in runs:
        one["targets"] = [] if cfg.quick else evaluate_targets(one["cases"], one["machine"], cfg, checks)
    scaling = thread_scaling(runs)
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {k: (list(map(list, v)) if k.endswith("shapes") else list(v) if isinstance(v, tuple) else v)
                   for k, v in asdict(cfg).items()},
        "only": list(only),
        "environment": {
            "cpu": machine.processor_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": machine.versions(), "loadavg_before": load_before,
            "others_cpu_cores": busy.stop(),
        },
        "crosscheck": checks,
        "runs": runs,
        "scaling": scaling,
        "scaling_targets": [] if cfg.quick else scaling_targets(scaling, cfg, decode_split_min_work()),
        "elapsed_s": time.perf_counter() - start,
    }


def decode_split_min_work() -> int | None:
    """The state entries from which the compiled decode step splits heads over threads (None: no compiled step)."""
    compiled = linattn.backends.plan_step("cpu").kernel == "cpu"
    return int(policy.DECODE_SPLIT_MIN_ENTRIES) if compiled else None


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
