"""GPU measurements (run by scripts/gpu_check.sh on a CUDA machine; untested on hardware so far).

    python scripts/gpu_check.py decode --out DIR    # the experiment: one decode step, KV cache vs fixed state

(The chunk kernels against fla's are ``linattn perf --device cuda``, linattn.tools.perf.cuda.) Writes one JSON file
under DIR (never overwriting) and prints a table. Every candidate is timed alone with CUDA
events around a batch of steps after a warmup (and per-step events for the median), peak device memory from
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``. A candidate that fails is recorded with its
error, never dropped or invented. Outputs are checked against a reference before they are timed.
"""

from __future__ import annotations

import argparse
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
import linattn.layout  # noqa: E402
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
            S = linattn.layout.augmented(state, torch.float32) if norm else state.S
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["decode"])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[512, 2048, 8192])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=100)
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
    decode(args)


if __name__ == "__main__":
    main()
