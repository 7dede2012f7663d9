"""Which path runs, decided here and nowhere else: every rule that picks between a compiled kernel and the torch
forms under ``backend="auto"``, which backward differentiates a compiled prefill, and how many threads a compiled
call takes. Each rule names the measurement it came from (``benchmarks/results/``, ``scripts/``); change a rule
here when a new run says otherwise. The kernels hold no policy: they run on the threads they are given.

Pure functions of sizes, rules and thread counts: nothing here imports a kernel or touches a tensor.
"""

from __future__ import annotations

# Forms "auto" hands to a compiled kernel ("step" is decode); "parallel" and "scan" are asked for by name to study
# them, so they keep their torch form. The compiled token loop took 0.43-0.62x the torch chunk form's time for every
# rule at 1 and 2 threads (auto_over_torch in benchmarks/results/cpu_kernels_cpu.txt, scripts/cpu_kernels_bench.py).
AUTO_FORMS: tuple[str, ...] = ("chunk", "recurrent", "step")

# Rules whose compiled backward "auto" takes when inputs require grad: the torch form's backward differentiates a
# sequential chunk solve, the compiled reverse loop does not (benchmarks/results/compiled_backward_cost_cpu.txt).
AUTO_BACKWARD_RULES: tuple[str, ...] = ("delta", "gated_delta")

# GLA's per-key-channel gates under autograd: the torch chunk backward builds the chunk's decay products, the
# compiled reverse loop does not. One thread, B=1, T=8192, H=8, D=64: the compiled backward 0.68x the torch time;
# a whole MQAR training step 0.81-1.00x (benchmarks/results/compiled_backward_gated_cpu.txt,
# train_step_ab_gated_cpu.txt). At 2 threads 0.85x at T=8192, not faster at a training step's 4,096 rows.
BACKWARD_MULTITHREAD_MIN_ROWS = 1 << 16

# A compiled prefill, backward or token-loop call splits its (sequence, head) work over threads from this many
# state entries swept (T*B*H*Dk*Dw); below it, waking the pool costs more than it saves.
PREFILL_SPLIT_MIN_WORK = 1 << 17

# The one-call decode kernel splits its heads over threads from this many state entries (B*H*Dk*Dw). On the 2-core
# AMD EPYC with AVX-512, in three quiet runs, the split took 0.56-0.91x the serial time at 8M entries (32 MiB of
# state) and above, 0.61-0.97x at 4M (1.28x in an earlier run) and 0.91-13x below
# (benchmarks/results/decode_split_cpu.txt; on a Zen 3 EPYC earlier, where waking the second thread cost
# 100-450 us, 0.55-0.68x from 16M and 0.62-1.21x at 4M-8M).
# The general token loop's decode step (the cases the one-call kernel does not take) always runs serially: at 2
# threads it was 4-5x slower at batch 1 and mixed at 4-16 sequences of the Qwen3-Next geometry.
# Workers that wait awake (a bounded spin, then a futex sleep) and take chunks by compare-and-swap (measured at
# revision 84c6ee8, not kept) cut handing over to 34-38 us back to back, against the pool's 64-67 us, but lost to
# the serial step at every size up to 16.8M entries too, at a load average of 3 to 9 on the 2 cores (Mamba-2-2.7B's
# layer 1.46-2.29x, Qwen3.5's 1.56-2.69x, Kimi's 1.55-3.04x the serial time; benchmarks/results/
# decode_split_handoff_cpu.txt): they are not in the library. With the state cold in the cache, as in a model, the
# split took 1.75-2.2x the serial time at those three layers on a quiet machine (decode_split_cold_cpu.txt).
DECODE_SPLIT_MIN_ENTRIES = 1 << 23

# The compiled convolution's pass outside autograd splits its tokens over threads from this many tokens per thread:
# a pool thread's hand-over is tens of microseconds, a token of Mamba-2-2.7B's 5376 channels about one
# (benchmarks/results/hf_conv_ab_cpu.txt: 8.8x HF's torch form at 2 threads, 10.6x at 1, T=4096).
CONV_SPLIT_MIN_TOKENS = 64


def conv_threads(T: int, available: int) -> int:
    """Threads for the compiled convolution over ``T`` tokens: one per ``CONV_SPLIT_MIN_TOKENS``, at most
    ``available``."""
    return max(1, min(available, T // CONV_SPLIT_MIN_TOKENS))


# A CPU prefill under "auto" of the gated rule with one gate per head, no feature map or normalizer, no autograd
# and no packing (Mamba-2's scan; packed sequences keep the token loop) runs as the grouped chunk form, one matrix
# product per group of value heads sharing q/k and chunk (`linattn.ops.gated.chunk_grouped`), from this many tokens
# and value heads per q/k head; otherwise the token loop. On the 2-core AMD EPYC with AVX-512, quiet (load average
# 0.6-1.4; benchmarks/results/ssd_prefill_ab_cpu.txt, scripts/ssd_prefill_ab.py), at T=4096 the call took 0.99x
# the token loop's time at Mamba-2-2.7B's layer (80 value heads per q/k head) and 0.56x at Nemotron-H-8B's (16) at
# 1 thread, 0.94x and 0.87x at 2; chunks of 32 tokens ran in 0.88x / 0.57x at 1 thread against 0.99x / 0.64x for
# chunks of 64. At 16 value heads per q/k head and T = 128-2048 it took 1.05-1.20x at 1 thread and 0.96-1.14x at
# 2, and at T=1024 with 2-128 value heads per q/k head 1.11-1.79x: hence 4096 tokens (an earlier run under load
# had favoured it from 2048).
GROUPED_CHUNK_MIN_TOKENS = 4096
GROUPED_CHUNK_MIN_GROUP = 16
GROUPED_CHUNK_SIZE = 32


def grouped_chunk_threads(available: int, heads: int) -> int:
    """Threads for the grouped chunk form: ``available`` (torch's count), at most one per value head. Each runs a
    share of the heads with torch on one thread (`linattn.backends.cpu.grouped_prefill`): with torch's own threads
    the form's few hundred operations per call each end at a barrier, and with another process busy on one of the
    2 cores of the AMD EPYC (libgomp's default wait policy), at 2 threads and T=4096, Nemotron-H-8B's layer took
    10.0 s that way against 0.56 s for the shares and 0.88 s for the token loop, Mamba-2-2.7B's 0.72 s against
    0.22 s and 0.26 s (benchmarks/results/ssd_prefill_busy_core_cpu.txt, scripts/ssd_prefill_ab.py --busy-core)."""
    return max(1, min(available, heads))


def grouped_chunk(T: int, group: int) -> bool:
    """Whether the grouped chunk form runs a qualifying CPU prefill of ``T`` tokens with ``group`` value heads per
    q/k head."""
    return T >= GROUPED_CHUNK_MIN_TOKENS and group >= GROUPED_CHUNK_MIN_GROUP


# The Triton kernels run only when asked for (backend="triton") until a GPU run has measured them.
TRITON_UNDER_AUTO = False


def compiled_backward(rule: str, per_channel: bool, B: int, T: int, H: int, threads: int) -> bool:
    """Whether "auto" differentiates this CPU prefill through the compiled backward rather than the torch chunk
    form: the rules in ``AUTO_BACKWARD_RULES`` always; ``gated`` with one gate per key channel at one thread or
    from ``BACKWARD_MULTITHREAD_MIN_ROWS`` (token, head) rows; one gate per head keeps the torch backward."""
    if rule in AUTO_BACKWARD_RULES:
        return True
    return rule == "gated" and per_channel and (threads <= 1 or B * T * H >= BACKWARD_MULTITHREAD_MIN_ROWS)


def loop_threads(work: int, pairs: int, available: int) -> int:
    """Threads for a compiled prefill, backward or multi-token loop sweeping ``work`` state entries over ``pairs``
    (sequence, head) units: ``available`` (torch's count, capped by numba's), or 1 below
    ``PREFILL_SPLIT_MIN_WORK`` or with a single unit."""
    return available if available > 1 and pairs > 1 and work >= PREFILL_SPLIT_MIN_WORK else 1


def decode_threads(entries: int, available: int) -> int:
    """Threads for one decode step of the one-call kernel over a state of ``entries`` (B*H*Dk*Dw) values:
    ``available`` from ``DECODE_SPLIT_MIN_ENTRIES``, else 1 (the serial kernel)."""
    return available if available > 1 and entries >= DECODE_SPLIT_MIN_ENTRIES else 1
