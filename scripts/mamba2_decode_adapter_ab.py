"""The HF adapter's Mamba-2 decode step (``mamba2_selective_state_update``) of this tree against the previous
revision of that function (copied below as ``old_adapter``), side by side in one process, with linattn's
Decoder call alone (the kernel step the adapter wraps) as the floor: B=1, float32, one thread, the arguments as
HF's Mamba-2 layer passes them (dt, A, D, dt_bias expanded over the head dim; z None, or given as Falcon-H1
passes it). Checks first that old and new give bitwise equal outputs and states.

Two timings per row, in alternating blocks: ``warm`` (calls back to back: the minimum and median over blocks of
the per-call mean) and ``gap`` (each call after an idle --gap-ms, as scripts/ggml_bench.py times a decode step:
the median of single calls). Usage, from the repository root:

    PYTHONPATH=$PWD/src python scripts/mamba2_decode_adapter_ab.py [--out benchmarks/results/X.txt]
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import linattn
from linattn.integrations.transformers import mamba2 as new
from linattn.integrations.transformers.common import decoder, on_linattn
from linattn.state import State
from linattn.tools.harness.results import atomic_write


# ---- the previous revision of the decode step, verbatim but for names
def _old_time_step(dt, dt_bias, dt_softplus, dt_limit):
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit is not None:
        dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    return dt


def _old_per_head(t, name, index):
    if t is None:
        return None
    head = t[index]
    if all(t.stride(d) == 0 for d in range(head.dim(), t.dim())) or torch.equal(
            t, head.reshape(*head.shape, *[1] * (t.dim() - head.dim())).expand_as(t)):
        return head
    raise ValueError(f"{name}: its values vary along the head dim; the scan has one value per head")


def old_adapter(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, *,
                backend="auto", fallback=None, **kwargs):
    if not on_linattn(backend, fallback, hidden_states):
        return fallback(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z,
                        **kwargs)
    try:
        dt_h = _old_per_head(dt, "dt", (slice(None), slice(None), 0))
        A_h = _old_per_head(A, "A", (slice(None), 0, 0))
        D_h = _old_per_head(D, "D", (slice(None), 0))
        bias_h = _old_per_head(dt_bias, "dt_bias", (slice(None), 0))
    except ValueError:
        if fallback is None:
            raise
        return inspect.unwrap(fallback)(state, hidden_states, dt, A, B, C, D=D, dt_bias=dt_bias,
                                        dt_softplus=dt_softplus, z=z)
    cd = torch.float64 if state.dtype == torch.float64 else torch.float32
    dt_h = _old_time_step(dt_h, bias_h, dt_softplus, None).to(cd)
    x = hidden_states.to(cd)
    q, k, v, g = C.to(cd).contiguous(), B.to(cd).contiguous(), x * dt_h[..., None], dt_h * A_h.to(cd)
    S = state.transpose(-1, -2)
    dec = decoder(state, S, (q, k, v, g), "gated", None, 1.0, backend, normalize=False) if S.dtype == cd else None
    if dec is not None:
        o = dec(q, k, v, g)
    else:
        o, new_state = linattn.step(q, k, v, State(S.to(cd)), rule="gated", g=g, normalize=False, scale=1.0,
                                    backend=backend)
        state.copy_(new_state.S.transpose(-1, -2))
    if D_h is not None:
        o = o + D_h.to(cd)[:, None] * x
    if z is not None:
        o = o * F.silu(z.to(cd))
    return o.to(hidden_states.dtype)
# ----


def layer_args(H, P, N, G, with_z, seed=0):
    """One decode token's arguments as HF's Mamba-2 layer builds them (expanded views of per-head values)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, H, P, generator=gen)
    dt = (torch.randn(1, H, generator=gen) - 2)[:, :, None].expand(-1, -1, P)
    A = (-torch.rand(H, generator=gen) * 8 - 1)[:, None, None].expand(-1, P, N)
    B, C = (torch.randn(1, G, N, generator=gen) for _ in range(2))
    D = torch.randn(H, generator=gen)[:, None].expand(-1, P)
    dt_bias = torch.randn(H, generator=gen)[:, None].expand(-1, P)
    z = torch.randn(1, H, P, generator=gen) if with_z else None
    return x, dt, A, B, C, dict(D=D, dt_bias=dt_bias, dt_softplus=True, z=z)


def fresh_state(H, P, N, seed=1):
    """A state in the layout a patched prefill leaves in HF's cache (linattn's memory, HF's view)."""
    return torch.randn(1, H, N, P, generator=torch.Generator().manual_seed(seed)).transpose(-1, -2) * 0.1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30, help="alternating blocks per row")
    parser.add_argument("--calls", type=int, default=40, help="calls per warm block")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="idle time before each gapped call")
    parser.add_argument("--gap-calls", type=int, default=4, help="gapped calls per block")
    parser.add_argument("--out", default=None, help="result text file (never overwritten)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [f"# PYTHONPATH=src python scripts/mamba2_decode_adapter_ab.py   ({processor()}, {os.cpu_count()} cores)",
             f"# {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  torch {torch.__version__}  threads "
             f"{torch.get_num_threads()}  OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}  load average before "
             f"{os.getloadavg()[0]:.2f}",
             "HF adapter decode step, B=1 float32, 1 thread; us per call. decoder = linattn's Decoder call alone "
             "(the kernel step); old / new = the adapter before / after; overhead = adapter - decoder",
             f"warm: min and median over {args.blocks} blocks of {args.calls} calls back to back; gap: median of "
             f"{args.blocks * args.gap_calls} single calls each after {args.gap_ms:g} ms idle"]
    print("\n".join(lines), flush=True)
    with torch.no_grad():
        for name, H, G in (("Mamba-2-2.7B", 80, 1), ("Nemotron-H-8B", 128, 8)):
            for with_z in (False, True):
                lines.append(row(name, H, 64, 128, G, with_z, args))
                print(lines[-1], flush=True)
    lines.append(f"# load average after {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    if args.out:
        atomic_write(Path(args.out), lambda tmp: tmp.write_text("\n".join(lines) + "\n", encoding="utf-8"))
        print("wrote", args.out)


def row(name, H, P, N, G, with_z, args) -> str:
    x, dt, A, B, C, kw = layer_args(H, P, N, G, with_z)
    # bitwise: one step of each from the same state
    s_old, s_new = fresh_state(H, P, N), fresh_state(H, P, N)
    y_old, y_new = old_adapter(s_old, x, dt, A, B, C, **kw), new.mamba2_selective_state_update(s_new, x, dt, A, B,
                                                                                                C, **kw)
    same = torch.equal(y_old, y_new) and torch.equal(s_old, s_new)
    # the floor: the Decoder call on the inputs the adapter derives
    d = F.softplus(dt[:, :, :1] + kw["dt_bias"][:, :1])
    v, g = x * d, (d[..., 0] * A[:, 0, 0]).contiguous()
    S_dec = fresh_state(H, P, N)
    dec = linattn.Decoder(State(S_dec.transpose(-1, -2)), rule="gated", normalize=False, scale=1.0)
    calls = {"decoder": lambda: dec(C, B, v, g),
             "old": lambda: old_adapter(s_old, x, dt, A, B, C, **kw),
             "new": lambda: new.mamba2_selective_state_update(s_new, x, dt, A, B, C, **kw)}
    warm = {k: [] for k in calls}
    gap = {k: [] for k in calls}
    for f in calls.values():
        for _ in range(5):
            f()
    for b in range(args.blocks):
        order = list(calls.items()) if b % 2 == 0 else list(reversed(calls.items()))
        for k, f in order:
            start = time.perf_counter()
            for _ in range(args.calls):
                f()
            warm[k].append((time.perf_counter() - start) / args.calls * 1e6)
        for k, f in order:
            for _ in range(args.gap_calls):
                time.sleep(args.gap_ms / 1e3)
                start = time.perf_counter()
                f()
                gap[k].append((time.perf_counter() - start) * 1e6)
    wmin = {k: min(t) for k, t in warm.items()}
    wmed = {k: statistics.median(t) for k, t in warm.items()}
    gmed = {k: statistics.median(t) for k, t in gap.items()}

    def part(label, m):
        over_old, over_new = m["old"] - m["decoder"], m["new"] - m["decoder"]
        return (f"{label}: decoder {m['decoder']:6.1f} old {m['old']:6.1f} new {m['new']:6.1f} "
                f"(new/old {m['new'] / m['old']:.2f}; overhead {over_old:5.1f} -> {over_new:5.1f})")

    return (f"{name:13s} H={H:3d} G={G} z={'given' if with_z else 'None '} bitwise equal {same}  "
            f"{part('warm min', wmin)}  {part('warm median', wmed)}  {part('gap median', gmed)}  "
            f"load {os.getloadavg()[0]:.2f}")


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown processor"


if __name__ == "__main__":
    main()
