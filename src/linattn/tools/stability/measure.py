"""The measurements of ``linattn stability``: how far a low-precision run drifts from float64, and what epsilon and
rescaling do. Each is a pure function returning plain dicts (report.py formats them, plots.py draws them, cli.py
reads the options and writes the files):

* `stability_sweep` runs a rule/form with q, k, v (and g, beta) cast to a candidate dtype and the state kept
  in that dtype (or in ``state_dtype``), against a float64 ground truth on the *same* inputs, over lengths, input
  scales and chunk sizes. The inputs are first rounded to a grid every candidate dtype holds exactly, so the error
  is the error of the computation, not of storing the inputs. The ground truth is ``linattn.linear_attention`` in
  float64 (chunk form, chunk 64), checked against the NumPy loop `linattn.reference` at a short length
  (`reference_check`): the loop itself would take minutes at T = 65,536.
* `epsilon_tradeoff`: ``num / (den + eps)`` against ``num / max(den, eps)`` and several eps, in float64,
  on inputs whose denominators span many decades; where does eps change the answer.
* `rescale_state` and `run_segmented`: multiply S, z and eps by one factor between segments (and the
  later key features with it), which leaves every output unchanged while keeping the state inside the dtype's
  range; `rescaling_check` measures it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import linattn
from linattn import State, reference
from linattn.api import DELTA_RULES, EPS_MODES, GATED_RULES, RULES
from linattn.feature_maps import resolve_feature_map

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_RULES = RULES
DEFAULT_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_LENGTHS = (256, 1024, 4096, 16384, 65536)
DEFAULT_SCALES = (0.1, 1.0, 10.0)
DEFAULT_CHUNKS = (16, 64, 256)
REFERENCE_FORM, REFERENCE_CHUNK = "chunk", 64
REFERENCE_TOL = 1e-10  # float64 chunk form vs the float64 loop: summation order only (measured ~1e-15)
# relu(x)+1 is the map of the float64 reference; delta rules use raw unit-norm keys (identity), as DeltaNet does.
FEATURE_MAP = {"accumulate": "relu1", "gated": "relu1", "delta": None, "gated_delta": None}


# ------------------------------------------------------------------------------------------------ inputs
def _case_seed(seed: int, *parts: object) -> int:
    # crc32 of the text, not hash(): stable across processes, so a case's inputs do not depend on the others.
    return zlib.crc32("|".join(map(str, (seed, *parts))).encode())


def common_grid(x: torch.Tensor, dtypes: Iterable[str]) -> torch.Tensor:
    """Round float64 ``x`` so that every dtype in ``dtypes`` stores it exactly.

    bfloat16 keeps 8 significant bits, float16 11 bits over a narrower exponent range; rounding to one and then the
    other lands on values both hold (a float16 subnormal that came from a bfloat16 value has at most 8 bits).
    """
    low = [d for d in ("bfloat16", "float16") if d in dtypes]
    for _ in range(2):  # the second pass is a no-op; it is the proof that the first one reached a common grid
        for name in low:
            x = x.to(DTYPES[name]).to(torch.float64)
    if not torch.isfinite(x).all():
        raise ValueError("input scale too large: the inputs overflow float16 (|x| > 65504); lower --scales")
    for name in low:
        if not torch.equal(x.to(DTYPES[name]).to(torch.float64), x):
            raise RuntimeError(f"inputs are not exact in {name} after rounding")  # cannot happen; guards the claim
    return x


def make_inputs(
    rule: str,
    length: int,
    scale: float,
    *,
    batch: int = 1,
    heads: int = 2,
    dim: int = 32,
    seed: int = 0,
    dtypes: Iterable[str] = DEFAULT_DTYPES,
) -> dict[str, torch.Tensor | None]:
    """Random float64 inputs for one case, on the common grid of ``dtypes``.

    q, k, v are ``scale * N(0, 1)``. Delta rules get unit-norm keys (so ``scale`` acts on q and v only) and
    ``beta = sigmoid(N(0, 1))``; gated rules get one gate per head and token, ``alpha`` uniform in [0.9, 1).
    """
    gen = torch.Generator().manual_seed(_case_seed(seed, rule, length, scale, batch, heads, dim))
    shape = (batch, length, heads, dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) * scale for _ in range(3))
    g = beta = None
    if rule in DELTA_RULES:
        k = F.normalize(k, dim=-1)
        beta = torch.sigmoid(torch.randn(shape[:3], generator=gen, dtype=torch.float64))
    if rule in GATED_RULES:
        g = torch.log1p(-0.1 * torch.rand(shape[:3], generator=gen, dtype=torch.float64))
    dtypes = tuple(dtypes)
    out = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    return {name: None if x is None else common_grid(x, dtypes) for name, x in out.items()}


def _attend(
    inputs: dict[str, torch.Tensor | None],
    dtype: torch.dtype,
    *,
    rule: str,
    form: str,
    chunk_size: int,
    state_dtype: torch.dtype | None = None,
    denominator: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, State]:
    """One library call with every input cast to ``dtype``; ``denominator=True`` returns q^T z instead of o.

    The denominator is the unnormalized read of a constant value 1 (that is what z stores), run through the same
    rule, form and dtype as the real call.
    """
    x = {n: None if t is None else t.to(dtype) for n, t in inputs.items()}
    v = torch.ones_like(x["v"][..., :1]) if denominator else x["v"]
    return linattn.linear_attention(
        x["q"], x["k"], v, rule=rule, form=form, feature_map=FEATURE_MAP[rule], g=x["g"], beta=x["beta"],
        chunk_size=chunk_size, state_dtype=state_dtype or dtype, output_final_state=True,
        **({"normalize": False} if denominator else {}), **kwargs,
    )


# ------------------------------------------------------------------------------------------------ errors
def _num(x: float | torch.Tensor | None) -> float | None:
    """A JSON-safe float: NaN and +-Inf become None (the counts say what happened)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Errors of ``out`` against float64 ``ref`` (both ``[B, T, H, Dv]``).

    ``max_rel_err`` is per token ``max|o - r| / max|r|`` (so a token whose output is small is judged against its
    own size), worst token; ``median_rel_err`` the median token. Non-finite outputs are counted, not measured:
    the errors cover the finite tokens only, and are None when there are none.
    """
    o = out.detach().to(torch.float64)
    nan, inf = int(torch.isnan(o).sum()), int(torch.isinf(o).sum())
    finite_tok = torch.isfinite(o).all(dim=-1)
    diff = (o - ref).abs().amax(dim=-1)[finite_tok]
    size = ref.abs().amax(dim=-1)[finite_tok].clamp_min(torch.finfo(torch.float64).tiny)
    rel = diff / size
    empty = diff.numel() == 0
    return {
        "max_abs_err": None if empty else _num(diff.max()),
        "max_rel_err": None if empty else _num(rel.max()),
        "median_rel_err": None if empty else _num(rel.median()),
        "nan_count": nan,
        "inf_count": inf,
    }


def _nonfinite(state: State | None) -> int:
    if state is None:
        return 0
    n = int((~torch.isfinite(state.S)).sum())
    return n + (0 if state.z is None else int((~torch.isfinite(state.z)).sum()))


def _state_abs_max(state: State) -> float:
    parts = [state.S.abs().max()] + ([] if state.z is None else [state.z.abs().max()])
    return float(max(p.to(torch.float64) for p in parts))


# ------------------------------------------------------------------------------------------------ sweep
def reference_check(rule: str, *, length: int = 128, seed: int = 0) -> float:
    """Max |float64 torch ground truth - NumPy reference loop| at a short length: justifies the ground truth."""
    x = make_inputs(rule, length, 1.0, batch=1, heads=2, dim=8, seed=seed)
    o, _ = _attend(x, torch.float64, rule=rule, form=REFERENCE_FORM, chunk_size=REFERENCE_CHUNK)
    np_in = {n: None if t is None else t.numpy() for n, t in x.items()}
    ref, _, _ = reference.linear_attention(
        np_in["q"], np_in["k"], np_in["v"], rule=rule, feature_map=FEATURE_MAP[rule], g=np_in["g"], beta=np_in["beta"]
    )
    return float(np.abs(o.numpy() - ref).max())


def reference_summary(rules: Sequence[str], seed: int) -> dict[str, Any]:
    """The result's ``reference`` entry: `reference_check` per rule, judged against ``REFERENCE_TOL``."""
    diffs = {r: reference_check(r, seed=seed) for r in rules}
    return {"form": REFERENCE_FORM, "chunk_size": REFERENCE_CHUNK, "dtype": "float64", "max_abs_diff_vs_numpy": diffs,
            "check_length": 128, "tolerance": REFERENCE_TOL, "passed": all(d <= REFERENCE_TOL for d in diffs.values())}


def check_positive(name: str, values: Sequence, kind: type) -> None:
    if len(values) == 0:
        raise ValueError(f"{name} must not be empty")
    for x in values:
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
        if not ok or (kind is int and not isinstance(x, int)):
            raise ValueError(f"{name} must hold positive {'integers' if kind is int else 'numbers'}, got {x!r}")


def _check_dtypes(dtypes: Sequence[str]) -> None:
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtype: unknown dtype {name!r}; expected one of {', '.join(map(str, DTYPES))}")


def case_grid(scales: Sequence[float], chunks: Sequence[int], full_grid: bool = False) -> list[tuple[float, int]]:
    """(input scale, chunk size) pairs: every scale at the base chunk (64, else the first) and every chunk size at
    the base scale (1.0, else the first) -- one factor at a time, which keeps the default sweep under two
    minutes -- or the whole cross product with ``full_grid``."""
    if full_grid:
        return [(s, c) for s in scales for c in chunks]
    base_s = 1.0 if 1.0 in scales else scales[0]
    base_c = REFERENCE_CHUNK if REFERENCE_CHUNK in chunks else chunks[0]
    return list(dict.fromkeys([(s, base_c) for s in scales] + [(base_s, c) for c in chunks]))


def stability_sweep(
    *,
    rules: Sequence[str] = DEFAULT_RULES,
    form: str = "chunk",
    dtypes: Sequence[str] = DEFAULT_DTYPES,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    scales: Sequence[float] = DEFAULT_SCALES,
    chunk_sizes: Sequence[int] = DEFAULT_CHUNKS,
    state_dtype: str | None = None,
    batch: int = 1,
    heads: int = 2,
    dim: int = 32,
    seed: int = 0,
    full_grid: bool = False,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One record per (rule, length, scale, dtype, chunk size): errors against float64, smallest denominator,
    NaN/Inf counts of the outputs and of the final state, the largest state entry.

    ``state_dtype=None`` keeps the state in the candidate dtype; a name (e.g. ``"float32"``) keeps it there
    instead (mixed precision). A kernel that refuses a dtype is recorded with its ``error`` and the sweep goes on.
    Scales and chunk sizes are varied one at a time (see `case_grid`) unless ``full_grid``.
    """
    for rule in rules:
        if rule not in RULES:
            raise ValueError(f"rule: unknown rule {rule!r}; expected one of {', '.join(map(str, RULES))}")
        if form not in linattn.supported_forms(rule):
            raise ValueError(f"form: rule {rule!r} has no form {form!r}; it has "
                             f"{', '.join(linattn.supported_forms(rule))}")
    _check_dtypes(dtypes)
    if state_dtype is not None:
        _check_dtypes([state_dtype])
    check_positive("lengths", lengths, int)
    check_positive("scales", scales, float)
    check_positive("chunk_sizes", chunk_sizes, int)
    check_positive("batch, heads, dim", [batch, heads, dim], int)
    chunks = list(chunk_sizes) if form == "chunk" else [REFERENCE_CHUNK]  # other forms have no chunk size
    grid = case_grid(scales, chunks, full_grid)
    records: list[dict[str, Any]] = []
    bar = tqdm(total=len(rules) * len(lengths) * len(grid) * len(dtypes), disable=not progress, desc="stability",
               unit="run")
    for rule in rules:
        normalized = rule not in DELTA_RULES
        for length in lengths:
            for scale in dict.fromkeys(s for s, _ in grid):
                x = make_inputs(rule, length, scale, batch=batch, heads=heads, dim=dim, seed=seed, dtypes=dtypes)
                ref, ref_state = _attend(x, torch.float64, rule=rule, form=REFERENCE_FORM, chunk_size=REFERENCE_CHUNK)
                ref_den = None
                if normalized:
                    ref_den, _ = _attend(x, torch.float64, rule=rule, form=REFERENCE_FORM,
                                         chunk_size=REFERENCE_CHUNK, denominator=True)
                for chunk in (c for s, c in grid if s == scale):
                    for name in dtypes:
                        bar.set_postfix_str(f"{rule} {name} T={length}", refresh=False)
                        rec = {"rule": rule, "form": form, "dtype": name, "state_dtype": state_dtype or name,
                               "length": length, "input_scale": scale,
                               "chunk_size": chunk if form == "chunk" else None,
                               "reference_state_abs_max": _state_abs_max(ref_state),
                               "min_den_float64": None if ref_den is None else _num(ref_den.min())}
                        rec.update(_candidate(x, ref, name, rule, form, chunk, state_dtype, normalized))
                        records.append(rec)
                        bar.update()
    bar.close()
    return records


def _candidate(x, ref, name, rule, form, chunk, state_dtype, normalized) -> dict[str, Any]:
    dtype = DTYPES[name]
    sdt = DTYPES[state_dtype] if state_dtype else dtype
    try:
        out, state = _attend(x, dtype, rule=rule, form=form, chunk_size=chunk, state_dtype=sdt)
        den = None
        if normalized:
            den, _ = _attend(x, dtype, rule=rule, form=form, chunk_size=chunk, state_dtype=sdt, denominator=True)
    except (RuntimeError, NotImplementedError) as exc:  # e.g. a CPU op without a bfloat16 kernel
        first = str(exc).splitlines()[0] if str(exc) else ""
        return {"error": f"{type(exc).__name__}: {first}", **error_stats(torch.empty(0, 1), torch.empty(0, 1)),
                "min_den": None, "state_nonfinite": None, "state_abs_max": None}
    fin = torch.isfinite(state.S).all() and (state.z is None or torch.isfinite(state.z).all())
    return {
        "error": None,
        **error_stats(out, ref),
        # smallest q^T z the candidate itself computed (it divides by this, so this is the one that matters)
        "min_den": None if den is None else _num(den.to(torch.float64).min()),
        "state_nonfinite": _nonfinite(state),
        "state_abs_max": _num(_state_abs_max(state)) if fin else None,
    }


# ------------------------------------------------------------------------------------------------ epsilon
def token_rel_change(out: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Per token ``max|out - base| / max|base|`` over the value dimension: ``[B, T, H, Dv] -> [B, T, H]``."""
    return (out - base).abs().amax(-1) / base.abs().amax(-1).clamp_min(torch.finfo(base.dtype).tiny)


def epsilon_inputs(length: int, offsets: Sequence[float], dim: int, seed: int) -> dict[str, torch.Tensor | None]:
    """q, k = N(0, 1) + offset of the head; with elu+1 features (exp(x) for x < 0) each head's denominators sit
    about 2*offset/ln(10) decades lower, so one run covers large and tiny denominators."""
    gen = torch.Generator().manual_seed(_case_seed(seed, "epsilon", length, dim))
    shape = (1, length, len(offsets), dim)
    shift = torch.tensor(offsets, dtype=torch.float64)[None, None, :, None]
    q, k = (torch.randn(shape, generator=gen, dtype=torch.float64) + shift for _ in range(2))
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    return {"q": q, "k": k, "v": v, "g": None, "beta": None}


def epsilon_tradeoff(
    *,
    length: int = 2048,
    offsets: Sequence[float] = (0.0, -3.0, -6.0, -9.0, -12.0),
    eps_values: Sequence[float] = (1e-12, 1e-9, 1e-6, 1e-3),
    dim: int = 16,
    seed: int = 0,
) -> dict[str, Any]:
    """The same float64 inputs under ``add`` and ``clamp`` and each eps, against exact division (eps = 0).

    Returns the denominator range and per (mode, eps): the worst relative change of a token, the share of tokens
    changed by more than 1e-6 and 1e-2, the largest denominator at which the change still exceeds 1e-3, and the
    worst change per decade of the denominator. The change is exactly ``eps / (den + eps)`` for ``add`` and
    ``max(0, 1 - den / eps)`` for ``clamp`` (both rescale the whole output vector of a token);
    ``formula_max_dev`` records how far the measurement is from that.
    """
    check_positive("eps_values", eps_values, float)
    check_positive("length, dim", [length, dim], int)
    x = epsilon_inputs(length, offsets, dim, seed)
    kw = {"rule": "accumulate", "form": "chunk", "chunk_size": REFERENCE_CHUNK}

    def run(v: torch.Tensor, **extra) -> torch.Tensor:
        return linattn.linear_attention(x["q"], x["k"], v, feature_map="elu1", **kw, **extra)[0]

    base = run(x["v"], eps=0.0)
    den = run(torch.ones_like(x["v"][..., :1]), normalize=False)[..., 0]  # q^T z: the read of a constant 1
    decade = torch.floor(torch.log10(den))
    cases = []
    for mode in EPS_MODES:
        for eps in eps_values:
            rel = token_rel_change(run(x["v"], eps=eps, eps_mode=mode), base)
            formula = eps / (den + eps) if mode == "add" else (1 - den / eps).clamp_min(0)
            big = rel > 1e-3
            by_decade = [
                {"decade": int(d), "tokens": int((decade == d).sum()), "max_rel_change": float(rel[decade == d].max())}
                for d in torch.unique(decade).tolist()
            ]
            cases.append({
                "eps_mode": mode,
                "eps": eps,
                "max_rel_change": float(rel.max()),
                "frac_changed_1e-6": float((rel > 1e-6).double().mean()),
                "frac_changed_1e-2": float((rel > 1e-2).double().mean()),
                "max_den_changed_1e-3": float(den[big].max()) if big.any() else None,
                "formula_max_dev": float((rel - formula).abs().max()),
                "by_den_decade": by_decade,
            })
    return {
        "rule": "accumulate",
        "feature_map": "elu1",
        "dtype": "float64",
        "length": length,
        "head_offsets": list(offsets),
        "dim": dim,
        "den_min": float(den.min()),
        "den_max": float(den.max()),
        "den_min_per_head": [float(den[..., h].min()) for h in range(len(offsets))],
        "cases": cases,
    }


# ------------------------------------------------------------------------------------------------ rescaling
def rescale_state(state: State, factor: float, eps: float = 1e-6) -> tuple[State, float]:
    """``(State(factor * S, factor * z), factor * eps)``: the read-out ``q^T S / (q^T z + eps)`` is unchanged.

    Both eps modes survive it (``max(f den, f eps) = f max(den, eps)``). Only the state changes, so the keys
    written afterwards must be multiplied by the same factor (`run_segmented` does it), or the old history
    would weigh ``factor`` times less than the new. A power of two changes no bits but the exponent. Rules
    without a normalizer (delta) read ``S^T q`` directly, so rescaling would change their output: refused.
    """
    if not isinstance(state, State):
        raise TypeError(f"state must be a linattn.State, got {type(state).__name__}")
    if state.z is None:
        raise ValueError("state.z is None: only normalized states (accumulate, gated) can be rescaled unchanged")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    return State(state.S * factor, state.z * factor), eps * factor


def run_segmented(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    dtype: torch.dtype,
    segment: int = 4096,
    limit: float | None = None,
    rule: str = "accumulate",
    feature_map: str | None = "relu1",
    g: torch.Tensor | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    scale_eps: bool = True,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Run a normalized rule ``segment`` tokens at a time in ``dtype``, carrying the state between calls.

    After a segment whose state has an entry above ``limit``, S, z and eps are multiplied by a power of two that
    brings the largest entry to at most ``limit / 16`` (`rescale_state`), and later key features by the
    running product of those factors. ``limit=None`` never rescales. ``scale_eps=False`` leaves eps alone, to
    show why it has to move with the state. Returns the outputs and ``{n_rescales, key_factor,
    peak_state_abs}``.
    """
    if rule in DELTA_RULES:
        raise ValueError(f"rule: {rule!r} has no normalizer; rescaling applies to accumulate and gated only")
    check_positive("segment", [segment], int)
    if limit is not None:
        check_positive("limit", [limit], float)
    fmap = resolve_feature_map(feature_map)
    qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
    # The features are computed here, in the candidate dtype as the library would, so keys can be scaled.
    qf, kf = (qd, kd) if fmap is None else (fmap(qd), fmap(kd))
    scale = qf.shape[-1] ** -0.5
    c, eps_c, state, outs, n, peak = 1.0, eps, None, [], 0, 0.0
    for start in range(0, q.shape[1], segment):
        sl = slice(start, start + segment)
        o, state = linattn.linear_attention(
            qf[:, sl], kf[:, sl] * c, vd[:, sl], rule=rule, form="chunk", feature_map=None, scale=scale,
            eps=eps_c, eps_mode=eps_mode, g=None if g is None else g[:, sl].to(dtype), initial_state=state,
            output_final_state=True, chunk_size=chunk_size, state_dtype=dtype,
        )
        outs.append(o)
        m = _state_abs_max(state)
        peak = max(peak, m)
        if limit is not None and m > limit and math.isfinite(m):
            f = 2.0 ** -math.ceil(math.log2(m * 16 / limit))
            state, eps_new = rescale_state(state, f, eps_c)
            eps_c = eps_new if scale_eps else eps_c
            c *= f
            n += 1
    return torch.cat(outs, dim=1), {"n_rescales": n, "key_factor": c, "peak_state_abs": _num(peak)}


def rescaling_check(
    *,
    length: int = 65536,
    dtype: str = "float16",
    segment: int = 4096,
    limit: float = 2.0**12,
    scale: float = 1.0,
    heads: int = 2,
    dim: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """Rescaling, measured: in float64 it must not change the outputs (and not scaling eps must), and in a
    narrow dtype it must keep the state finite where the plain run overflows."""
    _check_dtypes([dtype])
    x = make_inputs("accumulate", length, scale, heads=heads, dim=dim, seed=seed, dtypes=[dtype])
    q, k, v = x["q"], x["k"], x["v"]
    ref, _ = _attend(x, torch.float64, rule="accumulate", form="chunk", chunk_size=REFERENCE_CHUNK)
    plain64, _ = run_segmented(q, k, v, dtype=torch.float64, segment=segment, limit=None)
    res64, info64 = run_segmented(q, k, v, dtype=torch.float64, segment=segment, limit=limit)
    noeps64, _ = run_segmented(q, k, v, dtype=torch.float64, segment=segment, limit=limit, scale_eps=False)
    dt = DTYPES[dtype]
    plain, plain_state = _attend(x, dt, rule="accumulate", form="chunk", chunk_size=REFERENCE_CHUNK)
    res, info = run_segmented(q, k, v, dtype=dt, segment=segment, limit=limit)
    buckets = max(1, length // 64)  # 64 points along the sequence for the plot
    by_pos = [
        {"start": t0, "plain_max_rel": _num(token_rel_change(plain[:, t0:t0 + buckets], ref[:, t0:t0 + buckets]).max()),
         "rescaled_max_rel": _num(token_rel_change(res[:, t0:t0 + buckets], ref[:, t0:t0 + buckets]).max())}
        for t0 in range(0, length, buckets)
    ]
    return {
        "rule": "accumulate",
        "length": length,
        "segment": segment,
        "limit": limit,
        "input_scale": scale,
        "heads": heads,
        "dim": dim,
        "float64": {
            "n_rescales": info64["n_rescales"],
            "key_factor": info64["key_factor"],
            "max_rel_diff_rescaled_vs_plain": float(token_rel_change(res64, plain64).max()),
            "max_rel_diff_eps_not_scaled": float(token_rel_change(noeps64, plain64).max()),
            "max_rel_diff_segmented_vs_one_call": float(token_rel_change(plain64, ref).max()),
        },
        "candidate": {
            "dtype": dtype,
            "plain": {**error_stats(plain, ref), "state_nonfinite": _nonfinite(plain_state),
                      "zero_outputs": int((plain.abs().amax(-1) == 0).sum())},
            "rescaled": {**error_stats(res, ref), **info, "zero_outputs": int((res.abs().amax(-1) == 0).sum())},
        },
        "error_by_position": by_pos,
    }
