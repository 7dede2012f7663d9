"""HF transformers' recurrent-state families on a CPU: HF's own torch functions against linattn's, side by side.

Per family, at a real layer geometry, B = 1, float32, in one process:

* Gated DeltaNet at Qwen3.5's (16 q/k heads, 32 value heads, head dims 128);
* Kimi Delta Attention at Kimi Linear's (32 heads, head dims 128, a gate per key channel; prefill at ``--kda-T``);
* Mamba-2 at Mamba-2-2.7B's (80 heads of dim 64, state size 128, one group; Granite 4's have 128 heads of 64);
* the short convolution at Mamba-2-2.7B's (5376 channels, kernel 4),

the replaced function at prefill (``--T`` tokens) and one decode step, at each of ``--threads`` (medians of
``--repeats`` runs, 20 times as many for a decode step, HF's and linattn's interleaved so that a shared machine's
changing load falls on both alike; the load average is recorded with every row), then small whole models (a few
layers at the same geometries, small vocabulary and experts): prefill tokens/s and greedy ``generate`` tokens/s,
HF's torch code against ``linattn.integrations.transformers.patch()``. Two more measures of the same small models
(Granite 4 H-Tiny's geometry too):

* share: the time of a prefill (``--model-T`` tokens) and of one decode token split into the replaced functions
  and everything else, on both paths (each module-level function the patch replaces wrapped by a timer), with the
  whole-model speed-up Amdahl's law allows from the functions' speed-up, at ``--share-threads``;
* train: one training step's forward and backward (no optimizer step) on ``--train-B`` x ``--train-T`` tokens,
  both paths interleaved, and the largest relative difference of any parameter's gradient.

``--only functions,models,share,train`` picks parts, ``--models`` the small models;

    PYTHONPATH=src python scripts/hf_families_bench.py --out benchmarks/results/hf_families_cpu.json

writes the JSON and a Markdown table next to it (same name, ``.md``); ``--merge`` keeps the parts of an existing
file that a run does not redo.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import torch
import torch.nn.functional as F
import transformers

from linattn.integrations import transformers as lt
from linattn.tools.harness.machine import processor_name as processor
from linattn.tools.harness.results import atomic_write, atomic_write_json


def paired_medians_ms(fns, repeats: int) -> list[float]:
    """Median ms of each function, runs interleaved (a, b, a, b, ...); one warm-up run each first."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(s) * 1e3 for s in samples]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def hf_fn(model_type: str, name: str):
    return inspect.unwrap(lt.original(lt.modeling(model_type), name))


def op_cases(T: int, kda_T: int):
    """(family, what, HF's call, linattn's call, the check: both outputs from the same inputs and state) per
    replaced function. The decode calls update their own state (in place, as in a generation loop)."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    # Gated DeltaNet, Qwen3.5
    H, HV, D = 16, 32, 128
    q, k = (torch.randn(1, T, H, D, generator=gen) for _ in range(2))
    v = torch.randn(1, T, HV, D, generator=gen)
    g = -F.softplus(torch.randn(1, T, HV, generator=gen)) * 0.1
    beta = torch.rand(1, T, HV, generator=gen)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    for family, model_type, chunk, step, ours_chunk, ours_step, gate in (
            ("gated_delta (Qwen3.5)", "qwen3_5", "torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
             lt.chunk_gated_delta_rule, lt.recurrent_gated_delta_rule, g),
            ("kda (Kimi Linear)", "kimi_linear", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention",
             lt.chunk_kimi_delta_attention, lt.recurrent_kimi_delta_attention, None)):
        n = T
        if gate is None:  # Kimi: 32 heads of q/k and v, a gate per key channel
            n = kda_T
            q, k, v = (torch.randn(1, n, 32, D, generator=gen) for _ in range(3))
            gate = -F.softplus(torch.randn(1, n, 32, D, generator=gen)) * 0.1
            beta = torch.rand(1, n, 32, generator=gen)
        args = (q, k, v, gate, beta)
        hf_chunk, hf_step = hf_fn(model_type, chunk), hf_fn(model_type, step)
        cases.append((family, f"prefill T={n}", lambda a=args, f=hf_chunk: f(*a, **kw),
                      lambda a=args, f=ours_chunk: f(*a, **kw),
                      lambda a=args, f=hf_chunk, o=ours_chunk: (o(*a, **kw)[0], f(*a, **kw)[0])))
        S = ours_chunk(*args, **kw)[1]
        one = tuple(x[:, :1] for x in args)
        S_hf, S_ours = S.clone(), S.clone()
        cases.append((family, "decode step", lambda a=one, f=hf_step, s=S_hf: f(*a, initial_state=s, **kw),
                      lambda a=one, f=ours_step, s=S_ours: f(*a, initial_state=s, **kw),
                      lambda a=one, f=hf_step, o=ours_step, s=S: (o(*a, initial_state=s.clone(), **kw)[0],
                                                                 f(*a, initial_state=s.clone(), **kw)[0])))
    # Mamba-2, Mamba-2-2.7B
    H, P, N, G = 80, 64, 128, 1
    x = torch.randn(1, T, H, P, generator=gen)
    dt = torch.randn(1, T, H, generator=gen) - 2
    A = -torch.rand(H, generator=gen) * 8 - 1
    Bm, Cm = (torch.randn(1, T, G, N, generator=gen) for _ in range(2))
    Dp, dt_bias = torch.randn(H, generator=gen), torch.randn(H, generator=gen) * 0.1
    skw = dict(D=Dp, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
    hf_scan, hf_ssu = hf_fn("mamba2", "mamba2_chunk_scan"), hf_fn("mamba2", "mamba2_selective_state_update")
    cases.append(("mamba2 (Mamba-2-2.7B)", f"prefill T={T}", lambda: hf_scan(x, dt, A, Bm, Cm, 256, **skw),
                  lambda: lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, 256, **skw),
                  lambda: (lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, 256, **skw)[0],
                           hf_scan(x, dt, A, Bm, Cm, 256, **skw)[0])))
    S = lt.mamba2_chunk_scan(x, dt, A, Bm, Cm, 256, **skw)[1]
    s_hf, s_ours = S.contiguous(), S.clone(memory_format=torch.preserve_format)  # HF's layout; linattn's
    step_args = (x[:, 0], dt[:, 0, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), Bm[:, 0], Cm[:, 0])
    dkw = dict(D=Dp[:, None].expand(-1, P), dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True)
    cases.append(("mamba2 (Mamba-2-2.7B)", "decode step", lambda: hf_ssu(s_hf, *step_args, **dkw),
                  lambda: lt.mamba2_selective_state_update(s_ours, *step_args, **dkw),
                  lambda: (lt.mamba2_selective_state_update(S.clone(memory_format=torch.preserve_format),
                                                            *step_args, **dkw),
                           hf_ssu(S.contiguous(), *step_args, **dkw))))
    # The short convolution, Mamba-2-2.7B's channels
    C, K = 5120 + 2 * G * N, 4
    xc = torch.randn(1, T, C, generator=gen).transpose(1, 2)  # HF passes a transposed view
    w, b = torch.randn(C, K, generator=gen), torch.randn(C, generator=gen)
    hf_conv, hf_upd = hf_fn("mamba2", "causal_conv1d_fn"), hf_fn("mamba2", "causal_conv1d_update")
    cases.append(("conv (Mamba-2-2.7B)", f"prefill T={T}", lambda: hf_conv(xc, w, b, "silu"),
                  lambda: lt.causal_conv1d_fn(xc, w, b, "silu"),
                  lambda: (lt.causal_conv1d_fn(xc, w, b, "silu"), hf_conv(xc, w, b, "silu"))))
    win_hf, win_ours = xc[..., :K].contiguous(), xc[..., :K].contiguous()
    cases.append(("conv (Mamba-2-2.7B)", "decode step", lambda: hf_upd(xc[..., :1], win_hf, w, b, "silu"),
                  lambda: lt.causal_conv1d_update(xc[..., :1], win_ours, w, b, "silu"),
                  lambda: (lt.causal_conv1d_update(xc[..., :1], xc[..., :K].contiguous(), w, b, "silu"),
                           hf_upd(xc[..., :1], xc[..., :K].contiguous(), w, b, "silu"))))
    return cases


def small_models():
    """(name, model type, config) of the whole-model rows: real head geometry, few layers, small vocab/experts."""
    t = transformers
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return [
        ("Qwen3.5 geometry, 4 layers (3 Gated DeltaNet, 1 attention)", "qwen3_5", t.Qwen3_5TextConfig(
            vocab_size=4096, hidden_size=2048, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=2, head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
            linear_key_head_dim=128, linear_value_head_dim=128,
            layer_types=["linear_attention"] * 3 + ["full_attention"], **ids)),
        ("Kimi Linear geometry, 4 layers (3 KDA, 1 MLA)", "kimi_linear", t.KimiLinearConfig(
            vocab_size=4096, hidden_size=2304, intermediate_size=2048, moe_intermediate_size=256,
            num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=32, num_local_experts=8,
            num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=512, q_lora_rank=None,
            qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, linear_num_heads=32, linear_head_dim=128,
            layer_types=["linear_attention"] * 3 + ["full_attention"], mlp_layer_types=["dense"] * 4, **ids)),
        ("Mamba-2-2.7B geometry, 4 layers", "mamba2", t.Mamba2Config(
            vocab_size=4096, hidden_size=2560, num_hidden_layers=4, num_heads=80, head_dim=64, expand=2,
            n_groups=1, state_size=128, chunk_size=256, residual_in_fp32=False, **ids)),
        ("Granite 4 H-Tiny geometry, 4 layers (3 Mamba-2, 1 attention)", "granitemoehybrid",
         t.GraniteMoeHybridConfig(
            vocab_size=4096, hidden_size=1536, intermediate_size=512, shared_intermediate_size=1024,
            num_hidden_layers=4, num_attention_heads=12, num_key_value_heads=4, num_local_experts=8,
            num_experts_per_tok=2, mamba_n_heads=48, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128,
            mamba_expand=2, mamba_chunk_size=256, position_embedding_type="nope",
            layer_types=["linear_attention"] * 3 + ["full_attention"], **ids)),
    ]


class RecurrentClock:
    """Wall time spent inside the module-level functions the patch replaces (every function of the model type's
    family), whichever is in force when the clock starts: HF's torch code or linattn's. Each is wrapped by one
    ``perf_counter`` pair (a microsecond against calls of 0.1 ms and more); a call made from inside another counts
    once. A context manager: start it inside the path's patch, so that it wraps that path's functions."""

    def __init__(self, model_type: str):
        self.model_type, self.seconds, self.calls, self._depth, self._patch = model_type, 0.0, 0, 0, None

    def _timed(self, fn):
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.seconds += time.perf_counter() - start
                    self.calls += 1
        return timed

    def __enter__(self) -> RecurrentClock:
        module = lt.modeling(self.model_type)
        self._patch = lt.Patch([(module, name, self._timed(getattr(module, name)))
                                for name in lt.FAMILIES[lt.FAMILY_OF[self.model_type]][1]])
        return self

    def __exit__(self, *exc) -> None:
        self._patch.undo()


def timed_run(path, model_type: str, fn):
    """(total s, s inside the replaced functions, fn's result) of ``fn()`` on one path (``lt.patch`` or
    ``lt.use_hf_torch_fallback``); the patch is made before the clock starts."""
    with path((model_type,)), RecurrentClock(model_type) as clock:
        start = time.perf_counter()
        out = fn()
        total = time.perf_counter() - start
    return total, clock.seconds, out


def paired_timed(model_type: str, fns, repeats: int):
    """``paired_medians_ms`` through ``timed_run``: per path (HF's, linattn's), the median total ms, the median ms
    inside the replaced functions, and the last run's result. ``fns`` are (HF's call, linattn's call), made under
    their path's patch. One warm-up run each first."""
    paths = (lt.use_hf_torch_fallback, lt.patch)
    for path, fn in zip(paths, fns, strict=True):
        timed_run(path, model_type, fn)
    totals, inside, last = [[] for _ in paths], [[] for _ in paths], [None for _ in paths]
    for _ in range(repeats):
        for i, (path, fn) in enumerate(zip(paths, fns, strict=True)):
            total, rec, last[i] = timed_run(path, model_type, fn)
            totals[i].append(total)
            inside[i].append(rec)
    return [(statistics.median(t) * 1e3, statistics.median(r) * 1e3, out)
            for t, r, out in zip(totals, inside, last, strict=True)]


def share_row(hf_total: float, hf_recurrent: float, ours_total: float, ours_recurrent: float) -> dict:
    """The split of a token's time (any unit) on both paths and what Amdahl's law allows: with the replaced
    functions sped up by ``function_speedup`` = HF's recurrent time / linattn's and the rest unchanged, the whole
    model can go ``amdahl_speedup`` = HF's total / (HF's rest + linattn's recurrent time) faster, and no faster
    than ``amdahl_limit`` = HF's total / HF's rest however fast the functions get."""
    hf_rest, ours_rest = hf_total - hf_recurrent, ours_total - ours_recurrent
    return {"hf_total": hf_total, "hf_recurrent": hf_recurrent, "hf_rest": hf_rest,
            "hf_share": hf_recurrent / hf_total, "linattn_total": ours_total, "linattn_recurrent": ours_recurrent,
            "linattn_rest": ours_rest, "linattn_share": ours_recurrent / ours_total,
            "function_speedup": hf_recurrent / ours_recurrent, "speedup": hf_total / ours_total,
            "amdahl_speedup": hf_total / (hf_rest + ours_recurrent),
            "amdahl_limit": hf_total / hf_rest if hf_rest > 0 else float("inf")}


def decode_share(model, model_type: str, prompt: torch.Tensor, steps: int):
    """Median ms of one decode token (the total and inside the replaced functions) on HF's path and linattn's,
    each with its own cache filled by its own prefill of ``prompt``; steps interleaved, each feeding the token
    the previous one chose, so both caches grow alike (context ``len(prompt)`` to ``len(prompt) + steps``)."""
    paths = (lt.use_hf_torch_fallback, lt.patch)
    state = []
    for path in paths:
        with path((model_type,)):
            out = model(prompt, use_cache=True)
        state.append([out["cache"], out.logits[:, -1:].argmax(-1)])
    samples = [([], []) for _ in paths]
    for _ in range(steps + 1):  # the first step is a warm-up
        for path, st, (totals, inside) in zip(paths, state, samples, strict=True):
            cache, token = st

            def one(cache=cache, token=token):
                return model(token, cache=cache, use_cache=True)

            total, rec, out = timed_run(path, model_type, one)
            st[1] = out.logits[:, -1:].argmax(-1)
            totals.append(total)
            inside.append(rec)
    same = bool(torch.equal(state[0][1], state[1][1]))
    return [(statistics.median(t[1:]) * 1e3, statistics.median(r[1:]) * 1e3) for t, r in samples], same


def grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def train_step(model, ids: torch.Tensor):
    """One training step's forward and backward (no optimizer step: it is the same code on both paths): the
    causal-LM loss on ``ids`` as labels; gradients accumulate from zero."""
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach()


def grad_rel_diff(ours: dict[str, torch.Tensor], hf: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest, over parameters, max |ours - HF's| / max |HF's| of a parameter's gradient, and its name."""
    if ours.keys() != hf.keys():
        raise RuntimeError(f"different parameters got gradients: {sorted(ours.keys() ^ hf.keys())}")
    worst = max(ours, key=lambda name: rel(ours[name], hf[name]))
    return rel(ours[worst], hf[worst]), worst


PARTS = ("functions", "models", "share", "train")
TIMER = ("wall time inside the module-level functions the patch replaces, each wrapped by one perf_counter pair "
         "(a call from inside another counted once), on both paths; rest = total - that")


def set_threads(threads: int) -> None:
    """Threads for torch and linattn's compiled kernels. numba first: its first ``set_num_threads`` starts its
    OpenMP layer, which resets the OpenMP thread count torch reads to ``NUMBA_NUM_THREADS``."""
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    if torch.get_num_threads() != threads:
        raise RuntimeError(f"torch runs {torch.get_num_threads()} threads, not the {threads} asked for")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096, help="prefill length of the function rows")
    parser.add_argument("--kda-T", type=int, default=1024,
                        help="prefill length of the Kimi row: HF's torch KDA holds [heads, T, 64, 128] float32 "
                             "temporaries (about 1 GB each per 1024 tokens at Kimi's geometry)")
    parser.add_argument("--model-T", type=int, default=1024, help="prefill length of the whole-model rows")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generate() makes per whole-model row")
    parser.add_argument("--gen-batch", type=int, nargs="+", default=[1, 8],
                        help="batch sizes of the generate rows (the same 64-token prompt length in every row)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts to run, some of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--models", nargs="+", default=None,
                        help="model types of the whole-model parts (default: every small model)")
    parser.add_argument("--share-threads", type=int, nargs="+", default=[1],
                        help="threads of the share rows (a prefill shared with the models part where both run)")
    parser.add_argument("--decode-steps", type=int, default=8, help="decode tokens timed per share row")
    parser.add_argument("--train-B", type=int, default=2)
    parser.add_argument("--train-T", type=int, default=256)
    parser.add_argument("--skip-models", action="store_true", help="the same as --only functions")
    parser.add_argument("--decode-only", action="store_true",
                        help="of the function rows, only the decode steps (with --only functions)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--merge", action="store_true",
                        help="keep the parts of the existing --out file that this run does not redo (implies "
                             "--overwrite for the parts it does)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS):
        parser.error(f"--only: unknown parts {sorted(only - set(PARTS))}; expected some of {', '.join(PARTS)}")
    if args.skip_models:
        only &= {"functions"}
    models = small_models()
    if args.models is not None:
        unknown = set(args.models) - {m for _, m, _ in models}
        if unknown:
            parser.error(f"--models: unknown {sorted(unknown)}; expected some of {[m for _, m, _ in models]}")
        models = [entry for entry in models if entry[1] in args.models]
    rows, share, train = [], [], []

    def record(row, into=rows):
        row["load_1min"] = round(os.getloadavg()[0], 2)
        into.append(row)
        if into is rows:
            print(f"{row['threads']}t {row['family']:24s} {row['what']:40s} HF {row['hf']:10.2f} "
                  f"linattn {row['linattn']:10.2f} {row['unit']}  {row['speedup']:6.2f}x  "
                  f"rel diff {row.get('max_rel_diff', 0):.1e}  load {row['load_1min']}", flush=True)
        else:
            print(f"{row['threads']}t {row['model']:24s} {row['what']:40s} "
                  + "  ".join(f"{k} {v:.3g}" for k, v in row.items() if isinstance(v, float)), flush=True)

    torch.manual_seed(0)
    if "functions" in only:
        with torch.no_grad():
            cases = op_cases(args.T, args.kda_T)
            for threads in args.threads:
                set_threads(threads)
                for family, what, hf_call, ours_call, check in cases:
                    if args.decode_only and what != "decode step":
                        continue
                    # a decode step takes well under a millisecond: many more runs for a stable median
                    n = args.repeats * 20 if what == "decode step" else args.repeats
                    hf_ms, ours_ms = paired_medians_ms([hf_call, ours_call], n)
                    record({"level": "function", "family": family, "what": what, "threads": threads, "unit": "ms",
                            "hf": hf_ms, "linattn": ours_ms, "speedup": hf_ms / ours_ms,
                            "max_rel_diff": rel(*check())})
            del cases
    for name, model_type, cfg in models:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        ids = torch.randint(3, 4096, (1, args.model_T))
        prompts = {b: torch.randint(3, 4096, (b, 64)) for b in args.gen_batch}
        prompt = ids[:, :64]
        model_threads = args.threads if "models" in only else []
        share_threads = args.share_threads if "share" in only else []
        with torch.no_grad():
            for threads in sorted(set(model_threads) | set(share_threads)):
                set_threads(threads)
                T = args.model_T
                (hf_ms, hf_rec, hf_logits), (ours_ms, ours_rec, ours_logits) = paired_timed(
                    model_type, [lambda m=model, x=ids: m(x).logits] * 2, max(1, args.repeats - 1))
                err = rel(ours_logits, hf_logits)
                if threads in model_threads:
                    record({"level": "model", "family": name, "what": f"prefill T={T}", "threads": threads,
                            "unit": "tokens/s", "hf": T / hf_ms * 1e3, "linattn": T / ours_ms * 1e3,
                            "speedup": hf_ms / ours_ms, "max_rel_diff": err})

                    for b, start in prompts.items():
                        def generate(path, m=model, model_type=model_type, start=start):
                            with path((model_type,)):
                                return m.generate(start, max_new_tokens=args.new_tokens,
                                                  min_new_tokens=args.new_tokens, do_sample=False)

                        # (names of their own: the share row below reads the prefill's times)
                        hf_gen, ours_gen = paired_medians_ms([lambda g=generate: g(lt.use_hf_torch_fallback),
                                                              lambda g=generate: g(lt.patch)],
                                                             max(1, args.repeats - 1))
                        same = bool(torch.equal(generate(lt.patch), generate(lt.use_hf_torch_fallback)))
                        n = args.new_tokens
                        record({"level": "model", "family": name,
                                "what": f"generate {n} tokens after 64" + (f", batch {b}" if b > 1 else ""),
                                "threads": threads, "unit": "tokens/s", "hf": b * n / hf_gen * 1e3,
                                "linattn": b * n / ours_gen * 1e3, "speedup": hf_gen / ours_gen,
                                "same_tokens": same, "batch": b})
                if threads in share_threads:
                    record({"model": name, "model_type": model_type, "what": f"prefill T={T}", "threads": threads,
                            "unit": "ms", **share_row(hf_ms, hf_rec, ours_ms, ours_rec), "max_rel_diff": err},
                           share)
                    ((hf_ms, hf_rec), (ours_ms, ours_rec)), same = decode_share(model, model_type, prompt,
                                                                                 args.decode_steps)
                    record({"model": name, "model_type": model_type,
                            "what": f"decode token after {prompt.shape[1]}", "threads": threads, "unit": "ms",
                            **share_row(hf_ms, hf_rec, ours_ms, ours_rec), "same_tokens": same}, share)
        if "train" in only:
            model.train()
            batch = torch.randint(3, 4096, (args.train_B, args.train_T))
            for threads in args.threads:
                set_threads(threads)
                (hf_ms, hf_rec, hf_loss), (ours_ms, ours_rec, ours_loss) = paired_timed(
                    model_type, [lambda m=model, x=batch: train_step(m, x)] * 2, max(1, args.repeats - 1))
                ours_grads = grads(model)  # the last timed step was linattn's
                with lt.use_hf_torch_fallback((model_type,)):
                    train_step(model, batch)
                diff, worst = grad_rel_diff(ours_grads, grads(model))
                record({"model": name, "model_type": model_type,
                        "what": f"forward + backward B={args.train_B} T={args.train_T}", "threads": threads,
                        "unit": "ms", "hf": hf_ms, "linattn": ours_ms, "speedup": hf_ms / ours_ms,
                        "hf_recurrent_forward": hf_rec, "linattn_recurrent_forward": ours_rec,
                        "loss_rel_diff": rel(ours_loss, hf_loss), "max_grad_rel_diff": diff,
                        "worst_grad": worst}, train)
            model.zero_grad(set_to_none=True)
        del model

    doc = {"tool": "scripts/hf_families_bench.py", "T": args.T, "kda_T": args.kda_T, "model_T": args.model_T, "B": 1,
           "dtype": "float32", "repeats": args.repeats, "threads": args.threads, "processor": processor(),
           "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
           "note": "medians of interleaved runs on a machine shared with other work; load_1min is os.getloadavg()[0]"
                   " after each row", "parts": [part for part in PARTS if part in only], "rows": rows,
           "command": " ".join(["python", *sys.argv])}
    allocator = {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}
    if allocator:  # glibc's allocator settings change HF's side most (docs/transformers.md)
        doc["environment"] = " ".join(f"{k}={v}" for k, v in allocator.items())
    if share:
        doc["share"] = {"threads": args.share_threads, "decode_steps": args.decode_steps, "timer": TIMER,
                        "timed_prefills": max(1, args.repeats - 1), "rows": share}
    if train:
        doc["train"] = {"B": args.train_B, "T": args.train_T, "step": "forward + backward, no optimizer step",
                        "timed_steps": max(1, args.repeats - 1), "rows": train}
    if args.out and args.merge and Path(args.out).exists():
        doc = merged(json.loads(Path(args.out).read_text(encoding="utf-8")), doc, only)
    if args.out:
        print("wrote", atomic_write_json(args.out, doc, overwrite=args.overwrite or args.merge))
        md = Path(args.out).with_suffix(".md")
        atomic_write(md, lambda tmp: tmp.write_text(table(doc), encoding="utf-8"),
                     overwrite=args.overwrite or args.merge)
        print("wrote", md)
    else:
        print(table(doc))


def merged(old: dict, new: dict, only: set[str]) -> dict:
    """``new`` with what ``old`` holds of the parts it did not run: the function or model rows (with the settings
    they were run at) and the share and train sections."""
    keep = {level for part, level in (("functions", "function"), ("models", "model")) if part not in only}
    settings = {"function": ("T", "kda_T"), "model": ("model_T",)}
    kept = [k for level in keep for k in settings[level]] + (["repeats", "threads"] if len(keep) == 2 else [])
    doc = {**new, **{k: old[k] for k in kept if k in old}}
    # model rows of other models (or thread counts) than this run's stay too
    redone = {(r["family"], r["what"], r["threads"]) for r in new["rows"] if r["level"] == "model"}
    doc["rows"] = [r for r in old.get("rows", []) if r["level"] in keep or (
        r["level"] == "model" and (r["family"], r["what"], r["threads"]) not in redone)] + new["rows"]
    for part in ("share", "train"):
        if part not in old:
            continue
        if part not in only:
            doc[part] = old[part]
        elif part in doc:  # rerun for some models or thread counts: the old rows of the others stay
            redone = {(r["model_type"], r["threads"]) for r in doc[part]["rows"]}
            kept_rows = [r for r in old[part]["rows"] if (r["model_type"], r["threads"]) not in redone]
            doc[part] = {**doc[part], "rows": kept_rows + doc[part]["rows"]}
    doc["parts"] = [part for part in PARTS if part in only or part in old.get("parts", ("functions", "models"))]
    return doc


def table(doc) -> str:
    lines = [f"HF's torch functions against linattn's, {doc['processor']} ({doc['cpu_count']} cores), float32, B = 1, "
             f"medians of {doc['repeats']} interleaved runs; load average (1 min) per row.", ""]
    if doc.get("environment"):
        lines[:0] = [f"Run with glibc's allocator set by {doc['environment']}.", ""]
    if doc["rows"]:
        lines += ["| level | family | what | threads | HF | linattn | unit | speedup | max rel. diff | load |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        diff = f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ("same tokens" if r.get("same_tokens")
                                                                       else "tokens differ")
        lines.append(f"| {r['level']} | {r['family']} | {r['what']} | {r['threads']} | {r['hf']:,.2f} | "
                     f"{r['linattn']:,.2f} | {r['unit']} | {r['speedup']:.2f}x | {diff} | {r['load_1min']} |")
    if "share" in doc:
        lines += ["", f"Share of a token's time in the replaced functions ({doc['share']['timer']}); ms per call "
                      f"(a prefill: median of {doc['share'].get('timed_prefills', '?')} after a warm-up; one decode "
                      f"token: median of {doc['share']['decode_steps']} steps); "
                      "Amdahl: the whole-model speedup the measured function speedup allows with the rest unchanged, "
                      "and its limit (functions taking no time).", "",
                  "| model | what | threads | HF total | HF recurrent | HF rest | HF share | linattn total | "
                  "linattn recurrent | linattn rest | linattn share | function speedup | model speedup | Amdahl | "
                  "Amdahl limit | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in doc["share"]["rows"]:
            lines.append(f"| {r['model']} | {r['what']} | {r['threads']} | {r['hf_total']:,.1f} | "
                         f"{r['hf_recurrent']:,.1f} | {r['hf_rest']:,.1f} | {r['hf_share']:.0%} | "
                         f"{r['linattn_total']:,.1f} | {r['linattn_recurrent']:,.1f} | {r['linattn_rest']:,.1f} | "
                         f"{r['linattn_share']:.0%} | {r['function_speedup']:.1f}x | {r['speedup']:.2f}x | "
                         f"{r['amdahl_speedup']:.2f}x | {r['amdahl_limit']:.2f}x | {r['load_1min']} |")
    if "train" in doc:
        t = doc["train"]
        lines += ["", f"Training step ({t['step']}), B = {t['B']}, T = {t['T']}, float32, the causal-LM loss; ms, "
                      f"medians of {t.get('timed_steps', '?')} interleaved steps after a warm-up; recurrent "
                      "forward: ms of the forward inside the replaced functions; gradient diff: the largest over "
                      "parameters of max |linattn - HF| / max |HF|.", "",
                  "| model | threads | HF ms | linattn ms | speedup | HF recurrent forward | "
                  "linattn recurrent forward | loss rel. diff | max grad rel. diff (parameter) | load |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in t["rows"]:
            lines.append(f"| {r['model']} | {r['threads']} | {r['hf']:,.0f} | {r['linattn']:,.0f} | "
                         f"{r['speedup']:.2f}x | {r['hf_recurrent_forward']:,.0f} | "
                         f"{r['linattn_recurrent_forward']:,.0f} | {r['loss_rel_diff']:.1e} | "
                         f"{r['max_grad_rel_diff']:.1e} ({r['worst_grad']}) | {r['load_1min']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
