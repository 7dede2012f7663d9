"""HF transformers' Qwen3-Next on a CPU: its own torch fallback against linattn (``patch_qwen3_next``), side by side.

Three levels at the real model's linear-attention geometry (16 q/k heads, 32 value heads, head dim 128,
hidden 2048), B = 1, float32, one process, medians of repeated runs:

* op: the gated delta rule alone, prefill of T tokens (chunk) and one decode step (recurrent) after it;
* layer: one ``Qwen3NextGatedDeltaNet`` forward over T tokens, and linattn's own ``GatedDeltaNet`` loaded from it;
* model: a randomly initialized Qwen3-Next with the real attention geometry but few layers and small experts
  (``--layers``, 3 linear : 1 full attention), prefill of T tokens.

The two sides run interleaved, so a shared machine's changing load falls on both alike; ratios are the result.

    python scripts/qwen3_next_bench.py --T 4096 --out benchmarks/results/qwen3_next_cpu.json
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as hf

from linattn.integrations import transformers as lt
from linattn.tools.harness.results import atomic_write_json


def paired_medians_ms(fns, repeats: int) -> list[float]:
    """Median ms of each function, the runs interleaved (a, b, a, b, ...) so that a shared machine's changing load
    falls on both alike; one warm-up run each first."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples, strict=True):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(s) * 1e3 for s in samples]


def config(layers: int) -> Qwen3NextConfig:
    return Qwen3NextConfig(
        vocab_size=4096, hidden_size=2048, intermediate_size=1024, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    T, H, HV, D = args.T, 16, 32, 128
    rows = []

    def row(level, what, hf_fn, ours_fn, check):
        hf_ms, ours_ms = paired_medians_ms([hf_fn, ours_fn], args.repeats)
        a, b = check()
        err = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        rows.append({"level": level, "what": what, "hf_fallback_ms": hf_ms, "linattn_ms": ours_ms,
                     "speedup": hf_ms / ours_ms, "max_rel_diff": err})
        print(f"{level:6s} {what:42s} HF {hf_ms:10.1f} ms   linattn {ours_ms:9.1f} ms   "
              f"{hf_ms / ours_ms:5.2f}x   rel diff {err:.1e}", flush=True)

    # ---- op
    q, k = torch.randn(1, T, H, D), torch.randn(1, T, H, D)
    v = torch.randn(1, T, HV, D)
    g = -F.softplus(torch.randn(1, T, HV)) * 0.1
    beta = torch.rand(1, T, HV)
    hf_chunk = lt.hf_torch_fallback(hf.torch_chunk_gated_delta_rule)
    hf_rec = lt.hf_torch_fallback(hf.torch_recurrent_gated_delta_rule)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        row("op", f"chunk prefill T={T}", lambda: hf_chunk(q, k, v, g, beta, **kw),
            lambda: lt.chunk_gated_delta_rule(q, k, v, g, beta, **kw),
            lambda: (lt.chunk_gated_delta_rule(q, k, v, g, beta, **kw)[0], hf_chunk(q, k, v, g, beta, **kw)[0]))
        S = lt.chunk_gated_delta_rule(q, k, v, g, beta, **kw)[1]
        one = [x[:, :1] for x in (q, k, v, g, beta)]
        row("op", "recurrent decode, 1 token", lambda: hf_rec(*one, initial_state=S, **kw),
            lambda: lt.recurrent_gated_delta_rule(*one, initial_state=S, **kw),
            lambda: (lt.recurrent_gated_delta_rule(*one, initial_state=S, **kw)[0],
                     hf_rec(*one, initial_state=S, **kw)[0]))

        # ---- layer and model
        model = Qwen3NextForCausalLM(config(args.layers)).eval()
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.dt_bias.normal_(0, 1)
        hf_layer = model.model.layers[0].linear_attn
        ours = lt.gated_deltanet_from_qwen3_next(hf_layer)
        x = torch.randn(1, T, 2048) * 0.1

        def under(patch, fn):
            def run():
                with patch():
                    return fn()
            return run

        row("layer", f"Qwen3NextGatedDeltaNet T={T}", under(lt.use_hf_torch_fallback, lambda: hf_layer(x)),
            under(lt.patch_qwen3_next, lambda: hf_layer(x)),
            lambda: (under(lt.patch_qwen3_next, lambda: hf_layer(x))(),
                     under(lt.use_hf_torch_fallback, lambda: hf_layer(x))()))
        row("layer", f"linattn GatedDeltaNet (HF weights) T={T}",
            under(lt.use_hf_torch_fallback, lambda: hf_layer(x)), lambda: ours(x)[0],
            lambda: (ours(x)[0], under(lt.use_hf_torch_fallback, lambda: hf_layer(x))()))
        ids = torch.randint(0, 4096, (1, T))
        row("model", f"Qwen3-Next {args.layers} layers prefill T={T}",
            under(lt.use_hf_torch_fallback, lambda: model(ids).logits),
            under(lt.patch_qwen3_next, lambda: model(ids).logits),
            lambda: (under(lt.patch_qwen3_next, lambda: model(ids).logits)(),
                     under(lt.use_hf_torch_fallback, lambda: model(ids).logits)()))

    doc = {"tool": "scripts/qwen3_next_bench.py", "T": T, "B": 1, "dtype": "float32", "qk_heads": H, "v_heads": HV,
           "head_dim": D, "hidden_size": 2048, "model_layers": args.layers, "threads": args.threads,
           "repeats": args.repeats, "processor": platform.processor() or platform.machine(),
           "torch": torch.__version__, "rows": rows}
    if args.out:
        print("wrote", atomic_write_json(args.out, doc, overwrite=args.overwrite))


if __name__ == "__main__":
    main()
