"""The checks of ``linattn lab``: PASS/FAIL proofs of the mechanism on random inputs.

Each check is a function ``check_*(seed) -> CheckResult`` that builds its own float64 inputs from the seed, runs the
public API (``linattn.linear_attention`` / ``linattn.step``) and compares with a float64 loop, a closed formula
or another form. The command (cli.py) only prints one line per check and exits 1 if any check fails.

Error measure everywhere: ``max |actual - expected| / max(1, max |expected|)`` (absolute for outputs of order one,
relative for large ones), the worst over every comparison a check makes. Tolerances are stated per check: 1e-10
for the float64 identities, looser ones only for the float32 and bfloat16 lines.
"""

from __future__ import annotations

import contextlib
import functools
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

import linattn
from linattn import State, reference

F64 = torch.float64
EXACT_TOL = 1e-10  # float64 identities: forms agree to rounding (~1e-15) on these sizes, so 1e-10 is generous
# Low precision against float64 on the same rounded inputs; errors are relative to max(1, max |output|).
FLOAT32_TOL = 1e-5  # measured <= 6.9e-7 over seeds 0..999 (T=64, every rule)
BFLOAT16_TOL = 3e-2  # measured <= 1.0e-2 over seeds 0..999 (median 4.1e-3): output rounding alone is 2^-8


@dataclass(frozen=True)
class CheckResult:
    """One lab line: ``name: PASS|FAIL  max_err=... tol=...``; ``detail`` says where the worst error was."""

    name: str
    passed: bool
    max_error: float
    tolerance: float
    detail: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.name}: {verdict}  max_err={self.max_error:.1e} tol={self.tolerance:.0e}"


# ---------------------------------------------------------------------------------------------------------------
# Comparing


def _np(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to(F64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def max_rel_error(actual, expected) -> float:
    """``max |actual - expected| / max(1, max |expected|)``; NaN anywhere gives NaN (which fails every check)."""
    a, e = _np(actual), _np(expected)
    if a.shape != e.shape:
        raise ValueError(f"actual has shape {a.shape} but expected has shape {e.shape}")
    if a.size == 0:
        return 0.0
    if not (np.isfinite(a).all() and np.isfinite(e).all()):
        return math.nan
    return float(np.max(np.abs(a - e))) / max(1.0, float(np.max(np.abs(e))))


def compare(name: str, tolerance: float, pairs: dict[str, tuple], note: str = "") -> CheckResult:
    """A check result from labelled ``(actual, expected)`` pairs: passes when every error is <= ``tolerance``."""
    if not pairs:
        raise ValueError(f"compare({name!r}): no pairs to compare")
    errors = {label: max_rel_error(a, e) for label, (a, e) in pairs.items()}
    # NaN ranks worst, so a NaN anywhere is what the line reports.
    worst = max(errors, key=lambda label: (math.isnan(errors[label]), errors[label]))
    passed = all(err <= tolerance for err in errors.values())
    detail = f"worst: {worst} ({errors[worst]:.1e}) of {len(errors)} comparisons"
    return CheckResult(name, passed, errors[worst], tolerance, f"{detail}; {note}" if note else detail)


Check = Callable[[int], CheckResult]
CHECKS: list[Check] = []  # filled by @_check in definition order, which is the order the lab prints


def _check(name: str, tolerance: float = EXACT_TOL) -> Callable[[Callable[..., CheckResult]], Check]:
    """Register ``body(name, tol, seed, **options)`` as the lab line ``name`` with tolerance ``tolerance``.

    The registered ``check(seed=0, **options)`` turns an exception into a FAIL with the message as detail, so one
    broken form never hides the other lines.
    """

    def register(body: Callable[..., CheckResult]) -> Check:
        @functools.wraps(body)
        def check(seed: int = 0, **options) -> CheckResult:
            try:
                return body(name, tolerance, seed, **options)
            except Exception as exc:  # any error inside a check is that check's failure
                return CheckResult(name, False, math.nan, tolerance, f"raised {type(exc).__name__}: {exc}")

        check.check_name = name
        CHECKS.append(check)
        return check

    return register


# ---------------------------------------------------------------------------------------------------------------
# Random inputs


def _generator(seed: int, name: str) -> torch.Generator:
    """One stream per (seed, check), so a check's inputs do not depend on which checks ran before it."""
    mixed = np.random.SeedSequence([seed, zlib.crc32(name.encode())]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed) & (2**63 - 1))


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64)


def _uniform(gen: torch.Generator, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=F64)


Case = tuple[str, torch.Tensor, torch.Tensor, torch.Tensor, dict]


def _kernel_cases(gen: torch.Generator, B: int, T: int, H: int, D: int, Dv: int) -> list[Case]:
    """accumulate and gated problems on raw inputs through named maps, with a non-zero initial state."""

    def qkv():
        return _randn(gen, B, T, H, D), _randn(gen, B, T, H, D), _randn(gen, B, T, H, Dv)

    def state(
        normalized: bool, width: int = D
    ) -> State:  # z stays positive, as a history of positive features makes it
        return State(_randn(gen, B, H, width, Dv), _uniform(gen, (B, H, width), 0.5, 2.0) if normalized else None)

    return [
        ("accumulate relu1", *qkv(), dict(rule="accumulate", feature_map="relu1", initial_state=state(True))),
        (
            "accumulate unnormalized taylor2",
            *qkv(),
            dict(
                rule="accumulate",
                feature_map="taylor2",  # width 1 + D + D^2, features of either sign: no normalizer
                normalize=False,
                scale=0.5,
                initial_state=state(False, 1 + D + D * D),
            ),
        ),
        (
            "gated per-head",
            *qkv(),
            dict(rule="gated", feature_map="relu1", g=_uniform(gen, (B, T, H), -1.0, 0.0), initial_state=state(True)),
        ),
        (
            "gated per-channel clamp",
            *qkv(),
            dict(
                rule="gated",
                feature_map="elu1",
                eps=1e-3,
                eps_mode="clamp",
                g=_uniform(gen, (B, T, H, D), -1.0, 0.0),
                initial_state=state(True),
            ),
        ),
    ]


def _delta_cases(gen: torch.Generator, B: int, T: int, H: int, D: int, Dv: int) -> list[Case]:
    """delta and gated_delta with unit keys and beta in (0.1, 1.5), so every write converges (beta |k|^2 < 2)."""

    def inputs():
        k = F.normalize(_randn(gen, B, T, H, D), dim=-1)
        beta = _uniform(gen, (B, T, H), 0.1, 1.5)
        return _randn(gen, B, T, H, D), k, _randn(gen, B, T, H, Dv), beta, State(0.5 * _randn(gen, B, H, D, Dv))

    q, k, v, beta, s0 = inputs()
    cases = [("delta", q, k, v, dict(rule="delta", beta=beta, initial_state=s0))]
    q, k, v, beta, s0 = inputs()
    g = _uniform(gen, (B, T, H), -0.5, 0.0)
    cases.append(("gated_delta", q, k, v, dict(rule="gated_delta", g=g, beta=beta, initial_state=s0)))
    return cases


def _attend(q, k, v, **kwargs) -> tuple[torch.Tensor, State]:
    return linattn.linear_attention(q, k, v, output_final_state=True, **kwargs)


def _reference(q, k, v, *, initial_state: State | None = None, g=None, beta=None, **kwargs):
    """The float64 NumPy loop on the same inputs: ``(o, S, z)``."""
    if initial_state is not None:
        kwargs["initial_S"] = _np(initial_state.S)
        kwargs["initial_z"] = None if initial_state.z is None else _np(initial_state.z)
    g, beta = (None if x is None else _np(x) for x in (g, beta))
    return reference.linear_attention(_np(q), _np(k), _np(v), g=g, beta=beta, **kwargs)


def _state_pairs(label: str, got: State, want: State | tuple) -> dict[str, tuple]:
    S, z = (want.S, want.z) if isinstance(want, State) else want
    pairs = {f"{label} S": (got.S, S)}
    if z is not None:
        pairs[f"{label} z"] = (got.z, z)
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# The checks


@_check("recurrent vs dense kernel")
def check_recurrent_vs_dense(name: str, tol: float, seed: int) -> CheckResult:
    """Token loop = dense masked T x T form = float64 reference (accumulate, gated per head and per channel)."""
    gen = _generator(seed, name)
    pairs: dict[str, tuple] = {}
    for label, q, k, v, kw in _kernel_cases(gen, B=2, T=37, H=2, D=6, Dv=5):
        o_rec, s_rec = _attend(q, k, v, form="recurrent", **kw)
        o_par, s_par = _attend(q, k, v, form="parallel", **kw)
        o_ref, S_ref, z_ref = _reference(q, k, v, **kw)
        pairs[f"{label}: parallel o"] = (o_par, o_rec)
        pairs.update(_state_pairs(f"{label}: parallel", s_par, s_rec))
        pairs[f"{label}: recurrent o vs reference"] = (o_rec, o_ref)
        pairs.update(_state_pairs(f"{label}: recurrent vs reference", s_rec, (S_ref, z_ref)))
    # The spec'd one-head reference (relu + 1, exact division) against the named map with scale 1 and eps 0.
    q, k, v = _randn(gen, 1, 23, 1, 4), _randn(gen, 1, 23, 1, 4), _randn(gen, 1, 23, 1, 3)
    y, S, z = reference.linear_attention_scan(_np(q[0, :, 0]), _np(k[0, :, 0]), _np(v[0, :, 0]))
    for form in ("recurrent", "parallel"):
        o, st = _attend(q, k, v, form=form, feature_map="relu1", scale=1.0, eps=0.0)
        pairs[f"linear_attention_scan: {form} o"] = (o[0, :, 0], y)
        pairs[f"linear_attention_scan: {form} S"] = (st.S[0, 0], S)
        pairs[f"linear_attention_scan: {form} z"] = (st.z[0, 0], z)
    return compare(name, tol, pairs)


def _form_vs_recurrent(
    name: str, tol: float, seed: int, cases_fn, form: str, chunk_sizes: tuple[int, ...], T: int
) -> CheckResult:
    gen = _generator(seed, name)
    pairs: dict[str, tuple] = {}
    for label, q, k, v, kw in cases_fn(gen, B=2, T=T, H=2, D=5, Dv=4):
        o_rec, s_rec = _attend(q, k, v, form="recurrent", **kw)
        for c in chunk_sizes:
            o, s = _attend(q, k, v, form=form, chunk_size=c, **kw)
            tag = f"{label} chunk_size={c}:" if form == "chunk" else f"{label}:"
            pairs[f"{tag} o"] = (o, o_rec)
            pairs.update(_state_pairs(tag, s, s_rec))
    note = f"T={T}" + (f", chunk sizes {', '.join(map(str, chunk_sizes))}" if form == "chunk" else "")
    return compare(name, tol, pairs, note=note)


@_check("recurrent vs chunkwise")
def check_recurrent_vs_chunk(name: str, tol: float, seed: int) -> CheckResult:
    """Chunkwise form = token loop, for chunk sizes that do and do not divide T (and one larger than T)."""
    return _form_vs_recurrent(name, tol, seed, _kernel_cases, "chunk", (1, 5, 16, 64), T=37)


@_check("recurrent vs scan")
def check_recurrent_vs_scan(name: str, tol: float, seed: int) -> CheckResult:
    """Associative scan form = token loop (accumulate and gated)."""
    return _form_vs_recurrent(name, tol, seed, _kernel_cases, "scan", (64,), T=37)


@_check("delta chunk vs recurrent")
def check_delta_chunk(name: str, tol: float, seed: int) -> CheckResult:
    """Delta rule: chunkwise WY/UT form = token loop = float64 reference."""
    return _delta_chunk(name, tol, "delta", seed)


@_check("gated delta chunk vs recurrent")
def check_gated_delta_chunk(name: str, tol: float, seed: int) -> CheckResult:
    """Gated delta rule: chunkwise form (gates in log space inside a chunk) = token loop = float64 reference."""
    return _delta_chunk(name, tol, "gated_delta", seed)


def _delta_chunk(name: str, tol: float, rule: str, seed: int) -> CheckResult:
    gen = _generator(seed, name)
    T, sizes = 45, (1, 4, 16, 64)
    pairs: dict[str, tuple] = {}
    for _, q, k, v, kw in _delta_cases(gen, B=2, T=T, H=2, D=6, Dv=4):
        if kw["rule"] != rule:
            continue
        o_rec, s_rec = _attend(q, k, v, form="recurrent", **kw)
        o_ref, S_ref, _ = _reference(q, k, v, **kw)
        pairs["recurrent o vs reference"] = (o_rec, o_ref)
        pairs["recurrent S vs reference"] = (s_rec.S, S_ref)
        for c in sizes:
            o, s = _attend(q, k, v, form="chunk", chunk_size=c, **kw)
            pairs[f"chunk_size={c}: o"] = (o, o_rec)
            pairs[f"chunk_size={c}: S"] = (s.S, s_rec.S)
    sizes_text = ", ".join(map(str, sizes))
    return compare(name, tol, pairs, note=f"T={T}, unit keys, beta in (0.1, 1.5), chunk sizes {sizes_text}")


@_check("gated scan coefficients")
def check_gated_scan_coefficients(name: str, tol: float, seed: int) -> CheckResult:
    """Token i's weight at time t is prod_{j=i+1..t} alpha_j, read out of the state, against a direct product loop.

    One-hot keys k_i = e_i (feature width = T) and v = 1, unnormalized, scale 1: then S_t = sum_i w_ti e_i and the
    query e_i at time t reads exactly w_ti. Batch row b asks with e_b at every time, so one call gives all (t, i).
    """
    gen = _generator(seed, name)
    T, H = 20, 2
    eye = torch.eye(T, dtype=F64)
    q = eye[:, None, None, :].expand(T, T, H, T)  # batch b queries e_b at every time
    k = eye[None, :, None, :].expand(T, T, H, T)  # time i writes key e_i
    v = torch.ones(T, T, H, 1, dtype=F64)
    gates = {
        "per-head": _uniform(gen, (T, H), -0.7, 0.0),  # [T, H], the same for every batch row
        "per-channel": _uniform(gen, (T, H, T), -0.7, 0.0),  # [T, H, Dk]: token i's weight decays on channel i
    }
    pairs: dict[str, tuple] = {}
    for kind, g in gates.items():
        alpha = torch.exp(g).numpy()
        expected = np.zeros((T, T, H))  # [i, t, h] like the output o[b=i, t, h, 0]; zero before token i exists
        for i in range(T):
            weight = np.ones(H)  # running product alpha_{i+1} ... alpha_t, multiplied in token order (no logs)
            for t in range(i, T):
                if t > i:
                    weight = weight * (alpha[t] if alpha.ndim == 2 else alpha[t, :, i])
                expected[i, t] = weight
        g_batch = g.unsqueeze(0).expand(T, *g.shape)
        for form in linattn.supported_forms("gated"):
            o, _ = _attend(q, k, v, rule="gated", form=form, g=g_batch, normalize=False, scale=1.0, chunk_size=8)
            pairs[f"{kind} {form}"] = (o[..., 0], expected)
    return compare(name, tol, pairs, note=f"T={T}, alpha in [exp(-0.7), 1]")


def _repeated_writes(gen: torch.Generator, lo: float, hi: float, writes: int, unit_keys: bool):
    """Write one key again and again through ``linattn.step``; return the errors e_n = v - S_n^T k and beta |k|^2.

    ``beta |k|^2`` is drawn from ``(lo, hi)`` per (batch, head), except that it is exactly 1 for the first pair
    when 1 lies in the range (the write that lands in one step). Returns ``errors [writes + 1, B, H, Dv]`` (e_0 from
    the initial state) and ``c = beta |k|^2 [B, H]``.
    """
    B, H, D, Dv = 3, 2, 8, 4
    norms = torch.ones(B, H, dtype=F64) if unit_keys else _uniform(gen, (B, H), 0.5, 1.5)
    k = F.normalize(_randn(gen, B, H, D), dim=-1) * norms[..., None]
    c = _uniform(gen, (B, H), lo, hi)
    if lo <= 1 <= hi:
        c[0, 0] = 1.0
    beta = c / norms**2
    v = _randn(gen, B, H, Dv)
    state = State(_randn(gen, B, H, D, Dv))
    errors = [v - torch.einsum("bhkv,bhk->bhv", state.S, k)]
    for _ in range(writes):
        # q = k and scale 1: the output is S_n^T k, the memory's current answer for that key.
        o, state = linattn.step(k, k, v, state, rule="delta", beta=beta, scale=1.0)
        errors.append(v - o)
    return torch.stack(errors), c


@_check("delta unit-key convergence")
def check_delta_unit_key_convergence(name: str, tol: float, seed: int) -> CheckResult:
    """Each write of the same unit key multiplies the error by (1 - beta |k|^2): per write and in closed form."""
    gen = _generator(seed, name)
    writes = 12
    errors, c = _repeated_writes(gen, 0.05, 1.95, writes, unit_keys=True)
    factor = (1 - c)[..., None]
    n = torch.arange(writes + 1, dtype=F64)[:, None, None, None]
    scale = errors[0].abs().max()  # compare against the size of the first error, not of the (shrinking) later ones
    pairs = {
        "per write e_n vs (1 - beta|k|^2) e_(n-1)": (errors[1:] / scale, factor * errors[:-1] / scale),
        "closed form e_n vs (1 - beta|k|^2)^n e_0": (errors / scale, factor**n * errors[0] / scale),
        "beta|k|^2 = 1: e_1 = 0": (errors[1, 0, 0] / scale, torch.zeros_like(errors[1, 0, 0])),
    }
    shrink = float((errors[-1].norm(dim=-1) / errors[0].norm(dim=-1)).max())
    note = f"{writes} writes, beta in (0.05, 1.95), largest |e_{writes}|/|e_0| = {shrink:.1e}"
    return compare(name, tol, pairs, note=note)


@_check("delta overshoot diverges")
def check_delta_overshoot_diverges(
    name: str, tol: float, seed: int, beta_k2: tuple[float, float] = (2.2, 3.0)
) -> CheckResult:
    """beta |k|^2 > 2 overshoots: the error grows by |1 - beta |k|^2| per write. PASS when divergence is detected.

    ``beta_k2`` is the range beta |k|^2 is drawn from; the check fails if the errors do not grow (as they must not
    for beta |k|^2 < 2) or do not follow the formula.
    """
    gen = _generator(seed, name)
    writes = 25
    errors, c = _repeated_writes(gen, *beta_k2, writes, unit_keys=False)
    norms = errors.norm(dim=-1)  # [writes + 1, B, H]
    # Relative per write, since the errors grow by orders of magnitude.
    per_write = (errors[1:] - (1 - c)[..., None] * errors[:-1]).abs().amax(-1) / norms[:-1]
    err = float(per_write.max()) if bool(torch.isfinite(per_write).all()) else math.nan
    growth = norms[-1] / norms[0]
    diverged = bool((norms[1:] > norms[:-1]).all()) and bool((growth > 10).all())
    passed = diverged and err <= tol
    detail = (
        f"{writes} writes, beta|k|^2 in {beta_k2}, non-unit keys; smallest growth |e_{writes}|/|e_0| = "
        f"{float(growth.min()):.1e} ({'divergence detected' if diverged else 'NO divergence detected'})"
    )
    return CheckResult(name, passed, err, tol, detail)


def _all_rule_cases(gen: torch.Generator, B: int, T: int, H: int, D: int, Dv: int) -> list[Case]:
    return _kernel_cases(gen, B, T, H, D, Dv) + _delta_cases(gen, B, T, H, D, Dv)


@_check("prefill then decode vs one pass")
def check_prefill_then_decode(name: str, tol: float, seed: int) -> CheckResult:
    """Prefill with the chunk form, then decode token by token with ``step``: same outputs and state as one pass."""
    gen = _generator(seed, name)
    T, P = 29, 17
    pairs: dict[str, tuple] = {}
    for label, q, k, v, kw in _all_rule_cases(gen, B=2, T=T, H=2, D=5, Dv=4):
        o_full, s_full = _attend(q, k, v, form="recurrent", **kw)
        seq = {key: kw[key] for key in ("g", "beta") if key in kw}
        o_pre, state = _attend(
            q[:, :P],
            k[:, :P],
            v[:, :P],
            form="chunk",
            chunk_size=8,
            **{**kw, **{key: x[:, :P] for key, x in seq.items()}},
        )
        step_kw = {key: x for key, x in kw.items() if key != "initial_state" and key not in seq}
        for inplace in (False, True):
            st = state.clone()
            outs = []
            for t in range(P, T):
                o_t, st = linattn.step(
                    q[:, t],
                    k[:, t],
                    v[:, t],
                    st,
                    inplace=inplace,
                    **step_kw,
                    **{key: x[:, t] for key, x in seq.items()},
                )
                outs.append(o_t)
            tag = f"{label} inplace={inplace}"
            pairs[f"{tag}: decoded o"] = (torch.stack(outs, dim=1), o_full[:, P:])
            pairs.update(_state_pairs(f"{tag}: final", st, s_full))
        pairs[f"{label}: prefill o"] = (o_pre, o_full[:, :P])
    return compare(name, tol, pairs, note=f"T={T}, prefill {P} tokens with chunk_size=8")


@_check("chunk gradients vs recurrent")
def check_chunk_gradients(name: str, tol: float, seed: int) -> CheckResult:
    """The training path: gradients of the chunk form equal those of the token loop (q, k, v, g, beta, state)."""
    gen = _generator(seed, name)
    pairs: dict[str, tuple] = {}
    for label, q, k, v, kw in _all_rule_cases(gen, B=1, T=19, H=2, D=4, Dv=3):
        s0 = kw.pop("initial_state")
        leaves = {"q": q, "k": k, "v": v, "S0": s0.S, **{key: kw.pop(key) for key in ("g", "beta") if key in kw}}
        if s0.z is not None:
            leaves["z0"] = s0.z
        w_o, w_s = _randn(gen, *v.shape), _randn(gen, *s0.S.shape)
        grads = {}
        for form in ("recurrent", "chunk"):
            x = {key: t.detach().clone().requires_grad_(True) for key, t in leaves.items()}
            extra = {key: x[key] for key in ("g", "beta") if key in x}
            o, s = _attend(
                x["q"],
                x["k"],
                x["v"],
                form=form,
                chunk_size=8,
                **kw,
                **extra,
                initial_state=State(x["S0"], x.get("z0")),
            )
            loss = (o * w_o).sum() + (s.S * w_s).sum()
            grads[form] = torch.autograd.grad(loss, list(x.values()))
        for key, g_chunk, g_rec in zip(leaves, grads["chunk"], grads["recurrent"], strict=True):
            pairs[f"{label}: d/d{key}"] = (g_chunk, g_rec)
    return compare(name, tol, pairs, note="T=19, chunk_size=8, every rule")


@_check("normalizer keeps repeated value")
def check_normalizer_repeated_value(name: str, tol: float, seed: int) -> CheckResult:
    """mechanism "Why z": one key/value repeated m times reads back exactly v; without z the output is t (q.k) v."""
    gen = _generator(seed, name)
    B, T, H, D, Dv = 2, 50, 2, 6, 3
    k = (F.relu(_randn(gen, B, 1, H, D)) + 1).expand(B, T, H, D)  # positive features, one key for all tokens
    v = _randn(gen, B, 1, H, Dv).expand(B, T, H, Dv)
    q = F.relu(_randn(gen, B, T, H, D)) + 1
    t = torch.arange(1, T + 1, dtype=F64)[None, :, None, None]
    grown = t * (q * k).sum(-1, keepdim=True) * v  # numerator alone: m (q.k) v after m copies
    pairs: dict[str, tuple] = {}
    for form in linattn.supported_forms("accumulate"):
        o, _ = _attend(q, k, v, form=form, scale=1.0, eps=0.0, chunk_size=16)
        pairs[f"{form}: normalized o = v"] = (o, v)
        o, _ = _attend(q, k, v, form=form, scale=1.0, normalize=False, chunk_size=16)
        pairs[f"{form}: unnormalized o = t (q.k) v"] = (o, grown)
    return compare(name, tol, pairs, note=f"m up to {T} copies, eps=0")


@_check("segment state composes affinely")
def check_segments_compose(name: str, tol: float, seed: int) -> CheckResult:
    """docs/mechanism.md §6: a segment maps its incoming state affinely, S_out = P S_in + Q, P from a direct product.

    Q is the segment run from a zero state; P = prod_t a_t (I - beta_t k_t k_t^T) in token order (gated delta),
    or prod_t diag(a_t) (per-channel gated, with z composed the same way).
    """
    gen = _generator(seed, name)
    B, T, H, D, Dv = 2, 21, 2, 5, 3
    pairs: dict[str, tuple] = {}
    # gated delta
    q, k, v = _randn(gen, B, T, H, D), F.normalize(_randn(gen, B, T, H, D), dim=-1), _randn(gen, B, T, H, Dv)
    g, beta = _uniform(gen, (B, T, H), -0.5, 0.0), _uniform(gen, (B, T, H), 0.1, 1.5)
    s_in = State(_randn(gen, B, H, D, Dv))
    kw = dict(rule="gated_delta", g=g, beta=beta, form="chunk", chunk_size=8)
    _, s_out = _attend(q, k, v, initial_state=s_in, **kw)
    _, s_zero = _attend(q, k, v, **kw)
    P = torch.eye(D, dtype=F64).expand(B, H, D, D)
    for t in range(T):
        kt = k[:, t]
        A = torch.exp(g[:, t])[..., None, None] * (
            torch.eye(D, dtype=F64) - beta[:, t, :, None, None] * kt[..., :, None] * kt[..., None, :]
        )
        P = A @ P
    pairs["gated_delta S"] = (s_out.S, P @ s_in.S + s_zero.S)
    # per-channel gated, normalized: diag(prod a) acts on S and on z
    q, k, v = F.relu(_randn(gen, B, T, H, D)) + 1, F.relu(_randn(gen, B, T, H, D)) + 1, _randn(gen, B, T, H, Dv)
    g = _uniform(gen, (B, T, H, D), -0.5, 0.0)
    s_in = State(_randn(gen, B, H, D, Dv), _uniform(gen, (B, H, D), 0.5, 2.0))
    kw = dict(rule="gated", g=g, form="chunk", chunk_size=8)
    _, s_out = _attend(q, k, v, initial_state=s_in, **kw)
    _, s_zero = _attend(q, k, v, **kw)
    decay = torch.exp(g).prod(dim=1)  # [B, H, D]
    pairs["gated per-channel S"] = (s_out.S, decay[..., None] * s_in.S + s_zero.S)
    pairs["gated per-channel z"] = (s_out.z, decay * s_in.z + s_zero.z)
    return compare(name, tol, pairs, note=f"T={T}, chunk form")


def _low_precision(name: str, tol: float, seed: int, dtype: torch.dtype) -> CheckResult:
    """Inputs rounded to ``dtype`` through the chunk form (state in float32, the default) against the float64 loop
    on the same rounded inputs, so the error is the arithmetic's and the output rounding's, not the inputs'."""
    gen = _generator(seed, name)
    pairs: dict[str, tuple] = {}

    def cast(kw: dict, to: torch.dtype) -> dict:
        return {key: (val.to(to) if isinstance(val, (torch.Tensor, State)) else val) for key, val in kw.items()}

    for label, q, k, v, kw in _all_rule_cases(gen, B=1, T=64, H=2, D=8, Dv=4):
        low = [x.to(dtype) for x in (q, k, v)]
        kw_low = cast(kw, dtype)
        o_low, _ = _attend(*low, form="chunk", chunk_size=16, **kw_low)
        o_ref, _, _ = _reference(*(x.to(F64) for x in low), **cast(kw_low, F64))
        pairs[f"{label}: o"] = (o_low, o_ref)
    return compare(name, tol, pairs, note="T=64, chunk_size=16, float32 state")


@_check("float32 chunk vs float64 reference", FLOAT32_TOL)
def check_float32(name: str, tol: float, seed: int) -> CheckResult:
    """float32 inputs and state: only float32 arithmetic separates the chunk form from the float64 loop."""
    return _low_precision(name, tol, seed, torch.float32)


@_check("bfloat16 chunk vs float64 reference", BFLOAT16_TOL)
def check_bfloat16(name: str, tol: float, seed: int) -> CheckResult:
    """bfloat16 inputs and outputs, float32 state: the output's own rounding (8 bits) dominates the error."""
    return _low_precision(name, tol, seed, torch.bfloat16)


@_check("worked example: kernel (mechanism §1)")
def check_worked_example_kernel(name: str, tol: float, seed: int) -> CheckResult:
    """mechanism §1: phi(k) = [1,0],[0,1],[1,1], v = 2,4,3 gives S = [5,7], z = [2,2]; phi(q) = [2,1] reads 17/6."""

    def pairs():
        k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=F64).view(1, 3, 1, 2)
        v = torch.tensor([2.0, 4.0, 3.0], dtype=F64).view(1, 3, 1, 1)
        q = torch.tensor([[1.0, 1.0], [1.0, 1.0], [2.0, 1.0]], dtype=F64).view(1, 3, 1, 2)
        out = {}
        for form in linattn.supported_forms("accumulate"):
            o, s = _attend(q, k, v, form=form, scale=1.0, eps=0.0, chunk_size=2)
            out[f"{form} y_3"] = (o[0, 2, 0, 0], 17 / 6)
            out.update(_state_pairs(form, s, (torch.tensor([[[[5.0], [7.0]]]]), torch.tensor([[[2.0, 2.0]]]))))
        return out

    return compare(name, tol, pairs())


@_check("worked example: gate (mechanism §2)")
def check_worked_example_gate(name: str, tol: float, seed: int) -> CheckResult:
    """docs/mechanism.md §2: features 1, v = 2, 4, 8, alpha = 0.5: S = 2, 5, 10.5; z = 1, 1.5, 1.75; y = 2, 10/3, 6."""

    def pairs():
        ones = torch.ones(1, 3, 1, 1, dtype=F64)
        v = torch.tensor([2.0, 4.0, 8.0], dtype=F64).view(1, 3, 1, 1)
        g = torch.full((1, 3, 1), math.log(0.5), dtype=F64)
        out = {}
        for form in linattn.supported_forms("gated"):
            o, s = _attend(ones, ones, v, rule="gated", form=form, g=g, scale=1.0, eps=0.0, chunk_size=2)
            out[f"{form} y"] = (o.flatten(), [2.0, 10 / 3, 6.0])
            out[f"{form} z_3"] = (s.z.flatten(), [1.75])
            o, _ = _attend(ones, ones, v, rule="gated", form=form, g=g, scale=1.0, normalize=False, chunk_size=2)
            out[f"{form} S"] = (o.flatten(), [2.0, 5.0, 10.5])  # q = 1 reads S itself
        return out

    return compare(name, tol, pairs())


@_check("worked example: delta (mechanism §3)")
def check_worked_example_delta(name: str, tol: float, seed: int) -> CheckResult:
    """docs/mechanism.md §3: unit key, v = 5, beta = 0.5, S starting at 2: S = 3.5, 4.25, 4.625."""

    def pairs():
        ones = torch.ones(1, 3, 1, 1, dtype=F64)
        v, beta = 5 * ones, torch.full((1, 3, 1), 0.5, dtype=F64)
        s0 = State(torch.full((1, 1, 1, 1), 2.0, dtype=F64))
        want = [3.5, 4.25, 4.625]
        out = {}
        for form in linattn.supported_forms("delta"):
            o, _ = _attend(ones, ones, v, rule="delta", form=form, beta=beta, scale=1.0, initial_state=s0, chunk_size=2)
            out[f"{form} S"] = (o.flatten(), want)
        st, got = s0, []
        for t in range(3):
            o, st = linattn.step(ones[:, t], ones[:, t], v[:, t], st, rule="delta", beta=beta[:, t], scale=1.0)
            got.append(o.item())
        out["step S"] = (got, want)
        return out

    return compare(name, tol, pairs())


@contextlib.contextmanager
def one_thread():
    """The lab's tensors are tiny: extra intra-op threads only add synchronization (the whole lab took 3.1 s of CPU
    with 2 threads against 1.3 s with 1 on a busy 2-core machine). The caller's setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_checks(seed: int = 0) -> list[CheckResult]:
    """Every lab check on the inputs of ``seed``, in the order the command prints them."""
    with one_thread():
        return [check(seed) for check in CHECKS]
