"""linattn's CPU kernels against ggml's own CPU ops (the ones llama.cpp runs), side by side in one process.

ggml's CPU library is loaded with ctypes from ``--lib`` (the folder with ``libggml-base.so`` and
``libggml-cpu.so``; ``scripts/ggml_build.sh DIR`` builds it from the ggml-py sdist). Every row times ggml and
linattn on the same inputs (copied once into ggml's tensors), interleaved, medians of ``--repeats`` runs (20 times
as many for a decode step), at each of ``--threads`` (``n_threads`` of ``ggml_graph_compute_with_ctx`` for ggml,
``torch.set_num_threads`` and ``numba.set_num_threads`` for linattn). B = 1, float32.

ggml's ``libgomp.so.1`` resolves to the copy torch loaded first (the same soname): one OpenMP runtime serves both.
libgomp's idle threads spin by default; on a machine where other processes hold a core, ggml's 2-thread graph then
waits tens of milliseconds at its barriers (a decode step took 17-48 ms at 2 threads against well under 1 ms
with ``OMP_WAIT_POLICY=PASSIVE``). The variable is read when libgomp loads: set it before Python starts; the JSON
records it, and ``--gap-ms`` of idle time before each timed run lets the other side's spinning threads sleep.

Rows:

* Mamba-2 prefill (``--T`` tokens) and one decode step at Mamba-2-2.7B's layer (80 heads of dim 64, state 128,
  1 group) and Nemotron-H-8B's (128 heads of dim 64, state 128, 8 groups): ``ggml_ssm_scan`` against
  ``linattn.linear_attention(rule="gated")`` / a ``linattn.Decoder`` step (inputs mapped beforehand, below) and
  against linattn's HF adapter (``mamba2_chunk_scan`` / ``mamba2_selective_state_update``), which take ggml's raw
  inputs and do the softplus and the dt scaling themselves;
* Gated DeltaNet prefill and one step at Qwen3.5's layer (16 q/k heads, 32 value heads, 128 x 128):
  ``ggml_gated_delta_net`` against ``linattn.linear_attention(rule="gated_delta")`` / a Decoder step.
* This machine's float32 matrix-product rate (``torch.mm`` of 2048 x 2048, at each thread count, same run), and
  the Mamba-2 prefill rows again as rates of the scan's multiply-adds (4 N P flops per token and value head) with
  their share of it: how far either runtime is from what the machine's arithmetic allows.

ggml's graph per row is the op plus a ``ggml_cpy`` of its new state back into the state tensor, as llama.cpp's
layers build it; a prefill starts each run from a zero state (reset outside the timing), a decode step updates
the state in place run after run, on both sides. A decode row also times the op alone (``ggml op alone``: the
same inputs and state every run, the new state left in the op's output), to separate the kernel from the copy.

Layouts (ggml lists dims fastest first, ``ne = {ne0, ne1, ...}``; torch's shapes are slowest first):

Mamba-2, ``ggml_ssm_scan(s, x, dt, A, B, C, ids)`` with H heads, head dim P, state size N, G groups:

* ``x {P, H, T, 1}`` = torch ``x [1, T, H, P]``; ``dt {H, T, 1}`` = ``dt [1, T, H]`` (before softplus: ggml
  applies softplus itself, as the adapter does with ``dt_softplus=True``; dt_bias is added before, D after,
  in both runtimes' callers, so neither is part of a row); ``A {1, H}`` = ``A [H]`` (negative);
  ``B, C {N, G, T, 1}`` = ``[1, T, G, N]``, head h reads group ``h // (H / G)`` in both;
  ``s {N, P, H, 1}`` = HF's state ``[1, H, P, N]`` = linattn's ``State.S [1, H, N, P]`` transposed.
* Result: ``y`` (the first ``T*H*P`` floats) = ``[1, T, H, P]``, then the new state in ``s``'s layout.
* linattn's mapping: with ``d = softplus(dt)``, ``q = C``, ``k = B`` (grouped value heads: G q/k heads, H value
  heads), ``v = d[..., None] * x``, ``g = d * A``, ``rule="gated"``, ``normalize=False``, ``scale=1``.

Gated DeltaNet, ``ggml_gated_delta_net(q, k, v, g, beta, state)`` with H q/k heads, HV value heads, D = 128:

* ``q, k {D, H, T, 1}`` = ``[1, T, H, D]`` (L2-normalized beforehand: llama.cpp normalizes them in a separate op,
  so linattn gets the same normalized q, k and no feature map); ``v {D, HV, T, 1}`` = ``[1, T, HV, D]``;
  ``g, beta {1, HV, T, 1}`` = ``[1, T, HV]`` (g the log-gate, beta after its sigmoid);
  ``state {D, D, HV, 1}``: per head the row-major ``[Dv, Dk]`` matrix, linattn's ``S [Dk, Dv]`` transposed.
* ggml's scale is fixed at ``1/sqrt(D)``; linattn is called with ``scale=D**-0.5``.
* Heads: ggml's value head j reads q/k head ``j % H`` (tiled); linattn's value head h reads ``h // (HV / H)``
  (``repeat_interleave``, as HF's Qwen3.5). ggml's value head j is given linattn's value head
  ``perm[j] = (j % H) * (HV // H) + j // H`` (v, g, beta, state), so that both read the same q/k head, and its
  output head j is compared with linattn's head ``perm[j]``.
* Result: the output ``[1, T, HV, D]`` (first ``T*HV*D`` floats), then the new state.

Each row reports the largest |difference| of the outputs (the step's: its output and new state) divided by the
largest |value| of linattn's output, from one run of each side on identical inputs and state before the timing.

    PYTHONPATH=src python scripts/ggml_bench.py --lib /tmp/ggml/build/src \\
        --out benchmarks/results/ggml_side_by_side_cpu.json

writes the JSON and a Markdown table next to it (same name, ``.md``), atomically, refusing to replace either
without ``--overwrite``. This is a tool: neither the library nor its tests import it, and ggml is no dependency.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch
import torch.nn.functional as F

import linattn
from linattn.integrations import transformers as lt
from linattn.tools.harness.machine import processor_name as processor
from linattn.tools.harness.results import atomic_write, atomic_write_json

F32, I32 = 0, 26  # enum ggml_type


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def load_ggml(folder: str):
    """ggml-base and ggml-cpu from ``folder``, with the few functions used here declared; exits with a message
    when they are missing."""
    base, cpu = Path(folder) / "libggml-base.so", Path(folder) / "libggml-cpu.so"
    if not base.is_file() or not cpu.is_file():
        sys.exit(f"ggml_bench: no libggml-base.so / libggml-cpu.so in {folder!r}; build them with "
                 "scripts/ggml_build.sh DIR and pass --lib DIR/build/src")
    lib_base = ctypes.CDLL(str(base), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(cpu), mode=ctypes.RTLD_GLOBAL)
    P, T = ctypes.c_void_p, ctypes.c_int64
    sigs = {
        "ggml_init": (P, [InitParams]), "ggml_free": (None, [P]), "ggml_version": (ctypes.c_char_p, []),
        "ggml_tensor_overhead": (ctypes.c_size_t, []), "ggml_graph_overhead": (ctypes.c_size_t, []),
        "ggml_new_tensor_1d": (P, [P, ctypes.c_int, T]), "ggml_new_tensor_2d": (P, [P, ctypes.c_int, T, T]),
        "ggml_new_tensor_3d": (P, [P, ctypes.c_int, T, T, T]),
        "ggml_new_tensor_4d": (P, [P, ctypes.c_int, T, T, T, T]),
        "ggml_get_data": (P, [P]), "ggml_nbytes": (ctypes.c_size_t, [P]),
        "ggml_view_1d": (P, [P, P, T, ctypes.c_size_t]), "ggml_cpy": (P, [P, P, P]),
        "ggml_ssm_scan": (P, [P] * 8), "ggml_new_graph": (P, [P]), "ggml_build_forward_expand": (None, [P, P]),
    }
    for name, (res, argtypes) in sigs.items():
        fn = getattr(lib_base, name)
        fn.restype, fn.argtypes = res, argtypes
    gdn = getattr(lib_base, "ggml_gated_delta_net", None)
    if gdn is not None:
        gdn.restype, gdn.argtypes = P, [P] * 7
    lib.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    lib.ggml_graph_compute_with_ctx.argtypes = [P, P, ctypes.c_int]
    lib.ggml_cpu_init.restype, lib.ggml_cpu_init.argtypes = None, []
    lib.ggml_cpu_init()
    return lib_base, lib, gdn is not None


class Graph:
    """One ggml context holding the input tensors, an op, the copy of its new state back into the state tensor,
    and the graph over them; tensors are exposed to torch as views of ggml's memory."""

    def __init__(self, g, cpu, data_bytes: int, n_tensors: int, runs: int):
        self.g, self.cpu = g, cpu
        # ggml_graph_compute_with_ctx takes a fresh work buffer from the context on every call
        size = data_bytes + (n_tensors + 8) * g.ggml_tensor_overhead() + g.ggml_graph_overhead() + runs * 65536
        self.ctx = g.ggml_init(InitParams(size + (16 << 20), None, False))
        if not self.ctx:
            sys.exit("ggml_bench: ggml_init failed")

    def tensor(self, ne: tuple[int, ...], dtype: int = F32):
        return getattr(self.g, f"ggml_new_tensor_{len(ne)}d")(self.ctx, dtype, *ne)

    def view(self, t, shape, dtype=torch.float32, offset: int = 0) -> torch.Tensor:
        """torch view of tensor ``t``'s data (elements from ``offset``), shaped ``shape`` (torch order)."""
        n = int(np.prod(shape))
        ctype = ctypes.c_float if dtype == torch.float32 else ctypes.c_int32
        assert (offset + n) * 4 <= self.g.ggml_nbytes(t)
        buf = (ctype * n).from_address(self.g.ggml_get_data(t) + offset * 4)
        return torch.from_numpy(np.ctypeslib.as_array(buf)).view(shape)

    def build(self, result, state, n_out: int):
        """Two graphs: ``result`` (outputs, then the new state from element ``n_out``) with its state copied into
        ``state`` (llama.cpp's), and the op alone."""
        n_state = self.g.ggml_nbytes(state) // 4
        new_state = self.g.ggml_view_1d(self.ctx, result, n_state, n_out * 4)
        self.graph = self.g.ggml_new_graph(self.ctx)
        self.g.ggml_build_forward_expand(self.graph, self.g.ggml_cpy(self.ctx, new_state, state))
        self.graph_op = self.g.ggml_new_graph(self.ctx)
        self.g.ggml_build_forward_expand(self.graph_op, result)

    def compute(self, threads: int, op_alone: bool = False) -> None:
        graph = self.graph_op if op_alone else self.graph
        if self.cpu.ggml_graph_compute_with_ctx(self.ctx, graph, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")

    def close(self) -> None:
        self.g.ggml_free(self.ctx)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def timed_medians_ms(fns, repeats: int, setups=None, gap_s: float = 0.0) -> list[float]:
    """Median ms of each function, runs interleaved (a, b, c, a, ...) after one warm-up run each; ``setups[i]``
    (untimed) runs before each run of ``fns[i]``, then an idle ``gap_s``: ggml's OpenMP threads and torch's
    spin for a few milliseconds after a parallel region, on the cores the other side's next run needs."""
    setups = setups or [None] * len(fns)
    samples = [[] for _ in fns]
    for r in range(repeats + 1):
        for fn, setup, out in zip(fns, setups, samples, strict=True):
            if setup is not None:
                setup()
            time.sleep(gap_s)
            start = time.perf_counter()
            fn()
            if r:
                out.append(time.perf_counter() - start)
    return [statistics.median(s) * 1e3 for s in samples]


MAMBA2_LAYERS = (("Mamba-2-2.7B", 80, 1), ("Nemotron-H-8B", 128, 8))  # name, value heads, groups


def mamba2_cases(g, cpu, name: str, H: int, P: int, N: int, G: int, T: int, runs: int):
    """Prefill and decode step of one Mamba-2 layer: (row, ggml's call, setup, linattn's calls) per case."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, T, H, P, generator=gen)
    dt = torch.randn(1, T, H, generator=gen) - 2  # before softplus, dt_bias included
    A = -torch.rand(H, generator=gen) * 8 - 1
    Bm, Cm = (torch.randn(1, T, G, N, generator=gen) for _ in range(2))
    d = F.softplus(dt)
    v, gate = d[..., None] * x, d * A  # linattn's inputs, mapped once outside the timing

    # prefill
    gp = Graph(g, cpu, 4 * (2 * x.numel() + dt.numel() + 2 * Bm.numel() + 3 * H * P * N + H + 1), 12, runs)
    ts = gp.tensor((N, P, H, 1))
    tx, tdt, tA = gp.tensor((P, H, T, 1)), gp.tensor((H, T, 1)), gp.tensor((1, H))
    tB, tC, tids = gp.tensor((N, G, T, 1)), gp.tensor((N, G, T, 1)), gp.tensor((1,), I32)
    s_g = gp.view(ts, (1, H, P, N))
    for t, src in ((tx, x), (tdt, dt), (tA, A), (tB, Bm), (tC, Cm)):
        gp.view(t, tuple(src.shape)).copy_(src)
    gp.view(tids, (1,), torch.int32).zero_()
    res = g.ggml_ssm_scan(gp.ctx, ts, tx, tdt, tA, tB, tC, tids)
    gp.build(res, ts, x.numel())
    y_g = gp.view(res, (1, T, H, P))

    def core():
        return linattn.linear_attention(Cm, Bm, v, rule="gated", g=gate, normalize=False, scale=1.0,
                                        output_final_state=True)

    def adapter():
        return lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, 256, dt_softplus=True, return_final_states=True)

    def check_prefill(threads):
        s_g.zero_()
        gp.compute(threads)
        o, st = core()
        oa, sta = adapter()
        return (max(rel(y_g, o), rel(s_g, st.S.transpose(-1, -2))), max(rel(y_g, oa), rel(s_g, sta))), st

    # decode: one token from the prefill's final state
    gd = Graph(g, cpu, 4 * (2 * H * P + H + 2 * G * N + 3 * H * P * N + H + 1), 12, 20 * runs)
    ts1 = gd.tensor((N, P, H, 1))
    tx1, tdt1, tA1 = gd.tensor((P, H, 1, 1)), gd.tensor((H, 1, 1)), gd.tensor((1, H))
    tB1, tC1, tids1 = gd.tensor((N, G, 1, 1)), gd.tensor((N, G, 1, 1)), gd.tensor((1,), I32)
    x1, dt1, B1, C1 = x[:, -1], dt[:, -1], Bm[:, -1], Cm[:, -1]
    for t, src in ((tx1, x1), (tdt1, dt1), (tA1, A), (tB1, B1), (tC1, C1)):
        gd.view(t, tuple(src.shape)).copy_(src)
    gd.view(tids1, (1,), torch.int32).zero_()
    res1 = g.ggml_ssm_scan(gd.ctx, ts1, tx1, tdt1, tA1, tB1, tC1, tids1)
    gd.build(res1, ts1, x1.numel())
    y1_g, s1_g = gd.view(res1, (1, H, P)), gd.view(ts1, (1, H, P, N))
    v1, g1 = v[:, -1], gate[:, -1]
    S_core = linattn.State(torch.zeros(1, H, N, P))  # linattn's layout; the adapter's HF view of another
    S_ad = torch.zeros(1, H, N, P).transpose(-1, -2)  # one view kept: the adapter keeps a decoder per state tensor
    dec = linattn.Decoder(S_core, rule="gated", normalize=False, scale=1.0)
    ssu_args = (x1, dt1[..., None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), B1, C1)

    def step_core():
        return dec(C1, B1, v1, g1)

    def step_adapter():
        return lt.mamba2_selective_state_update(S_ad, *ssu_args, dt_softplus=True)

    def check_step(threads, S0):
        for dst in (s1_g, S_core.S.transpose(-1, -2), S_ad):
            dst.copy_(S0.transpose(-1, -2))
        gd.compute(threads)
        o, oa = step_core(), step_adapter()
        return max(rel(y1_g, o), rel(s1_g, S_core.S.transpose(-1, -2))), max(rel(y1_g, oa), rel(s1_g, S_ad))

    return gp, gd, [
        dict(family=f"mamba2 ({name})", what=f"prefill T={T}", ggml=gp.compute, setup=s_g.zero_,
             linattn=core, adapter=adapter, check=check_prefill, gflop=4 * N * P * H * T / 1e9),
        dict(family=f"mamba2 ({name})", what="decode step", ggml=gd.compute, setup=None,
             linattn=step_core, adapter=step_adapter, check=check_step),
    ]


def gated_delta_cases(g, cpu, T: int, runs: int, H: int = 16, HV: int = 32, D: int = 128):
    """Prefill and decode step of a Qwen3.5 Gated DeltaNet layer."""
    gen = torch.Generator().manual_seed(1)
    q, k = (F.normalize(torch.randn(1, T, H, D, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, T, HV, D, generator=gen)
    gate = F.logsigmoid(torch.randn(1, T, HV, generator=gen) + 3)
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=gen))
    r = HV // H
    perm = torch.tensor([(j % H) * r + j // H for j in range(HV)])  # ggml's value head j is linattn's perm[j]
    scale = D ** -0.5

    def graph(n):
        gr = Graph(g, cpu, 4 * (2 * n * H * D + 2 * n * HV * D + 2 * n * HV + 3 * HV * D * D), 12,
                   runs if n > 1 else 20 * runs)
        ts = gr.tensor((D, D, HV, 1))
        tq, tk = gr.tensor((D, H, n, 1)), gr.tensor((D, H, n, 1))
        tv, tg, tb = gr.tensor((D, HV, n, 1)), gr.tensor((1, HV, n, 1)), gr.tensor((1, HV, n, 1))
        sl = slice(T - n, T)
        for t, src in ((tq, q[:, sl]), (tk, k[:, sl]), (tv, v[:, sl, perm]), (tg, gate[:, sl, perm]),
                       (tb, beta[:, sl, perm])):
            gr.view(t, tuple(src.shape)).copy_(src)
        res = g.ggml_gated_delta_net(gr.ctx, tq, tk, tv, tg, tb, ts)
        gr.build(res, ts, n * HV * D)
        return gr, gr.view(ts, (1, HV, D, D)), gr.view(res, (1, n, HV, D))

    gp, s_g, y_g = graph(T)

    def core():
        return linattn.linear_attention(q, k, v, rule="gated_delta", g=gate, beta=beta, scale=scale,
                                        output_final_state=True)

    def check_prefill(threads):
        s_g.zero_()
        gp.compute(threads)
        o, st = core()
        return (max(rel(y_g, o[:, :, perm]), rel(s_g, st.S[:, perm].transpose(-1, -2))), None), st

    gd, s1_g, y1_g = graph(1)
    S_core = linattn.State(torch.zeros(1, HV, D, D))
    dec = linattn.Decoder(S_core, rule="gated_delta", scale=scale)
    one = (q[:, -1], k[:, -1], v[:, -1], gate[:, -1], beta[:, -1])

    def step_core():
        return dec(*one)

    def check_step(threads, S0):
        s1_g.copy_(S0[:, perm].transpose(-1, -2))
        S_core.S.copy_(S0)
        gd.compute(threads)
        o = step_core()
        return max(rel(y1_g[:, 0], o[:, perm]), rel(s1_g, S_core.S[:, perm].transpose(-1, -2))), None

    family = "gated_delta (Qwen3.5)"
    return gp, gd, [
        dict(family=family, what=f"prefill T={T}", ggml=gp.compute, setup=s_g.zero_, linattn=core, adapter=None,
             check=check_prefill),
        dict(family=family, what="decode step", ggml=gd.compute, setup=None, linattn=step_core, adapter=None,
             check=check_step),
    ]


def vector_isa() -> str:
    """The widest x86 vector extensions the processor reports (ggml is built with -march=native)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.machine()
    names = set(flags.split(":", 1)[1].split())
    return " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16") if f in names) or platform.machine()


def ggml_version(g, folder: str) -> str:
    """ggml's own version string, with the build script's note (sdist and synced llama.cpp commit) if found."""
    text = g.ggml_version().decode()
    for note in (Path(folder) / "ggml_version.txt", Path(folder).parents[1] / "ggml_version.txt"):
        if note.is_file():
            return text + " (" + "; ".join(note.read_text().split("\n")).strip("; ") + ")"
    return text


def run_family(make, threads_list, repeats, gap_s, record):
    """Every case of one family at every thread count, then its ggml contexts freed."""
    gp, gd, (prefill, step) = make()
    try:
        for threads in threads_list:
            torch.set_num_threads(threads)
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            (diff, diff_ad), st = prefill["check"](threads)
            S0 = st.S.clone()
            for case, n, d, da in ((prefill, repeats, diff, diff_ad), (step, 20 * repeats, None, None)):
                if d is None:
                    d, da = case["check"](threads, S0)
                fns = {"ggml": lambda c=case, t=threads: c["ggml"](t), "linattn": case["linattn"]}
                setups = [case["setup"], None]
                if case["adapter"] is not None:
                    fns["adapter"] = case["adapter"]
                    setups.append(None)
                if case is step:  # the op without llama.cpp's copy of the new state back (a prefill's is one copy)
                    fns["ggml_op"] = lambda c=case, t=threads: c["ggml"](t, op_alone=True)
                    setups.append(None)
                ms = dict(zip(fns, timed_medians_ms(list(fns.values()), n, setups, gap_s), strict=True))
                row = {"family": case["family"], "what": case["what"], "threads": threads, "repeats": n,
                       "max_rel_diff": d, "adapter_max_rel_diff": da, "scan_gflop": case.get("gflop")}
                for name in ("ggml", "ggml_op", "linattn", "adapter"):
                    row[f"{name}_ms"] = ms.get(name)
                    if name != "ggml":
                        row[f"{name}_vs_ggml"] = ms[name] / ms["ggml"] if name in ms else None
                record(row)
    finally:
        gp.close()
        gd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default=os.environ.get("GGML_LIB_DIR"),
                        help="folder with libggml-base.so and libggml-cpu.so (default: $GGML_LIB_DIR)")
    parser.add_argument("--T", type=int, default=4096, help="prefill length")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per prefill row (20x per decode row)")
    parser.add_argument("--gap-ms", type=float, default=10.0,
                        help="idle time before each timed run (the other runtime's spinning threads go to sleep)")
    parser.add_argument("--only", choices=["mamba2", "gated_delta"], default=None)
    parser.add_argument("--out", default=None, help="JSON result path (the table goes next to it as .md)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if not args.lib:
        sys.exit("ggml_bench: pass --lib DIR (the folder with libggml-base.so and libggml-cpu.so, from "
                 "scripts/ggml_build.sh) or set GGML_LIB_DIR")
    g, cpu, has_gdn = load_ggml(args.lib)
    rows = []

    def record(row):
        row["load_1min"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        ad = f"adapter {row['adapter_ms']:9.3f} ({row['adapter_vs_ggml']:5.2f}x) " if row["adapter_ms"] else ""
        ad += f"ggml op alone {row['ggml_op_ms']:9.3f} " if row["ggml_op_ms"] else ""
        print(f"{row['threads']}t {row['family']:28s} {row['what']:14s} ggml {row['ggml_ms']:9.3f} ms  linattn "
              f"{row['linattn_ms']:9.3f} ({row['linattn_vs_ggml']:5.2f}x) {ad} rel diff {row['max_rel_diff']:.1e}"
              f"  load {row['load_1min']}", flush=True)

    start = time.perf_counter()
    with torch.no_grad():
        sgemm = {t: sgemm_gflops(t) for t in sorted({1, *args.threads})}  # 1 thread: the products' reference
        print("this machine's sgemm (torch.mm, 2048 x 2048):", ", ".join(f"{v:.1f} GFlop/s at {t}t"
                                                                          for t, v in sgemm.items()))
        products = {name: chunk_product_gflops(H // G, G) for name, H, G in MAMBA2_LAYERS}
        print("the chunk form's products, 1 thread:", products)
        families = []
        if args.only in (None, "mamba2"):
            families += [lambda n=name, h=H, gr=G: mamba2_cases(g, cpu, n, h, 64, 128, gr, args.T, args.repeats)
                         for name, H, G in MAMBA2_LAYERS]
        if args.only in (None, "gated_delta"):
            if has_gdn:
                families.append(lambda: gated_delta_cases(g, cpu, args.T, args.repeats))
            else:
                print("this ggml has no ggml_gated_delta_net: the Gated DeltaNet rows are skipped")
        for make in families:
            run_family(make, args.threads, args.repeats, args.gap_ms / 1e3, record)
    doc = {"tool": "scripts/ggml_bench.py", "T": args.T, "B": 1, "dtype": "float32", "repeats": args.repeats,
           "threads": args.threads, "processor": processor(), "isa": vector_isa(), "cpu_count": os.cpu_count(),
           "ggml": ggml_version(g, args.lib), "torch": torch.__version__, "numba": numba.__version__,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "gap_ms": args.gap_ms,
           "sgemm_gflops": {str(t): v for t, v in sgemm.items()}, "chunk_product_gflops_1t": products,
           "seconds": round(time.perf_counter() - start, 1),
           "note": "medians of interleaved runs (ggml, linattn, adapter); x_vs_ggml = x's time / ggml's time (above 1:"
                   " slower than ggml); load_1min is os.getloadavg()[0] after each row", "rows": rows}
    if args.out:
        print("wrote", atomic_write_json(args.out, doc, overwrite=args.overwrite))
        md = Path(args.out).with_suffix(".md")
        atomic_write(md, lambda tmp: tmp.write_text(table(doc), encoding="utf-8"), overwrite=args.overwrite)
        print("wrote", md)
    else:
        print(table(doc))


def table(doc) -> str:
    lines = [f"ggml's CPU ops (ggml {doc['ggml']}) against linattn's, {doc['processor']} ({doc['cpu_count']} "
             f"cores; {doc['isa']}), OMP_WAIT_POLICY={doc['omp_wait_policy'] or 'unset'}, float32, B = 1, "
             "medians of interleaved runs (runs per row in the JSON); time / ggml's time "
             "in parentheses (above 1: slower than ggml); load average (1 min) per row.", "",
             "| family | what | threads | ggml | ggml op alone | linattn | HF adapter on linattn "
             "| max rel. diff (linattn; adapter) | load |", "|---|---|---|---|---|---|---|---|---|"]

    def ms(t):
        return f"{t * 1e3:,.1f} µs" if t < 1 else f"{t:,.1f} ms"

    for r in doc["rows"]:
        ad, op = ("-" if r[f"{n}_ms"] is None else f"{ms(r[f'{n}_ms'])} ({r[f'{n}_vs_ggml']:.2f}x)"
                  for n in ("adapter", "ggml_op"))
        diff = f"{r['max_rel_diff']:.1e}" + ("" if r["adapter_max_rel_diff"] is None
                                             else f"; {r['adapter_max_rel_diff']:.1e}")
        lines.append(f"| {r['family']} | {r['what']} | {r['threads']} | {ms(r['ggml_ms'])} | {op} | "
                     f"{ms(r['linattn_ms'])} ({r['linattn_vs_ggml']:.2f}x) | {ad} | {diff} | {r['load_1min']} |")
    rated = [r for r in doc["rows"] if r.get("scan_gflop")]
    if rated and doc.get("sgemm_gflops"):
        one = doc["sgemm_gflops"]["1"]
        lines += ["", "The Mamba-2 prefills as rates: the scan's multiply-adds (4 N P flops per token and value head: "
                  "the state update k vᵀ and the read Sᵀ q, which every form does) per second, and in parentheses "
                  "that rate's share of this machine's sgemm (torch.mm of 2048 x 2048 float32 matrices, same "
                  "threads, measured in the same run). The last column is the share a time of half ggml's would "
                  "take. The chunk form's two products alone, at 1 thread and these layers' shapes: "
                  + "; ".join(f"{name} read {r['read']} and write {r['write']} GFlop/s "
                              f"({r['read'] / one:.0%}, {r['write'] / one:.0%})"
                              for name, r in doc.get("chunk_product_gflops_1t", {}).items()) + ".", "",
                  "| family | threads | sgemm | ggml | linattn | HF adapter on linattn | half ggml's time |",
                  "|---|---|---|---|---|---|---|"]
        for r in rated:
            peak = doc["sgemm_gflops"][str(r["threads"])]

            def rate(t, peak=peak, r=r):
                return f"{r['scan_gflop'] / t * 1e3:.1f} GFlop/s ({r['scan_gflop'] / t * 1e3 / peak:.0%})"

            lines.append(f"| {r['family']} | {r['threads']} | {peak:.1f} GFlop/s | {rate(r['ggml_ms'])} | "
                         f"{rate(r['linattn_ms'])} | {rate(r['adapter_ms'])} | {rate(r['ggml_ms'] / 2)} |")
    return "\n".join(lines) + "\n"


def product_gflops(a: torch.Tensor, b: torch.Tensor, threads: int, repeats: int) -> float:
    """The median rate of ``torch.matmul(a, b)`` (batched or not) on ``threads``, in GFlop/s."""
    torch.set_num_threads(threads)
    c = torch.matmul(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b, out=c)
        times.append(time.perf_counter() - t0)
    return 2 * a.numel() * b.shape[-1] / statistics.median(times) / 1e9


def chunk_product_gflops(Hg: int, G: int, C: int = 32, N: int = 128, P: int = 64) -> dict:
    """The rates, on one thread, of the grouped chunk form's two products per chunk at a layer's shapes: the read
    ``[C, N] x [N, Hg P]`` and the state write ``[N, C] x [C, Hg P]``, batched over the G groups (as
    `linattn.ops.gated.chunk_grouped` calls them; on more threads each runs on its share of the heads)."""
    return {what: round(product_gflops(torch.randn(G, m, k), torch.randn(G, k, Hg * P), 1, 50), 1)
            for what, (m, k) in (("read", (C, N)), ("write", (N, C)))}


def sgemm_gflops(threads: int, n: int = 2048) -> float:
    """This machine's float32 matrix-product rate on ``threads``: torch.mm of n x n."""
    return product_gflops(torch.randn(n, n), torch.randn(n, n), threads, 7)


if __name__ == "__main__":
    main()
