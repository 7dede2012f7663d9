"""Batch-1 decode, side by side in one process: ``linattn.step`` and ``linattn.Decoder`` of this tree and of another
revision, the torch step, the compiled kernel alone, and a KV-cache step (``scaled_dot_product_attention`` over L
cached tokens, as ``linattn bench`` times it) for context. B=1, H=8, D=64, float32, one thread.

Every path runs in turns of ``--block`` calls, the order rotating each round, so load changes on a shared machine
hit all paths alike; the table gives the median and the minimum over rounds of the per-call time (microseconds).
``--clock cpu`` times with the thread's CPU time instead of the wall clock: on a loaded machine that leaves out the
time the process waits for a core (not the caches the other processes disturb meanwhile).
Usage, from the repository root:

    git archive <rev> src | tar -x -C /tmp/linattn-base       # the revision to compare with
    PYTHONPATH=src python scripts/decode_step_ab.py /tmp/linattn-base/src

Without an argument only this tree, the torch step and the KV step are timed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead_ab import load_base  # noqa: E402

# rule, feature map, gate shape ("head", "channel" or None), as linattn bench calls them (accumulate: elu1 here)
CASES = [("accumulate", "elu1", None), ("gated", "relu1", "head"), ("gated", "relu1", "channel"),
         ("delta", "l2", None), ("gated_delta", "l2", "head")]


def token(rule: str, gate: str | None, B: int, H: int, D: int) -> tuple:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, D, generator=gen) for _ in range(3))
    kw = {}
    if gate is not None:
        kw["g"] = F.logsigmoid(torch.randn(B, H, *((D,) if gate == "channel" else ()), generator=gen) + 3)
    if rule in ("delta", "gated_delta"):
        kw["beta"] = torch.rand(B, H, generator=gen)
    return q, k, v, kw


def kv_step(L: int, B: int, H: int, D: int):
    gen = torch.Generator().manual_seed(1)
    K, V = torch.randn(B, H, L, D, generator=gen), torch.randn(B, H, L, D, generator=gen)
    q, k, v = torch.randn(B, H, 1, D), torch.randn(B, H, D), torch.randn(B, H, D)

    def run():
        K[:, :, L - 1].copy_(k)
        V[:, :, L - 1].copy_(v)
        return F.scaled_dot_product_attention(q, K, V).squeeze(2)

    return run


def step_path(mod, rule, fmap, q, k, v, kw, inplace, backend="auto"):
    _, state = mod.step(q, k, v, None, rule=rule, feature_map=fmap, **kw)
    box = [state]

    def run():
        o, box[0] = mod.step(q, k, v, box[0], rule=rule, feature_map=fmap, inplace=inplace, backend=backend, **kw)
        return o

    return run


def decoder_path(mod, rule, fmap, q, k, v, kw):
    """A ``Decoder`` over the state a first step made (its per-call work: the proof and the compiled call)."""
    _, state = mod.step(q, k, v, None, rule=rule, feature_map=fmap, **kw)
    dec = mod.Decoder(state, rule=rule, feature_map=fmap)
    g, beta = kw.get("g"), kw.get("beta")

    def run():
        return dec(q, k, v, g, beta)

    return run


def kernel_path(linattn, rule, fmap, q, k, v, kw):
    """The compiled entry alone, on the arguments ``linattn.step`` would pass it (in place)."""
    from linattn.kernels import cpu_decode as kd

    _, state = linattn.step(q, k, v, None, rule=rule, feature_map=fmap, **kw)
    g, beta = kw.get("g"), kw.get("beta")
    B, H, D = q.shape
    Dv = v.shape[-1]
    o = torch.empty_like(v)
    norm = state.z is not None
    args = (q.data_ptr(), k.data_ptr(), v.data_ptr(), 0 if g is None else g.data_ptr(),
            0 if beta is None else beta.data_ptr(), state.S.data_ptr(), state.S.data_ptr(), o.data_ptr(), B, H, H,
            D, Dv, 0 if g is None else (1 if g.dim() == 2 else D), kd.FEATURE_CODES[fmap], False, norm,
            beta is not None, D**-0.5, 1e-6)
    keep = (state, o)

    def run():
        kd.decode(*args)
        return keep

    return run


def time_paths(paths: dict, rounds: int, block: int, clock=time.perf_counter_ns) -> dict:
    names = list(paths)
    times = {n: [] for n in names}
    for n in names:  # warm up (compiles, caches)
        for _ in range(block):
            paths[n]()
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            run = paths[n]
            start = clock()
            for _ in range(block):
                run()
            times[n].append((clock() - start) / block / 1e3)
    return {n: (statistics.median(t), min(t)) for n, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?", type=Path, help="src/ of the revision to compare with")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args()
    clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    torch.set_num_threads(1)
    import linattn

    base = load_base(args.base.resolve()) if args.base else None
    B, H, D = 1, 8, 64
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"decode step B={B} H={H} D={D} float32, 1 thread; us per call, median (min) over {args.rounds} rounds "
          f"of {args.block} calls, {args.clock} clock; load average before: {' '.join(load)}")
    kv = {L: kv_step(L, B, H, D) for L in (128, 512)}
    kv_times = time_paths(kv, args.rounds, args.block, clock)
    print("KV-cache step (copy + SDPA): " + ", ".join(f"L={L} {m:.1f} ({lo:.1f})" for L, (m, lo) in kv_times.items()))
    cols = (["base inplace", "base copy", "base Decoder"] if base else []) + [
        "this inplace", "this copy", "this Decoder", "torch inplace", "kernel"]
    print(f"{'case':26s}" + "".join(f"{c:>17s}" for c in cols))
    for rule, fmap, gate in CASES:
        q, k, v, kw = token(rule, gate, B, H, D)
        paths = {}
        if base:
            paths["base inplace"] = step_path(base, rule, fmap, q, k, v, kw, True)
            paths["base copy"] = step_path(base, rule, fmap, q, k, v, kw, False)
            paths["base Decoder"] = decoder_path(base, rule, fmap, q, k, v, kw)
        paths["this inplace"] = step_path(linattn, rule, fmap, q, k, v, kw, True)
        paths["this copy"] = step_path(linattn, rule, fmap, q, k, v, kw, False)
        paths["this Decoder"] = decoder_path(linattn, rule, fmap, q, k, v, kw)
        paths["torch inplace"] = step_path(linattn, rule, fmap, q, k, v, kw, True, backend="torch")
        paths["kernel"] = kernel_path(linattn, rule, fmap, q, k, v, kw)
        res = time_paths(paths, args.rounds, args.block, clock)
        name = f"{rule} {fmap}" + (f" g/{gate}" if gate else "")
        print(f"{name:26s}" + "".join(f"{res[c][0]:9.1f} ({res[c][1]:4.1f})" for c in cols))
    with open("/proc/loadavg") as f:
        print("load average after: " + " ".join(f.read().split()[:3]))


if __name__ == "__main__":
    main()
