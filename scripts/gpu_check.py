"""GPU measurements for issue 14 (run by scripts/gpu_check.sh on a CUDA machine; untested on hardware so far).

    python scripts/gpu_check.py decode --out DIR    # the experiment: one decode step, KV cache vs fixed state
    python scripts/gpu_check.py chunk  --out DIR    # chunk forward / forward+backward against fla's Triton kernels

Both write one JSON file under DIR (never overwriting) and print a table. Every candidate is timed alone with CUDA
events around a batch of steps after a warmup (and per-step events for the median), peak device memory from
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. A candidate that fails is recorded with its
error, never dropped or invented. Outputs are checked against a reference before they are timed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import linattn  # noqa: E402
import linattn.api  # noqa: E402
from linattn.kernels import triton as lt  # noqa: E402

RULES = ("accumulate", "gated", "delta", "gated_delta")


DEV = "cuda"  # --smoke: "cpu" under TRITON_INTERPRET=1, tiny shapes, to exercise this script without a GPU


def timed(fn, warmup: int, repeats: int) -> dict:
    """Median and mean ms per call (CUDA events), and the peak memory above what was allocated before."""
    if DEV == "cpu":
        t0 = time.perf_counter()
        for _ in range(max(1, repeats)):
            fn()
        ms = (time.perf_counter() - t0) * 1e3 / max(1, repeats)
        return {"mean_ms": ms, "median_ms": ms, "peak_extra_bytes": 0}
    torch.cuda.synchronize()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    batch_ms = start.elapsed_time(end) / repeats
    peak = torch.cuda.max_memory_allocated() - before
    samples = []
    for _ in range(min(repeats, 30)):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        samples.append(s.elapsed_time(e))
    samples.sort()
    return {"mean_ms": batch_ms, "median_ms": samples[len(samples) // 2], "peak_extra_bytes": int(peak)}


def attempt(fn):
    try:
        return fn()
    except Exception as exc:  # recorded in the result, the run goes on
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def write(out: Path, name: str, doc: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    if path.exists():
        raise SystemExit(f"{path} exists: refusing to overwrite")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    return path


def machine() -> dict:
    import triton

    return {
        "gpu": torch.cuda.get_device_name() if DEV == "cuda" else "none (smoke run on CPU, interpreter)",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "triton": triton.__version__, "python": platform.python_version(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ------------------------------------------------------------------------------------------------ decode
def decode(args) -> None:
    """B=1, H=8, D=64, bfloat16 tokens, float32 state (plus the normalizer column for accumulate and gated)."""
    dt = torch.bfloat16
    B, H, D = (1, 2, 16) if args.smoke else (1, 8, 64)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dt).to(DEV)

    rows = []
    for L in args.lengths:
        rows.append({"path": "kv_sdpa", "L": L, "kv_bytes": 2 * B * H * L * D * 2,
                     **attempt(lambda L=L: kv_row(rnd, B, H, L, D, args))})
        for rule in RULES:
            rows += state_rows(rule, rnd, gen, B, H, D, L, dt, args)
    kv = {r["L"]: r.get("median_ms") for r in rows if r["path"] == "kv_sdpa"}
    for r in rows:
        if r["path"] != "kv_sdpa" and r.get("median_ms") and kv.get(r["L"]):
            r["state_over_kv_time"] = r["median_ms"] / kv[r["L"]]
    doc = {"kind": "linattn gpu decode step", "machine": machine(), "B": B, "H": H, "D": D, "dtype": "bfloat16",
           "state_dtype": "float32", "warmup": args.warmup, "repeats": args.repeats, "rows": rows}
    print(f"{'path':34s} {'L':>6s} {'median ms':>10s} {'peak extra B':>13s} {'vs KV':>7s}")
    for r in rows:
        print(f"{r['path']:34s} {r['L']:6d} {r.get('median_ms', float('nan')):10.4f} "
              f"{r.get('peak_extra_bytes', -1):13d} {r.get('state_over_kv_time', float('nan')):7.3f} "
              f"{r.get('error', '')}")
    print("wrote", write(args.out, "decode_cuda.json", doc))


def kv_row(rnd, B, H, L, D, args) -> dict:
    """KV baseline: a preallocated cache of L slots, the new token written in place, SDPA over it (one query)."""
    K, V = rnd(B, H, L, D), rnd(B, H, L, D)
    q1, k1, v1 = rnd(B, H, 1, D), rnd(B, H, D), rnd(B, H, D)

    def kv_step():
        K[:, :, L - 1].copy_(k1)
        V[:, :, L - 1].copy_(v1)
        return F.scaled_dot_product_attention(q1, K, V)

    return timed(kv_step, args.warmup, args.repeats)


def api_backend() -> bool:
    """Whether linattn.step takes ``backend=`` (the dispatch of linattn.kernels) on this checkout."""
    return "backend" in inspect.signature(linattn.step).parameters


def state_rows(rule, rnd, gen, B, H, D, L, dt, args) -> list[dict]:
    """One decode step of ``rule`` through the public ``linattn.step``, in place on a float32 state that the
    library's own layout holds ([S | z] in one buffer), bfloat16 tokens: once on the torch ops and once on the fused
    Triton kernel (``backend="triton"``, or the kernel package's entry point where the API has no ``backend``
    yet); the fused output is checked against the torch one first. The state step does not depend on L: it is
    timed at every L so that each row sits next to its KV row."""
    norm = rule in ("accumulate", "gated")
    q, k, v = F.elu(rnd(B, H, D)) + 1, F.elu(rnd(B, H, D)) + 1, rnd(B, H, D)
    if not norm:
        k = F.normalize(k.float(), dim=-1).to(dt)
    g = F.logsigmoid(rnd(B, H).float() + 3).to(dt) if rule in ("gated", "gated_delta") else None
    beta = torch.sigmoid(rnd(B, H).float()).to(dt) if rule in ("delta", "gated_delta") else None
    buf = (torch.randn(B, H, D, D + norm, generator=gen) * 0.1).to(DEV)
    if norm:
        buf[..., -1] = buf[..., -1].abs() + 1  # z > 0: a normalizer that has seen positive keys

    def fresh():
        b = buf.clone()
        return linattn.State(b[..., :D], b[..., D]) if norm else linattn.State(b)

    kw = {"rule": rule, "g": g, "beta": beta}
    if api_backend():
        def run(state, backend):
            return linattn.step(q, k, v, state, inplace=True, backend=backend, **kw)
    else:  # what linattn.step does around the kernel: features are q, k themselves, scale D^-0.5
        def run(state, backend):
            if backend == "torch":
                return linattn.step(q, k, v, state, inplace=True, **kw)
            s = D ** -0.5
            S = linattn.api._augmented(state, torch.float32) if norm else state.S
            o, S = lt.step(rule=rule, q=q.float() if norm else q.float() * s, k=k.float(), v=v, g=g, beta=beta,
                           state=S, normalize=norm, eps=1e-6 / s if norm else 1e-6, eps_mode="add", inplace=True)
            return o, state

    o_ref, _ = run(fresh(), "torch")
    o_tri, _ = run(fresh(), "triton")
    err = float((o_tri.float() - o_ref.float()).abs().max() / o_ref.float().abs().max().clamp_min(1))
    states = {"torch": fresh(), "triton": fresh()}
    common = {"L": L, "state_bytes": buf.numel() * buf.element_size(), "fused_vs_torch_max_rel_err": err,
              "api_backend_keyword": api_backend()}
    return [{"path": f"{name}:{rule}", **common,
             **attempt(lambda b=b: timed(lambda: run(states[b], b), args.warmup, args.repeats))}
            for name, b in (("state_torch_ops", "torch"), ("state_triton_fused", "triton"))]


# ------------------------------------------------------------------------------------------------ chunk
def fla_fn(rule: str, per_channel: bool):
    """fla's Triton chunk kernel for the rule, called in its [B, T, H, D] layout, unnormalized, scale given."""
    if rule == "accumulate":
        from fla.ops.linear_attn import chunk_linear_attn

        return "fla.chunk_linear_attn", lambda q, k, v, g, b, s: chunk_linear_attn(q, k, v, scale=s, normalize=False)[0]
    if rule == "gated" and per_channel:
        from fla.ops.gla import chunk_gla

        return "fla.chunk_gla", lambda q, k, v, g, b, s: chunk_gla(q, k, v, g, scale=s)[0]
    if rule == "gated":
        from fla.ops.simple_gla import chunk_simple_gla

        return "fla.chunk_simple_gla", lambda q, k, v, g, b, s: chunk_simple_gla(q, k, v, g, scale=s)[0]
    if rule == "delta":
        from fla.ops.delta_rule import chunk_delta_rule

        return "fla.chunk_delta_rule", lambda q, k, v, g, b, s: chunk_delta_rule(q, k, v, b, scale=s)[0]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return "fla.chunk_gated_delta_rule", lambda q, k, v, g, b, s: chunk_gated_delta_rule(q, k, v, g, b, scale=s)[0]


def ours(rule: str):
    kernel = lt.chunk_kernel(rule)

    def run(q, k, v, g, b, s):  # [B, T, H, D] inputs, passed as [B, H, T, D] views (no copy), as linattn.api does
        def hf(x):
            return None if x is None else x.transpose(1, 2)

        o, _ = kernel(hf(q), hf(k), hf(v), g=hf(g), beta=hf(b), initial_state=None, chunk_size=64, scale=s)
        return o.transpose(1, 2)  # back to [B, T, H, Dv] (a view)

    return run


def chunk_inputs(rule, per_channel, B, T, H, D, dt, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=DEV, dtype=torch.float32)

    q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
    g = b = None
    if rule in ("delta", "gated_delta"):
        k = F.normalize(k, dim=-1)
        b = torch.sigmoid(rnd(B, T, H))
    if rule == "gated" and per_channel:
        g = F.logsigmoid(rnd(B, T, H, D) + 3)
    elif rule in ("gated", "gated_delta"):
        g = F.logsigmoid(rnd(B, T, H) + 3)
    return [None if x is None else x.to(dt).requires_grad_() for x in (q, k, v, g, b)]


def rates() -> dict:
    """The device's own rates: bfloat16 matmul TFLOP/s (8192^3) and copy bandwidth (1 GiB)."""
    n = 8192 if DEV == "cuda" else 256
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    t = timed(lambda: a @ a, 3, 20)
    x = torch.empty(2**29 if DEV == "cuda" else 2**20, device=DEV, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    c = timed(lambda: y.copy_(x), 3, 20)
    return {"bf16_matmul_tflops": 2 * n**3 / t["median_ms"] / 1e9,
            "copy_gb_per_s": 2 * x.numel() * 2 / c["median_ms"] / 1e6}


def chunk(args) -> None:
    dt = torch.bfloat16
    shapes = [(1, 8192, 96, 128), (2, 16384, 16, 128), (1, 8192, 8, 64)]  # fla's published shapes, the seed's
    check_shape = (1, 1000, 8, 64)
    if args.smoke:
        shapes, check_shape = [(1, 40, 2, 16)], (1, 40, 2, 16)
    variants = [("accumulate", False), ("gated", False), ("gated", True), ("delta", False), ("gated_delta", False)]
    doc = {"kind": "linattn gpu chunk perf", "machine": machine(), "dtype": "bfloat16", "chunk_size": 64,
           "rates": attempt(rates), "rows": [], "checks": []}
    t_start = time.time()
    # Correctness first, at the seed's shape (smaller T): both kernels against the torch chunk form in float64.
    for rule, pc in variants:
        def check(rule=rule, pc=pc):
            B, T, H, D = check_shape
            x = chunk_inputs(rule, pc, B, T, H, D, dt, seed=1)
            x64 = [None if t is None else t.detach().double().transpose(1, 2) for t in x]
            s = D ** -0.5
            mod = importlib.import_module(f"linattn.ops.{rule}")
            ref, _ = mod.FORMS["chunk"](*x64[:3], g=x64[3], beta=x64[4], chunk_size=64, scale=s,
                                        initial_state=torch.zeros(B, H, D, D, dtype=torch.float64, device=DEV))
            ref = ref.transpose(1, 2)
            scale_ = float(ref.abs().max().clamp_min(1))

            def err(fn):
                with torch.no_grad():
                    return {"max_rel_err": float((fn(*x, s).double() - ref).abs().max()) / scale_}

            name, peer = fla_fn(rule, pc)
            return {"rule": rule, "per_channel": pc, "reference": "linattn torch chunk form, float64, same inputs",
                    "linattn.triton": attempt(lambda: err(ours(rule))), name: attempt(lambda: err(peer))}
        doc["checks"].append(attempt(check))
    for B, T, H, D in shapes:
        attn = attempt(lambda B=B, T=T, H=H, D=D: sdpa_row(B, T, H, D, dt, args))
        doc["rows"].append({"candidate": "torch.sdpa causal", "shape": [B, T, H, D], **attn})
        for rule, pc in variants:
            if time.time() - t_start > args.budget_s:
                doc["rows"].append({"candidate": "*", "rule": rule, "shape": [B, T, H, D], "skipped": "time budget"})
                continue
            name, peer = fla_fn(rule, pc)
            for cand, fn in (("linattn.triton", ours(rule)), (name, peer)):
                def fwd(fn=fn, B=B, T=T, H=H, D=D, rule=rule, pc=pc):
                    x = chunk_inputs(rule, pc, B, T, H, D, dt)
                    with torch.no_grad():
                        return timed(lambda: fn(*x, D ** -0.5), 2, args.repeats)

                def fwd_bwd(fn=fn, B=B, T=T, H=H, D=D, rule=rule, pc=pc):
                    x = chunk_inputs(rule, pc, B, T, H, D, dt)
                    do = torch.randn(B, T, H, D, device=DEV, dtype=dt)

                    def once():
                        o = fn(*x, D ** -0.5)
                        torch.autograd.grad(o, [t for t in x if t is not None], do)

                    return timed(once, 2, max(3, args.repeats // 2))

                row = {"candidate": cand, "rule": rule, "per_channel": pc, "shape": [B, T, H, D]}
                doc["rows"].append({**row, "pass": "fwd", **attempt(fwd)})
                doc["rows"].append({**row, "pass": "fwd+bwd", **attempt(fwd_bwd)})
                torch.cuda.empty_cache()
    print(json.dumps(doc["rates"]))
    for c in doc["checks"]:
        print(c)
    for r in doc["rows"]:
        if "fwd_median_ms" in r:
            r["median_ms"], r["pass"] = r["fwd_median_ms"], f"fwd; fwd+bwd {r['fwd_bwd_median_ms']:.3f} ms"
        print(f"{r['candidate']:28s} {r.get('rule', ''):12s} {str(r.get('per_channel', '')):5s} {str(r['shape']):22s} "
              f"{r.get('pass', ''):8s} {r.get('median_ms', float('nan')):9.3f} ms {r.get('peak_extra_bytes', -1):>12} "
              f"{r.get('error', r.get('skipped', ''))}")
    print("wrote", write(args.out, "chunk_cuda.json", doc))


def sdpa_row(B, T, H, D, dt, args) -> dict:
    q, k, v = (torch.randn(B, H, T, D, device=DEV, dtype=dt, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 2, args.repeats)
    do = torch.randn_like(q)

    def once():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, [q, k, v], do)

    both = timed(once, 2, max(3, args.repeats // 2))
    return {"fwd_median_ms": fwd["median_ms"], "fwd_bwd_median_ms": both["median_ms"],
            "fwd_peak_extra_bytes": fwd["peak_extra_bytes"], "fwd_bwd_peak_extra_bytes": both["peak_extra_bytes"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["decode", "chunk"])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048, 8192])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--budget-s", type=float, default=240.0, help="chunk: stop starting new shapes after this")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1 (no GPU)")
    args = p.parse_args()
    global DEV
    if args.smoke:
        DEV = "cpu"
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke needs TRITON_INTERPRET=1 in the environment")
        args.lengths, args.warmup, args.repeats = [40], 1, 2
    elif not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    elif os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("TRITON_INTERPRET=1 is set: unset it to time compiled kernels")
    if args.what == "chunk" and args.repeats == 100 and not args.smoke:
        args.repeats = 10  # whole-sequence calls: 10 timed calls each is plenty
    (decode if args.what == "decode" else chunk)(args)


if __name__ == "__main__":
    main()
