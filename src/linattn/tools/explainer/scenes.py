"""The numbers behind every scripted scene of the explainer, computed once in float64 at build time.

Every value the page shows in a scripted scene comes from here: `linattn.reference` (the float64 loops) and
`linattn.tools.memory` (the byte formulas). The page's own JavaScript engine only powers what the learner edits
(the playground, the exercises, the sliders); the browser tests check it against the same reference.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from linattn import reference
from linattn.tools import memory

# docs/mechanism.md §1: phi(k) = [1,0], [0,1], [1,1]; v = 2, 4, 3; phi(q) = [2, 1] reads 17/6.
KERNEL_KEYS = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
KERNEL_VALUES = [2.0, 4.0, 3.0]
KERNEL_QUERY = [2.0, 1.0]
# The chunk scene continues that history with two more tokens; the same query then reads 74/11.
CHUNK_KEYS = KERNEL_KEYS + [[1.0, 0.0], [1.0, 1.0]]
CHUNK_VALUES = KERNEL_VALUES + [6.0, 15.0]


def _run(keys, values, query_rows, *, rule="accumulate", normalize=None, eps=0.0, eps_mode="add", g=None, beta=None,
         initial_S=None, initial_z=None) -> dict[str, Any]:
    """One head through the reference, token by token: S, z and y after each token (the reference on prefixes)."""
    k = np.asarray(keys, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).reshape(len(keys), -1)
    q = np.asarray(query_rows, dtype=np.float64)
    T, r = k.shape
    out: dict[str, Any] = {"S": [], "z": [], "y": []}
    for t in range(1, T + 1):
        kw = dict(rule=rule, normalize=normalize, scale=1.0, eps=eps, eps_mode=eps_mode)
        if g is not None:
            kw["g"] = np.asarray(g[:t], dtype=np.float64)[None, :, None]
        if beta is not None:
            kw["beta"] = np.asarray(beta[:t], dtype=np.float64)[None, :, None]
        if initial_S is not None:
            kw["initial_S"] = np.asarray(initial_S, dtype=np.float64).reshape(1, 1, r, v.shape[1])
        if initial_z is not None:
            kw["initial_z"] = np.asarray(initial_z, dtype=np.float64).reshape(1, 1, r)
        o, S, z = reference.linear_attention(q[None, :t, None], k[None, :t, None], v[None, :t, None], **kw)
        out["S"].append(S[0, 0].tolist())
        out["z"].append(None if z is None else z[0, 0].tolist())
        out["y"].append(o[0, t - 1, 0].tolist())
    return out


def softmax_scene() -> dict[str, Any]:
    """Five cached 2-d keys scored by two queries: softmax weights exp(q.k / sqrt d) / sum, and the cost per step."""
    keys = np.array([[1.0, 0.2], [0.1, 1.0], [0.9, 0.8], [-0.6, 0.4], [0.3, -0.9]])
    values = np.array([2.0, 4.0, 3.0, 1.0, 5.0])
    queries = np.array([[1.5, 0.0], [0.0, 1.5]])
    scenes = []
    for q in queries:
        logits = keys @ q / math.sqrt(keys.shape[1])
        w = np.exp(logits - logits.max())
        w /= w.sum()
        scenes.append({"q": q.tolist(), "logits": logits.tolist(), "weights": w.tolist(), "y": float(w @ values)})
    d = 128  # one head of width 128: the cache reads 2 n d numbers per step, the state r dv + r with r = dv = d
    cost = [{"n": n, "kv_floats": n * 2 * d, "state_floats": d * d + d} for n in range(0, 257, 16)]
    return {"keys": keys.tolist(), "values": values.tolist(), "queries": scenes, "cost": cost}


def rewrite_scene() -> dict[str, Any]:
    """The feature maps on a grid, and kernel weights against softmax weights for the softmax scene's first query."""
    xs = np.linspace(-3.0, 3.0, 61)
    sm = softmax_scene()
    keys = np.array(sm["keys"])
    q = np.array(sm["queries"][0]["q"])
    phi_q, phi_k = reference.elu1(q), reference.elu1(keys)
    a = phi_k @ phi_q
    return {
        "x": xs.tolist(),
        "elu1": reference.elu1(xs).tolist(),
        "relu1": reference.relu1(xs).tolist(),
        "kernel_weights": (a / a.sum()).tolist(),
        "softmax_weights": sm["queries"][0]["weights"],
    }


def matrix_scene() -> dict[str, Any]:
    """Two tokens with 2-d values: k1 = [1,0], v1 = [2,1]; k2 = [0,1], v2 = [4,3]; q = [2,1] reads [8/3, 5/3]."""
    keys, values = [[1.0, 0.0], [0.0, 1.0]], [[2.0, 1.0], [4.0, 3.0]]
    run = _run(keys, values, [KERNEL_QUERY] * 2)
    outers = [np.outer(k, v).tolist() for k, v in zip(keys, values, strict=True)]
    S, z, q = np.array(run["S"][-1]), np.array(run["z"][-1]), np.array(KERNEL_QUERY)
    scores = np.array(keys) @ q  # q.k_i: the unnormalized weight of each token
    return {"keys": keys, "values": values, "query": KERNEL_QUERY, "outers": outers, "S": S.tolist(),
            "z": z.tolist(), "num": (q @ S).tolist(), "den": float(q @ z), "y": run["y"][-1],
            "scores": scores.tolist(), "weights": (scores / scores.sum()).tolist()}


def dense_scene() -> dict[str, Any]:
    """The running example all at once: A = (Q K^T) * M, Y = A V / rowsum(A), equal to the token loop's outputs."""
    Q = np.tile(KERNEL_QUERY, (len(KERNEL_KEYS), 1))
    K, V = np.array(KERNEL_KEYS), np.array(KERNEL_VALUES)[:, None]
    M = np.tril(np.ones((len(K), len(K))))
    A = (Q @ K.T) * M
    loop = _run(KERNEL_KEYS, KERNEL_VALUES, Q.tolist())
    return {"A": A.tolist(), "mask": M.tolist(), "AV": (A @ V)[:, 0].tolist(), "rowsum": A.sum(axis=1).tolist(),
            "Y": ((A @ V)[:, 0] / A.sum(axis=1)).tolist(), "loop_y": [y[0] for y in loop["y"]]}


def tokens_scene() -> dict[str, Any]:
    """docs/mechanism.md §1 token by token: S and z after each write, then the read 17 / 6."""
    run = _run(KERNEL_KEYS, KERNEL_VALUES, [KERNEL_QUERY] * 3)
    S, z, q = np.array(run["S"][-1]), np.array(run["z"][-1]), np.array(KERNEL_QUERY)
    return {"keys": KERNEL_KEYS, "values": KERNEL_VALUES, "query": KERNEL_QUERY, **run,
            "num": float((q @ S)[0]), "den": float(q @ z), "y_final": float(run["y"][-1][0])}


def whyz_scene(repeats: int = 8) -> dict[str, Any]:
    """One pair (phi(k) = [1, 1], v = 3) written m times, read by phi(q) = [2, 1], with and without z."""
    rows = []
    for m in range(1, repeats + 1):
        keys, values, qs = [[1.0, 1.0]] * m, [3.0] * m, [KERNEL_QUERY] * m
        norm = _run(keys, values, qs)["y"][-1][0]
        raw = _run(keys, values, qs, normalize=False)["y"][-1][0]
        rows.append({"m": m, "normalized": norm, "unnormalized": raw})
    return {"key": [1.0, 1.0], "value": 3.0, "query": KERNEL_QUERY, "rows": rows}


def eps_scene(eps: float = 1e-6) -> dict[str, Any]:
    """One token whose feature is d and value 3, read by q = 1: the exact answer is 3 for every d > 0.

    ``case``: numerator 2e-6 over denominator 1e-6 (exact ratio 2) under eps = 1e-6 and 1e-8, added or clamped.
    """
    rows = []
    for d in (1.0, 1e-3, 1e-5, 1e-6, 1e-7, 1e-9):
        row = {"den": d}
        for mode in ("add", "clamp"):
            row[mode] = _run([[d]], [3.0], [[1.0]], eps=eps, eps_mode=mode)["y"][0][0]
        rows.append(row)
    case = [{"eps": e, "mode": mode, "y": _run([[1e-6]], [2.0], [[1.0]], eps=e, eps_mode=mode)["y"][0][0]}
            for e in (1e-6, 1e-8) for mode in ("add", "clamp")]
    return {"eps": eps, "value": 3.0, "rows": rows, "case": {"num": 2e-6, "den": 1e-6, "reads": case}}


def memory_scene() -> dict[str, Any]:
    """The worked bytes of docs/mechanism.md §4 through linattn.tools.memory (the page recomputes them when edited)."""
    B, L, H, r, dv, d = 1, 32, 16, 128, 128, 128
    total = memory.state_bytes(B, L, H, r, dv, "float32")
    per_head_state = memory.state_bytes(1, 1, 1, r, dv, "float32")
    per_head_kv_token = memory.kv_cache_bytes(1, 1, 1, d, 1, "bfloat16")
    return {
        "inputs": {"B": B, "L": L, "H": H, "r": r, "dv": dv, "state_dtype": "float32", "kv_heads": H, "head_dim": d,
                   "kv_dtype": "bfloat16", "normalizer": True},
        "dtype_bytes": {name: memory.dtype_bytes(name) for name in ("float64", "float32", "bfloat16", "float16")},
        "state_bytes": total,
        "per_head_state_bytes": per_head_state,
        "per_head_kv_bytes_per_token": per_head_kv_token,
        "crossover": memory.crossover_length(per_head_state, per_head_kv_token),
        "kv_at": {str(T): memory.kv_cache_bytes(1, 1, 1, d, T, "bfloat16") for T in (32, 129, 8192)},
    }


def gates_scene() -> dict[str, Any]:
    """docs/mechanism.md §2: features 1, v = 2, 4, 8, alpha = 0.5; token weights; the scan's composed pairs."""
    alpha = [0.5, 0.5, 0.5]
    run = _run([[1.0]] * 3, [2.0, 4.0, 8.0], [[1.0]] * 3, rule="gated", g=np.log(alpha))
    T = len(alpha)
    weights = [[float(np.prod(alpha[i + 1 : t + 1])) if i <= t else None for i in range(T)] for t in range(T)]
    # Scan over four tokens with gates a_t and writes B_t = phi(k_t) v_t (one feature, values 2, 4, 8, 16).
    a = [0.5, 0.5, 0.5, 0.5]
    Bs = [2.0, 4.0, 8.0, 16.0]
    leaves = [{"a": x, "B": y} for x, y in zip(a, Bs, strict=True)]

    def compose(second, first):  # (a2, B2) o (a1, B1) = (a2 a1, a2 B1 + B2)
        return {"a": second["a"] * first["a"], "B": second["a"] * first["B"] + second["B"]}

    level1 = [compose(leaves[1], leaves[0]), compose(leaves[3], leaves[2])]
    root = compose(level1[1], level1[0])
    loop = _run([[1.0]] * 4, Bs, [[1.0]] * 4, rule="gated", g=np.log(a), normalize=False)
    # Every prefix, not only the root: prefix 3 = leaf 3 o prefix 2, prefix 4 = the level-1 pair o prefix 2.
    prefixes = [leaves[0], level1[0], compose(leaves[2], level1[0]), root]
    swapped = compose(leaves[0], leaves[1])  # token 1's map applied after token 2's: not the same state
    zmaps = [{"a": x, "B": 1.0} for x in a]  # z composes alike with B = phi(k) = 1
    zroot = compose(compose(zmaps[3], zmaps[2]), compose(zmaps[1], zmaps[0]))
    loop_z = _run([[1.0]] * 4, Bs, [[1.0]] * 4, rule="gated", g=np.log(a))["z"][-1][0]
    return {"alpha": alpha, "values": [2.0, 4.0, 8.0], **run, "weights": weights,
            "scan": {"leaves": leaves, "level1": level1, "root": root, "loop_S": loop["S"][-1][0][0],
                     "prefixes": prefixes, "loop_prefix_S": [S[0][0] for S in loop["S"]], "swapped": swapped,
                     "z_root": zroot, "loop_z": loop_z}}


def delta_scene(writes: int = 8) -> dict[str, Any]:
    """The delta rule's worked numbers: one write on a 2-row memory, repeated writes, and the key norm's effect.

    One write: S = [[2], [4]], key [1, 0], target 5, beta = 0.5: prediction 2, error 3, S[0] = 3.5, S[1] stays 4.
    Repeated: unit key, v = 5, S from 2: 3.5, 4.25, 4.625 (errors 3, 1.5, 0.75). Norm: |k| = 2, beta = 1 multiplies
    the error by 1 - 4 = -3 per write.
    """
    S0 = [[2.0], [4.0]]
    one = _run([[1.0, 0.0]], [5.0], [[0.0, 1.0]], rule="delta", beta=[0.5], initial_S=S0)
    one_write = {"S0": S0, "key": [1.0, 0.0], "target": 5.0, "beta": 0.5, "prediction": S0[0][0],
                 "error": 5.0 - S0[0][0], "S": one["S"][0], "orthogonal_read": one["y"][0][0]}
    curves = []
    for beta in (0.5, 1.0, 1.5, 2.5):
        run = _run([[1.0]] * writes, [5.0] * writes, [[1.0]] * writes, rule="delta", beta=[beta] * writes,
                   initial_S=[[2.0]])
        S = [2.0] + [s[0][0] for s in run["S"]]
        curves.append({"beta": beta, "S": S, "errors": [5.0 - x for x in S]})
    norm2 = _run([[2.0]] * 3, [5.0] * 3, [[2.0]] * 3, rule="delta", beta=[1.0] * 3, initial_S=[[2.0]])
    reads = [4.0] + [y[0] for y in norm2["y"]]  # k S before and after each write (k = 2, S from 2)
    return {"value": 5.0, "start": 2.0, "curves": curves, "one_write": one_write,
            "norm2": {"k": 2.0, "beta": 1.0, "reads": reads, "errors": [5.0 - x for x in reads]}}


def _chunk_form(keys, values, q, size):
    """The chunk form written out: each chunk reads the carried (S, z) plus its own masked block, then hands on."""
    K, V, Q = np.asarray(keys), np.asarray(values)[:, None], np.asarray(q)
    S, z = np.zeros((K.shape[1], 1)), np.zeros(K.shape[1])
    chunks = []
    for start in range(0, len(K), size):
        Kc, Vc = K[start : start + size], V[start : start + size]
        Qc = np.tile(Q, (len(Kc), 1))
        mask = np.tril(np.ones((len(Kc), len(Kc))))
        A = (Qc @ Kc.T) * mask
        inter_num, inter_den = Qc @ S, Qc @ z
        intra_num, intra_den = A @ Vc, A.sum(axis=1)
        y = (inter_num + intra_num)[:, 0] / (inter_den + intra_den)
        chunks.append({"start": start, "stop": start + len(Kc), "inter_num": inter_num[:, 0].tolist(),
                       "inter_den": inter_den.tolist(), "intra_num": intra_num[:, 0].tolist(),
                       "intra_den": intra_den.tolist(), "y": y.tolist(), "S_in": S[:, 0].tolist(),
                       "z_in": z.tolist()})
        S, z = S + Kc.T @ Vc, z + Kc.sum(axis=0)
        chunks[-1].update({"S_out": S[:, 0].tolist(), "z_out": z.tolist()})
    return chunks


def chunks_scene() -> dict[str, Any]:
    """Five tokens in chunks of every size 1..5: same outputs as the token loop, the last one 74/11."""
    run = _run(CHUNK_KEYS, CHUNK_VALUES, [KERNEL_QUERY] * len(CHUNK_KEYS))
    layouts = {str(c): _chunk_form(CHUNK_KEYS, CHUNK_VALUES, KERNEL_QUERY, c) for c in range(1, len(CHUNK_KEYS) + 1)}
    q, S, z = np.array(KERNEL_QUERY), np.array(run["S"][-1])[:, 0], np.array(run["z"][-1])
    return {"keys": CHUNK_KEYS, "values": CHUNK_VALUES, "query": KERNEL_QUERY, "loop_y": [y[0] for y in run["y"]],
            "layouts": layouts, "num": float(q @ S), "den": float(q @ z)}


def devices_scene() -> dict[str, Any]:
    """docs/mechanism.md §6 with gated delta: two segments run from zero, report (P, Q), compose to the one pass."""
    keys = [[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6]]
    values, alpha, beta = [2.0, 4.0, 3.0, 5.0], [0.9] * 4, [0.5] * 4
    g = np.log(alpha)
    segments = []
    for lo, hi in ((0, 2), (2, 4)):
        P = np.eye(2)
        for t in range(lo, hi):  # S -> a (I - beta k k^T) S + ..., composed in token order
            k = np.array(keys[t])
            P = alpha[t] * (np.eye(2) - beta[t] * np.outer(k, k)) @ P
        Q = _run(keys[lo:hi], values[lo:hi], [[1.0, 0.0]] * (hi - lo), rule="gated_delta", g=g[lo:hi],
                 beta=beta[lo:hi])["S"][-1]
        segments.append({"tokens": [lo + 1, hi], "P": P.tolist(), "Q": Q})
    P2, Q1, Q2 = np.array(segments[1]["P"]), np.array(segments[0]["Q"]), np.array(segments[1]["Q"])
    one_pass = _run(keys, values, [[1.0, 0.0]] * 4, rule="gated_delta", g=g, beta=beta)["S"][-1]
    return {"keys": keys, "values": values, "alpha": alpha, "beta": beta, "segments": segments,
            "composed": (P2 @ Q1 + Q2).tolist(), "one_pass": one_pass}


def long_scene() -> dict[str, Any]:
    """Rescaling S and z by c (and eps with them) keeps the current read; a later write at the old scale does not."""
    keys, values, q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [2.0, 4.0, 3.0], [[2.0, 1.0]]
    eps, c = 1e-6, 0.5
    base = _run(keys, values, q * 3, eps=eps)
    S, z = np.array(base["S"][-1]), np.array(base["z"][-1])
    nxt_k, nxt_v = [[1.0, 1.0]], [9.0]
    same = _run([[0.0, 0.0]], [0.0], q, eps=eps * c, initial_S=S * c, initial_z=z * c)  # a zero key writes nothing
    plain = _run(nxt_k, nxt_v, q, eps=eps, initial_S=S, initial_z=z)["y"][0][0]
    scaled = _run(nxt_k, nxt_v, q, eps=eps * c, initial_S=S * c, initial_z=z * c)["y"][0][0]
    return {"c": c, "eps": eps, "S": S.tolist(), "z": z.tolist(), "y": base["y"][-1][0],
            "y_rescaled": same["y"][0][0], "next": {"k": nxt_k[0], "v": nxt_v[0], "y": plain, "y_rescaled": scaled}}


def quality_scene() -> dict[str, Any]:
    """The hypothetical of flat decode time and falling retrieval, labelled as such, and its diagnosis table."""
    return {"hypothetical": {"lengths": ["2K", "8K", "32K"], "ms": [0.3, 0.3, 0.3], "accuracy": [98, 89, 61]}}


def exercises() -> list[dict[str, Any]]:
    """The three exercises' answers, from the reference."""
    k3, v3 = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[2.0, 1.0], [4.0, 3.0], [3.0, 2.0]]
    one = _run(k3, v3, [KERNEL_QUERY] * 3)
    q, S, z = np.array(KERNEL_QUERY), np.array(one["S"][-1]), np.array(one["z"][-1])
    alpha = [1.0, 0.5, 0.25]
    two = _run([[1.0]] * 3, [2.0, 4.0, 8.0], [[1.0]] * 3, rule="gated", g=np.log(alpha))
    coeffs = [float(np.prod(alpha[i + 1 :])) for i in range(3)]
    three = _run([[2.0]], [5.0], [[2.0]], rule="delta", beta=[0.5], initial_S=[[1.0]])
    fixed = _run([[2.0]], [5.0], [[2.0]], rule="delta", beta=[0.25], initial_S=[[1.0]])
    exercises = [
        {"id": "matrix3", "S": S.tolist(), "z": z.tolist(), "num": (q @ S).tolist(), "den": float(q @ z),
         "answers": one["y"][-1]},
        {"id": "gate", "alpha": alpha, "coeffs": coeffs, "num": float(two["S"][-1][0][0]),
         "den": float(two["z"][-1][0]), "answers": [two["y"][-1][0]]},
        {"id": "delta_k2", "prediction": 2.0, "error": 3.0, "S": three["S"][0][0][0], "answers":
         [three["S"][0][0][0], three["y"][0][0]], "fixed_beta": 0.25, "fixed_S": fixed["S"][0][0][0],
         "fixed_prediction": fixed["y"][0][0]},
    ]
    for ex in exercises:  # each answer as an exact fraction too, so the page can tell 74/11 from 6.7
        ex["fractions"] = [_fraction(x) for x in ex["answers"]]
    return exercises


def _fraction(x: float) -> list[int]:
    """[numerator, denominator] of a float that is a small fraction (the exercises' answers); checked, not guessed."""
    f = Fraction(x).limit_denominator(1000)
    if abs(float(f) - x) > 1e-12 * max(1.0, abs(x)):
        raise ValueError(f"{x!r} is not a fraction with a denominator up to 1000")
    return [f.numerator, f.denominator]


def lab_scene() -> dict[str, Any]:
    """What ``python3 lab.py`` prints, from running the lab itself at build time, and its chunk sizes."""
    import contextlib
    import io

    from linattn.tools.explainer import lab_standalone

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = lab_standalone.main([])
    if status != 0:
        raise RuntimeError("lab.py fails its own checks:\n" + out.getvalue())
    return {"output": out.getvalue().splitlines(), "checks": [name for name, _ in lab_standalone.CHECKS],
            "chunk_sizes": list(lab_standalone.CHUNK_SIZES)}


def build_data() -> dict[str, Any]:
    """Everything the page's scripted scenes show, as plain JSON-able values."""
    from linattn.tools.explainer.measured import load_measured

    return {
        "softmax": softmax_scene(),
        "rewrite": rewrite_scene(),
        "matrix": matrix_scene(),
        "dense": dense_scene(),
        "tokens": tokens_scene(),
        "whyz": whyz_scene(),
        "eps": eps_scene(),
        "memory": memory_scene(),
        "gates": gates_scene(),
        "delta": delta_scene(),
        "chunks": chunks_scene(),
        "devices": devices_scene(),
        "long": long_scene(),
        "quality": quality_scene(),
        "exercises": exercises(),
        "lab": lab_scene(),
        "measured": load_measured(),
    }
