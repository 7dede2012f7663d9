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
HF's torch code against ``linattn.integrations.transformers.patch()``.

    PYTHONPATH=src python scripts/hf_families_bench.py --out benchmarks/results/hf_families_cpu.json

writes the JSON and a Markdown table next to it (same name, ``.md``).
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import statistics
import time
from pathlib import Path

import numba
import torch
import torch.nn.functional as F
import transformers

from linattn.integrations import transformers as lt
from linattn.tools.harness.results import atomic_write, atomic_write_json


def processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096, help="prefill length of the function rows")
    parser.add_argument("--kda-T", type=int, default=1024,
                        help="prefill length of the Kimi row: HF's torch KDA holds [heads, T, 64, 128] float32 "
                             "temporaries (about 1 GB each per 1024 tokens at Kimi's geometry)")
    parser.add_argument("--model-T", type=int, default=1024, help="prefill length of the whole-model rows")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generate() makes per whole-model row")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--decode-only", action="store_true",
                        help="only the decode-step function rows (no prefill rows, no whole models)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    rows = []

    def record(row):
        row["load_1min"] = round(os.getloadavg()[0], 2)
        rows.append(row)
        print(f"{row['threads']}t {row['family']:24s} {row['what']:40s} HF {row['hf']:10.2f} "
              f"linattn {row['linattn']:10.2f} {row['unit']}  {row['speedup']:6.2f}x  "
              f"rel diff {row.get('max_rel_diff', 0):.1e}  load {row['load_1min']}", flush=True)

    torch.manual_seed(0)
    with torch.no_grad():
        cases = op_cases(args.T, args.kda_T)
        for threads in args.threads:
            torch.set_num_threads(threads)
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
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
        if not (args.skip_models or args.decode_only):
            for name, model_type, cfg in small_models():
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
                ids = torch.randint(3, 4096, (1, args.model_T))
                prompt = ids[:, :64]

                def prefill(patch, m=model, model_type=model_type, ids=ids):
                    with patch((model_type,)):
                        return m(ids).logits

                def generate(patch, m=model, model_type=model_type, prompt=prompt):
                    with patch((model_type,)):
                        return m.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                          do_sample=False)

                for threads in args.threads:
                    torch.set_num_threads(threads)
                    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
                    hf_ms, ours_ms = paired_medians_ms([lambda: prefill(lt.use_hf_torch_fallback),
                                                        lambda: prefill(lt.patch)], max(1, args.repeats - 1))
                    err = rel(prefill(lt.patch), prefill(lt.use_hf_torch_fallback))
                    T = args.model_T
                    record({"level": "model", "family": name, "what": f"prefill T={T}", "threads": threads,
                            "unit": "tokens/s", "hf": T / hf_ms * 1e3, "linattn": T / ours_ms * 1e3,
                            "speedup": hf_ms / ours_ms, "max_rel_diff": err})
                    hf_ms, ours_ms = paired_medians_ms([lambda: generate(lt.use_hf_torch_fallback),
                                                        lambda: generate(lt.patch)], max(1, args.repeats - 1))
                    same = bool(torch.equal(generate(lt.patch), generate(lt.use_hf_torch_fallback)))
                    n = args.new_tokens
                    record({"level": "model", "family": name, "what": f"generate {n} tokens after 64",
                            "threads": threads, "unit": "tokens/s", "hf": n / hf_ms * 1e3,
                            "linattn": n / ours_ms * 1e3, "speedup": hf_ms / ours_ms, "same_tokens": same})
                del model

    doc = {"tool": "scripts/hf_families_bench.py", "T": args.T, "kda_T": args.kda_T, "model_T": args.model_T, "B": 1,
           "dtype": "float32", "repeats": args.repeats, "threads": args.threads, "processor": processor(),
           "cpu_count": os.cpu_count(), "torch": torch.__version__, "transformers": transformers.__version__,
           "note": "medians of interleaved runs on a machine shared with other work; load_1min is os.getloadavg()[0]"
                   " after each row", "rows": rows}
    if args.out:
        print("wrote", atomic_write_json(args.out, doc, overwrite=args.overwrite))
        md = Path(args.out).with_suffix(".md")
        atomic_write(md, lambda tmp: tmp.write_text(table(doc), encoding="utf-8"), overwrite=args.overwrite)
        print("wrote", md)
    else:
        print(table(doc))


def table(doc) -> str:
    lines = [f"HF's torch functions against linattn's, {doc['processor']} ({doc['cpu_count']} cores), float32, B = 1, "
             f"medians of {doc['repeats']} interleaved runs; load average (1 min) per row.", "",
             "| level | family | what | threads | HF | linattn | unit | speedup | max rel. diff | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        diff = f"{r['max_rel_diff']:.1e}" if "max_rel_diff" in r else ("same tokens" if r.get("same_tokens")
                                                                       else "tokens differ")
        lines.append(f"| {r['level']} | {r['family']} | {r['what']} | {r['threads']} | {r['hf']:,.2f} | "
                     f"{r['linattn']:,.2f} | {r['unit']} | {r['speedup']:.2f}x | {diff} | {r['load_1min']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
