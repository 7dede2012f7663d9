"""The measured part of ``linattn bench``: the token stream, the two decode paths, their timing and memory, and
the float64 check of the state path.

Baseline ``explicit_kv_history``: K and V for L tokens preallocated as ``[B, H, L, D]``; a step writes the new
token into slot L-1 in place and runs ``F.scaled_dot_product_attention`` of the one query over all L slots (the
history and the token itself), as a decoder with a static cache does. Candidate ``fixed_recurrent_state``: the
state ``(S, z)`` after the same L-1 history tokens (prefilled with ``linattn.linear_attention``), advanced by
``linattn.step(..., inplace=True)``. Both see the same seeded token stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import linattn
from linattn.tools.bench.plan import BASELINE, CANDIDATE_PATHS, DTYPES, FEATURES, MIB, Plan, rule_extras
from linattn.tools.harness.peak import cpu_peak_bytes
from linattn.tools.harness.timer import Timing, time_batch, time_turns

# Absolute tolerance on the state path's output (values of size ~1) against float64, set by the coarsest dtype
# in play: inputs and the feature map run in --dtype, the recurrence in --state-dtype.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
# How the numbers were taken, written into every result file (metrics.timing_method / peak_memory_method).
TIMING_METHOD = {
    "cpu": "time.perf_counter_ns around each step after warmup; mean, median and p90 of the repeats. All paths "
    "of one L are built first, warmed up, then timed in turns of 10 steps per path, so that load changes on a "
    "shared machine hit every path alike (the first step of a turn may find the path's data out of cache)",
    "cuda": "CUDA events around the batch of repeats after warmup (mean_step_ms = batch time / repeats), then "
    "one event pair per step for another batch of repeats (median_step_ms, p90_step_ms, min_step_ms)",
}
PEAK_MEMORY_METHOD = {
    "cpu": "peak_memory_mb (MiB) = persistent_bytes + transient_peak_bytes. persistent_bytes: storage bytes of "
    "the tensors the path keeps between steps (KV cache or S+z) plus the step's input token tensors, summed over "
    "distinct storages. transient_peak_bytes: highest running sum of CPU-allocator alloc/free events (torch.profiler "
    "profile_memory, which sees kernel workspaces too) over 3 steps after timing, each step's output dropped at "
    "once. Allocations made inside intra-op worker threads may be missed.",
    "cuda": "peak_memory_mb (MiB) = torch.cuda.max_memory_allocated() after torch.cuda.reset_peak_memory_stats(), "
    "minus memory_allocated() before the path was built, over warmup and timing of one path at one L; it counts "
    "the kept tensors, the step inputs and per-step temporaries. persistent_bytes are the kept tensors and inputs.",
}
TRANSIENT_UNAVAILABLE = " (this torch exposes no profiler memory events: transient_peak_bytes is 0, not measured)"


# ---------------------------------------------------------------------------------------------------- inputs
@dataclass
class Tokens:
    """The shared token stream on the CPU in --dtype: history ``[B, H, T, D]`` (T = max L - 1), gates and write
    strengths ``[B, H, T]``, and the decoded token ``q, k, v [B, H, D]``, ``g, beta [B, H]``."""

    q_hist: torch.Tensor
    k_hist: torch.Tensor
    v_hist: torch.Tensor
    g_hist: torch.Tensor
    beta_hist: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def sequence(self, name: str, length: int, *, with_token: bool = False) -> torch.Tensor:
        """The first ``length - 1`` history tokens of ``name`` (and the decoded token after them when asked) in
        the API's ``[B, T, H, ...]`` layout."""
        x = getattr(self, f"{name}_hist")[:, :, : length - 1]
        if with_token:
            x = torch.cat([x, getattr(self, name).unsqueeze(2)], dim=2)
        return x.transpose(1, 2)


def make_tokens(plan: Plan) -> Tokens:
    """Seeded on the CPU so every device and every length sees the same stream (shorter L: a prefix)."""
    gen = torch.Generator().manual_seed(plan.seed)
    B, H, D, T = plan.batch, plan.query_heads, plan.head_dim, max(plan.sequence_lengths) - 1
    dt = DTYPES[plan.dtype]

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q_hist, k_hist, v_hist = (draw(B, H, T, D).to(dt) for _ in range(3))
    g_hist = F.logsigmoid(draw(B, H, T) + 3.0).to(dt)  # gates a = exp(g) around 0.95: history fades slowly
    beta_hist = torch.sigmoid(draw(B, H, T)).to(dt)
    q, k, v = (draw(B, H, D).to(dt) for _ in range(3))
    g = F.logsigmoid(draw(B, H) + 3.0).to(dt)
    beta = torch.sigmoid(draw(B, H)).to(dt)
    return Tokens(q_hist, k_hist, v_hist, g_hist, beta_hist, q, k, v, g, beta)


def _storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


# ---------------------------------------------------------------------------------------------------- paths
class KVHistoryPath:
    """Baseline: a static KV cache of L slots; a step writes slot L-1 in place and attends over all of it."""

    def __init__(self, tokens: Tokens, length: int, device: str) -> None:
        B, H, _, D = tokens.k_hist.shape
        dt = tokens.k_hist.dtype
        self.K = torch.empty(B, H, length, D, dtype=dt, device=device)
        self.V = torch.empty(B, H, length, D, dtype=dt, device=device)
        self.K[:, :, : length - 1].copy_(tokens.k_hist[:, :, : length - 1])
        self.V[:, :, : length - 1].copy_(tokens.v_hist[:, :, : length - 1])
        self.q = tokens.q.unsqueeze(2).to(device)  # [B, H, 1, D]: one query
        self.k, self.v = tokens.k.to(device), tokens.v.to(device)
        self.slot = length - 1

    def step(self) -> torch.Tensor:
        self.K[:, :, self.slot].copy_(self.k)
        self.V[:, :, self.slot].copy_(self.v)
        return F.scaled_dot_product_attention(self.q, self.K, self.V).squeeze(2)

    def kept(self) -> list[torch.Tensor]:
        return [self.K, self.V]

    def inputs(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v]

    def matrix_bytes(self) -> int | None:
        return None


class RecurrentStatePath:
    """Candidate: the state after L-1 history tokens, advanced in place by ``linattn.step``."""

    def __init__(self, rule: str, tokens: Tokens, length: int, device: str, state_dtype: str) -> None:
        def hist(name: str) -> torch.Tensor:
            return tokens.sequence(name, length).to(device)

        fmap = FEATURES[rule][1]
        _, self.state = linattn.linear_attention(
            hist("q"),
            hist("k"),
            hist("v"),
            rule=rule,
            feature_map=fmap,
            form="chunk",
            output_final_state=True,
            state_dtype=DTYPES[state_dtype],
            **rule_extras(rule, hist("g"), hist("beta")),
        )
        self.q, self.k, self.v = tokens.q.to(device), tokens.k.to(device), tokens.v.to(device)
        self.extras = rule_extras(rule, tokens.g.to(device), tokens.beta.to(device))
        self.kw: dict[str, Any] = {"rule": rule, "feature_map": fmap, **self.extras}

    def step(self) -> torch.Tensor:
        o, self.state = linattn.step(self.q, self.k, self.v, self.state, inplace=True, **self.kw)
        return o

    def kept(self) -> list[torch.Tensor]:
        return [t for t in (self.state.S, self.state.z) if t is not None]

    def inputs(self) -> list[torch.Tensor]:
        return [t for t in (self.q, self.k, self.v, *self.extras.values()) if t is not None]

    def matrix_bytes(self) -> int:
        return self.state.S.numel() * self.state.S.element_size()


DecodePath = KVHistoryPath | RecurrentStatePath


def _build(plan: Plan, tokens: Tokens, length: int, rule: str | None) -> DecodePath:
    if rule is None:
        return KVHistoryPath(tokens, length, plan.device)
    return RecurrentStatePath(rule, tokens, length, plan.device, plan.state_dtype)


# ---------------------------------------------------------------------------------------------------- timing
def cpu_transient_peak(step: Callable[[], torch.Tensor], steps: int = 3) -> int | None:
    """Highest live allocation (bytes) above the starting point over ``steps`` calls, from allocator events."""
    return cpu_peak_bytes(step, calls=steps)


def _stats_ms(t: Timing) -> dict[str, float]:
    return {"mean_step_ms": t.mean_s * 1e3, "median_step_ms": t.median_s * 1e3, "p90_step_ms": t.quantile(0.9) * 1e3,
            "min_step_ms": t.min_s * 1e3}


def time_cpu(
    steps: Sequence[Callable[[], torch.Tensor]],
    warmup: int,
    repeats: int,
    tick: Callable[[], None],
    block: int = 10,
):
    """Each path's warmup, then the timed steps in blocks of ``block`` per path, the paths taking turns (the
    harness timer's `time_turns`). Turns spread a load change on a shared machine over every path alike;
    blocks keep each path's own data in cache (stepping round robin one step at a time would time the small state
    always cold, after the KV cache has streamed through the caches). Returns per path (stats, first output, all
    outputs finite)."""
    n = len(steps)
    firsts: list[torch.Tensor | None] = [None] * n
    finite = [True] * n

    def observe(j: int, o: torch.Tensor) -> None:
        if firsts[j] is None:
            firsts[j] = o
        finite[j] = finite[j] and bool(torch.isfinite(o).all())
        tick()

    timings = time_turns(steps, repeats=repeats, warmup=warmup, block=block, observe=observe)
    return [(_stats_ms(timings[j]), firsts[j], finite[j]) for j in range(n)]


def time_cuda(step: Callable[[], torch.Tensor], warmup: int, repeats: int, tick: Callable[[], None]):
    """CUDA events through the harness timer: a batch of repeats for the mean, then per-step events for the
    spread. Finite flags stay on the device until the end so that checking them adds no synchronization inside
    the timed loops."""
    flags: list[torch.Tensor] = []
    first: list[torch.Tensor] = []

    def observe(_: int, o: torch.Tensor) -> None:
        if not first:
            first.append(o)
        flags.append(torch.isfinite(o).all())
        tick()

    for _ in range(warmup):
        observe(0, step())
    mean_s, batch_first, last = time_batch(step, repeats, device="cuda")
    if not first:  # warmup 0: the check still needs the output of the very first step
        first.append(batch_first)
    flags.append(torch.isfinite(last).all())
    for _ in range(repeats):
        tick()
    stats = _stats_ms(time_turns([step], repeats=repeats, device="cuda", observe=observe)[0])
    stats["mean_step_ms"] = mean_s * 1e3
    return stats, first[0], bool(torch.stack(flags).all())


# ---------------------------------------------------------------------------------------------------- checking
def reference_check(rule: str, tokens: Tokens, length: int, output: torch.Tensor, plan: Plan) -> dict[str, Any]:
    """The state path's first output at ``length`` against ``linattn.reference.linear_attention`` in float64 on
    the same (already rounded) tokens: history plus the decoded token, last position compared."""
    from linattn import reference

    def seq(name: str) -> np.ndarray:
        return tokens.sequence(name, length, with_token=True).double().numpy()

    o_ref, _, _ = reference.linear_attention(
        seq("q"),
        seq("k"),
        seq("v"),
        rule=rule,
        feature_map=FEATURES[rule][2],
        **rule_extras(rule, seq("g"), seq("beta")),
    )
    got = output.detach().double().cpu().numpy()
    tol = max(TOLERANCE[plan.dtype], TOLERANCE[plan.state_dtype])
    err = float(np.abs(got - o_ref[:, -1]).max())
    finite = math.isfinite(err)
    return {
        "path": CANDIDATE_PATHS[rule],
        "sequence_length": length,
        "max_abs_error": err if finite else None,
        "tolerance": tol,
        "passed": finite and err <= tol,
        "reference": "linattn.reference.linear_attention, float64, same rounded tokens, last position",
    }


# ---------------------------------------------------------------------------------------------------- one run
def _persistent(runner: DecodePath) -> int:
    return _storage_bytes(runner.kept() + runner.inputs())


def measure(
    plan: Plan,
    tokens: Tokens,
    rows: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    *,
    tick: Callable[[], None] = lambda: None,
    describe: Callable[[str], None] = lambda s: None,
) -> bool:
    """Run every path at every length, appending to ``rows`` and ``checks`` as each finishes (so a failure part
    way keeps what was measured). Returns whether the CPU transient memory could be measured."""
    transient_ok = True
    paths: list[tuple[str, str | None]] = [(BASELINE, None)] + [(CANDIDATE_PATHS[r], r) for r in plan.rules]

    def record(L: int, name: str, rule: str | None, runner: DecodePath, timed: tuple, transient: float) -> None:
        stats, first, finite = timed
        persistent, transient = _persistent(runner), max(0, int(transient))
        rows.append(
            {
                "path": name,
                "sequence_length": L,
                "state_bytes": _storage_bytes(runner.kept()),
                "state_matrix_bytes": runner.matrix_bytes(),
                **stats,
                "peak_memory_mb": (persistent + transient) / MIB,
                "persistent_bytes": persistent,
                "transient_peak_bytes": transient,
                "outputs_finite": finite,
                "repeats": plan.repeats,
            }
        )
        if rule is not None and L == plan.reference_check_length:
            checks.append(reference_check(rule, tokens, L, first.cpu(), plan))

    # no_grad, not inference_mode: under inference_mode views keep no ``_base``, so linattn.step cannot see that
    # S and z share one buffer and copies the state every step instead of updating it in place.
    with torch.no_grad():
        for L in plan.sequence_lengths:
            if plan.device == "cuda":  # one path at a time: the peak-memory counter is per device, not per path
                for name, rule in paths:
                    describe(f"L={L} {name}")
                    torch.cuda.synchronize()
                    before = torch.cuda.memory_allocated()
                    runner = _build(plan, tokens, L, rule)
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    timed = time_cuda(runner.step, plan.warmup, plan.repeats, tick)
                    transient = torch.cuda.max_memory_allocated() - before - _persistent(runner)
                    record(L, name, rule, runner, timed, transient)
                    del runner, timed
            else:
                describe(f"L={L} build")
                runners = [_build(plan, tokens, L, rule) for _, rule in paths]
                describe(f"L={L} timing")
                timed = time_cpu([r.step for r in runners], plan.warmup, plan.repeats, tick)
                for (name, rule), runner, result in zip(paths, runners, timed, strict=True):
                    describe(f"L={L} {name}: memory" + (", float64 check" if L == plan.reference_check_length else ""))
                    transient = cpu_transient_peak(runner.step)
                    transient_ok = transient_ok and transient is not None
                    record(L, name, rule, runner, result, transient or 0)
                del runners, timed
    return transient_ok
