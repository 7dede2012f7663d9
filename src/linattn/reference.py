"""Float64 NumPy ground truth for every rule: plain loops, written to be read, not to be fast.

Everything here follows ``docs/mechanism.md`` literally, one token at a time, so that each fast torch form in
`linattn.ops` can be checked against it. No torch import: the reference must not share code with what it
checks.

* `positive_feature_map` and `linear_attention_scan`: the basic normalized linear attention of one
  head on ``[T, D]`` arrays (docs/mechanism.md §1).
* `linear_attention`: all four rules with the torch API's layout ``[B, T, H, D]`` and arguments.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

RULES = ("accumulate", "gated", "delta", "gated_delta")
GATED_RULES = ("gated", "gated_delta")
DELTA_RULES = ("delta", "gated_delta")
EPS_MODES = ("add", "clamp")

NumpyFeatureMap = Callable[[np.ndarray], np.ndarray]


def _as_float64(name: str, x: object) -> np.ndarray:
    """Any real numeric array-like as float64; bool, complex and object arrays are refused, not guessed at."""
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _check_2d(name: str, x: object) -> np.ndarray:
    arr = _as_float64(name, x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array [T, D], got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must be non-empty, got shape {arr.shape}")
    return arr


# ---------------------------------------------------------------------------------------------------------------
# docs/mechanism.md §1 on one head: phi = relu + 1, exact division, current token included.


def positive_feature_map(x: object) -> np.ndarray:
    """``relu(x) + 1`` elementwise: same shape as ``x``, every element >= 1 (so strictly positive)."""
    arr = _check_2d("x", x)
    return np.maximum(arr, 0.0) + 1.0


def linear_attention_scan(
    queries: object, keys: object, values: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Causal normalized linear attention of one head, token by token.

    ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``, ``y_t = phi(q_t)^T S_t / phi(q_t)^T z_t``
    with ``phi = relu + 1``; the state is written before it is read, so token t sees itself.

    Args:
        queries, keys: ``[T, D]``, same shape. values: ``[T, Dv]``.

    Returns:
        ``(outputs [T, Dv], final_state [D, Dv], final_normalizer [D])``, float64.
    """
    q = _check_2d("queries", queries)
    k = _check_2d("keys", keys)
    v = _check_2d("values", values)
    if q.shape != k.shape:
        raise ValueError(f"queries and keys must have the same shape [T, D], got {q.shape} and {k.shape}")
    if v.shape[0] != q.shape[0]:
        raise ValueError(f"values must have the same length T as queries, got {v.shape[0]} and {q.shape[0]}")
    phi_q, phi_k = positive_feature_map(q), positive_feature_map(k)
    T, D = q.shape
    S = np.zeros((D, v.shape[1]))
    z = np.zeros(D)
    outputs = np.zeros((T, v.shape[1]))
    for t in range(T):
        S = S + np.outer(phi_k[t], v[t])
        z = z + phi_k[t]
        outputs[t] = (phi_q[t] @ S) / (phi_q[t] @ z)
    return outputs, S, z


# ---------------------------------------------------------------------------------------------------------------
# Feature maps: NumPy twins of linattn.feature_maps, same names, same formulas.


def relu1(x: np.ndarray) -> np.ndarray:
    """relu(x) + 1."""
    return np.maximum(x, 0.0) + 1.0


def elu1(x: np.ndarray) -> np.ndarray:
    """elu(x) + 1: x + 1 for x > 0, exp(x) otherwise (no cancellation of -1 + 1 for very negative x)."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def identity(x: np.ndarray) -> np.ndarray:
    """No map."""
    return x


def l2(x: np.ndarray) -> np.ndarray:
    """x / sqrt(sum x^2 + 1e-6) over the last axis."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def taylor2(x: np.ndarray) -> np.ndarray:
    """Based's 2nd-order Taylor map, width 1 + D + D^2: phi(q).phi(k) = 1 + s + s^2 / 2 with s = q.k / sqrt(D)."""
    d = x.shape[-1]
    x = x / d**0.25
    ones = np.ones(x.shape[:-1] + (1,))
    outer = (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (d * d,)) / math.sqrt(2)
    return np.concatenate([ones, x, outer], axis=-1)


FEATURE_MAPS: dict[str, NumpyFeatureMap] = {
    "relu1": relu1, "elu1": elu1, "identity": identity, "taylor2": taylor2, "l2": l2,
}

# Maps a user passes as callables (the tests use these two): NumPy twins, so that the reference computes them
# without torch. They are not names of linattn's torch API.


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), written as logaddexp(0, x) so that it neither overflows nor rounds to 0."""
    return np.logaddexp(0.0, x)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """x / |x| over the last axis (DeltaNet's unit-norm keys)."""
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _resolve_feature_map(feature_map: str | NumpyFeatureMap | None) -> NumpyFeatureMap | None:
    if feature_map is None or callable(feature_map):
        return feature_map
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map: unknown name {feature_map!r}; expected one of "
                             f"{', '.join(sorted(FEATURE_MAPS))}")
        return FEATURE_MAPS[feature_map]
    raise TypeError(f"feature_map must be None, a name or a callable, got {type(feature_map).__name__}")


# ---------------------------------------------------------------------------------------------------------------
# All rules, [B, T, H, D] layout, the semantics of linattn.linear_attention.


def _check_inputs(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    q, k, v = _as_float64("q", q), _as_float64("k", k), _as_float64("v", v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be [B, T, H, D], got shape {x.shape}")
    if q.shape != k.shape:
        raise ValueError(f"q and k must have the same shape [B, T, H, D], got q {q.shape} and k {k.shape}")
    if v.shape[:2] != q.shape[:2] or v.shape[2] % max(q.shape[2], 1):
        raise ValueError(f"v must match q on [B, T] and have a multiple of its H heads, got q {q.shape}, v {v.shape}")
    if q.shape[1] == 0:
        raise ValueError(f"empty sequence: q, k, v have T = 0 (shape {q.shape})")
    if min(q.shape) == 0 or min(v.shape) == 0:
        raise ValueError(f"q, k, v must have no empty dimension, got q {q.shape} and v {v.shape}")
    return q, k, v


def _check_options(rule, normalize, eps, eps_mode, scale) -> bool:
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; expected one of {', '.join(RULES)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    if eps_mode not in EPS_MODES:
        raise ValueError(f"eps_mode: unknown mode {eps_mode!r}; expected one of {', '.join(EPS_MODES)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if normalize is None:
        return rule not in DELTA_RULES
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool or None, got {type(normalize).__name__}")
    if normalize and rule in DELTA_RULES:
        raise ValueError(f"normalize=True: rule {rule!r} defines no normalizer z; pass normalize=False or None")
    return normalize


def _check_gate(rule: str, g, B: int, T: int, H: int, r: int) -> np.ndarray | None:
    if rule not in GATED_RULES:
        if g is not None:
            raise ValueError(f"g: rule {rule!r} has no gate; use rule='gated' or 'gated_delta', or pass g=None")
        return None
    if g is None:
        raise ValueError(f"g: rule {rule!r} needs a log-gate g (alpha = exp(g), g <= 0)")
    g = _as_float64("g", g)
    ok = [(B, T, H), (B, T, H, r)]
    if g.shape not in ok:
        raise ValueError(f"g must have shape {' or '.join(map(str, ok))} for rule {rule!r}, got {g.shape}")
    if (g > 0).any():
        raise ValueError(f"g must be <= 0 (alpha = exp(g) <= 1); its largest value is {g.max():.4g}")
    return g


def _check_beta(rule: str, beta, B: int, T: int, H: int) -> np.ndarray | None:
    if rule not in DELTA_RULES:
        if beta is not None:
            raise ValueError(f"beta: rule {rule!r} has no write strength; use rule='delta' or 'gated_delta'")
        return None
    if beta is None:
        raise ValueError(f"beta: rule {rule!r} needs a write strength beta of shape {(B, T, H)}")
    beta = _as_float64("beta", beta)
    if beta.shape != (B, T, H):
        raise ValueError(f"beta must have shape {(B, T, H)}, got {beta.shape}")
    return beta


def _initial(initial_S, initial_z, normalize: bool, B: int, H: int, r: int, Dv: int):
    if normalize and (initial_S is None) != (initial_z is None):
        missing = "initial_z" if initial_z is None else "initial_S"
        raise ValueError(f"{missing} is None: a normalized initial state needs both initial_S and initial_z")
    if not normalize and initial_z is not None:
        raise ValueError("initial_z is set but normalize=False keeps no normalizer; pass initial_z=None")
    S = np.zeros((B, H, r, Dv)) if initial_S is None else _as_float64("initial_S", initial_S)
    if S.shape != (B, H, r, Dv):
        raise ValueError(f"initial_S must be [B, H, Dk, Dv] = {(B, H, r, Dv)}, got {S.shape}")
    if not normalize:
        return S.copy(), None
    z = np.zeros((B, H, r)) if initial_z is None else _as_float64("initial_z", initial_z)
    if z.shape != (B, H, r):
        raise ValueError(f"initial_z must be [B, H, Dk] = {(B, H, r)}, got {z.shape}")
    return S.copy(), z.copy()


def _divide(num: np.ndarray, den: float, eps: float, eps_mode: str) -> np.ndarray:
    """The library's two epsilon conventions; ``eps = 0`` with ``"add"`` is exact division."""
    if eps_mode == "add":
        return num / (den + eps)
    return num / max(den, eps)


def linear_attention(
    q: object,
    k: object,
    v: object,
    *,
    rule: str = "accumulate",
    feature_map: str | NumpyFeatureMap | None = None,
    normalize: bool | None = None,
    scale: float | None = None,
    eps: float = 1e-6,
    eps_mode: str = "add",
    g: object | None = None,
    beta: object | None = None,
    initial_S: object | None = None,
    initial_z: object | None = None,
    cu_seqlens: object | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Every rule of `linattn.linear_attention` as a plain loop over batch, head and token, in float64.

    Shapes and meanings are those of the torch API: ``q, k [B, T, Hq, D]``, ``v [B, T, H, Dv]`` (H a multiple of
    Hq: value head h reads q/k head ``h // (H / Hq)``), ``g [B, T, H]`` (or ``[B, T, H, r]``, a gate per key
    channel, for both gated rules), ``beta [B, T, H]``, ``initial_S [B, H, r, Dv]``, ``initial_z [B, H, r]``
    where ``r`` is the feature width. The query features are multiplied by ``scale`` (default ``r ** -0.5``).
    A callable ``feature_map`` gets and returns NumPy arrays ``[..., D] -> [..., r]``.

    Per token, with ``a = exp(g_t)`` (a number, or a vector for a per-channel gate acting as ``diag(a)``)::

        accumulate:  S = S + k v^T                        z = z + k
        gated:       S = a S + k v^T                      z = a z + k
        delta:       u = beta (v - S^T k);  S = S + k u^T
        gated_delta: S = a S;  u = beta (v - S^T k);  S = S + k u^T
                     (i.e. S_t = (I - beta k k^T) diag(a) S_{t-1} + beta k v^T: Kimi Delta Attention per channel)
        output:      o = S^T q,  divided by (q^T z + eps) ("add") or max(q^T z, eps) ("clamp") when normalized

    ``cu_seqlens`` (``[N + 1]`` ints, 0 ... T, with B = 1): N packed sequences, each run alone from its own
    initial state (``initial_S [N, H, r, Dv]``); an empty one returns its initial state.

    Returns:
        ``(o [B, T, H, Dv], S [B, H, r, Dv], z [B, H, r] or None)``, float64 (``S [N, ...]`` when packed).
    """
    if cu_seqlens is not None:
        return _packed(q, k, v, cu_seqlens, initial_S=initial_S, initial_z=initial_z, rule=rule,
                       feature_map=feature_map, normalize=normalize, scale=scale, eps=eps, eps_mode=eps_mode, g=g,
                       beta=beta)
    q, k, v = _check_inputs(q, k, v)
    normalize = _check_options(rule, normalize, eps, eps_mode, scale)
    fmap = _resolve_feature_map(feature_map)
    if fmap is not None:
        q, k = _as_float64("feature_map(q)", fmap(q)), _as_float64("feature_map(k)", fmap(k))
        if q.shape != k.shape or q.shape[:-2] != v.shape[:-2]:
            raise ValueError(f"feature_map gave q features {q.shape} and k features {k.shape} for v {v.shape}")
    B, T, Hq, r = q.shape
    H, Dv = v.shape[-2:]  # value heads: q/k head h // (H / Hq) serves value head h (repeat_interleave)
    group = H // Hq
    q = q * (r**-0.5 if scale is None else scale)
    g = _check_gate(rule, g, B, T, H, r)
    beta = _check_beta(rule, beta, B, T, H)
    S_all, z_all = _initial(initial_S, initial_z, normalize, B, H, r, Dv)

    o = np.zeros((B, T, H, Dv))
    for b in range(B):
        for h in range(H):
            S = S_all[b, h]
            z = None if z_all is None else z_all[b, h]
            for t in range(T):
                qt, kt, vt = q[b, t, h // group], k[b, t, h // group], v[b, t, h]
                if g is not None:
                    a = np.exp(g[b, t, h])  # scalar, or [r] for a per-channel gate
                    a_col = a[:, None] if np.ndim(a) else a  # diag(a) S scales the rows of S
                    S = a_col * S
                    if z is not None:
                        z = a * z
                if rule in DELTA_RULES:
                    u = beta[b, t, h] * (vt - S.T @ kt)  # read the memory for k, then write the error
                    S = S + np.outer(kt, u)
                else:
                    S = S + np.outer(kt, vt)
                    if z is not None:
                        z = z + kt
                num = S.T @ qt
                o[b, t, h] = num if z is None else _divide(num, float(qt @ z), eps, eps_mode)
            S_all[b, h] = S
            if z_all is not None:
                z_all[b, h] = z
    return o, S_all, z_all


def _packed(q, k, v, cu_seqlens, *, initial_S, initial_z, **kwargs):
    """`linear_attention` with ``cu_seqlens``: one call per sequence, states passed through empty ones."""
    q, k, v = _check_inputs(q, k, v)
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 2 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"cu_seqlens must be 1-D integers [N + 1], got {cu.dtype} shape {cu.shape}")
    if q.shape[0] != 1 or cu[0] != 0 or cu[-1] != q.shape[1] or (np.diff(cu) < 0).any():
        raise ValueError(f"cu_seqlens must run 0 ... T = {q.shape[1]} nondecreasing with B = 1, got {cu.tolist()}")
    per_token = {n: kwargs.pop(n) for n in ("g", "beta")}
    per_token = {n: (None if x is None else _as_float64(n, x)) for n, x in per_token.items()}
    outputs, states, norms = [], [], []
    for i in range(cu.size - 1):
        a, b = int(cu[i]), int(cu[i + 1])
        S0 = None if initial_S is None else _as_float64("initial_S", initial_S)[i:i + 1]
        z0 = None if initial_z is None else _as_float64("initial_z", initial_z)[i:i + 1]
        if a == b:  # no token: the state passes through (zeros when none was given)
            if S0 is None:
                probe = linear_attention(q[:, :1], k[:, :1], v[:, :1], initial_S=None, initial_z=None,
                                         **{n: (None if x is None else x[:, :1]) for n, x in per_token.items()},
                                         **kwargs)
                S0 = np.zeros_like(probe[1])
                z0 = None if probe[2] is None else np.zeros_like(probe[2])
            states.append(S0)
            norms.append(z0)
            continue
        o, S, z = linear_attention(q[:, a:b], k[:, a:b], v[:, a:b], initial_S=S0, initial_z=z0,
                                   **{n: (None if x is None else x[:, a:b]) for n, x in per_token.items()}, **kwargs)
        outputs.append(o)
        states.append(S)
        norms.append(z)
    o = np.concatenate(outputs, axis=1)
    return o, np.concatenate(states), (None if norms[0] is None else np.concatenate(norms))
