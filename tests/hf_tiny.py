"""Tiny randomly initialized HF models of every recurrent family linattn's transformers integration patches (no
download): 2-4 layers, mixed linear/attention where the family mixes them, widths that run in milliseconds."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

V = 64  # vocabulary
ATTN = dict(num_attention_heads=2, num_key_value_heads=1)
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs(transformers):
    t = transformers
    gdn = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6,
               linear_conv_kernel_dim=4)
    ssm = dict(mamba_n_heads=4, mamba_d_head=6, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=1,
               mamba_chunk_size=8)
    return {
        "qwen3_next": lambda: t.Qwen3NextConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, head_dim=8, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=12, shared_expert_intermediate_size=12,
            layer_types=["linear_attention", "full_attention"], **ATTN, **gdn),
        "qwen3_5": lambda: t.Qwen3_5TextConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, head_dim=8,
            layer_types=["linear_attention", "full_attention"], **ATTN, **gdn),
        "qwen3_5_moe": lambda: t.Qwen3_5MoeTextConfig(**IDS,
            vocab_size=V, hidden_size=24, num_hidden_layers=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=12, shared_expert_intermediate_size=12,
            layer_types=["linear_attention", "full_attention"], **ATTN, **gdn),
        "olmo_hybrid": lambda: t.OlmoHybridConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2,
            layer_types=["linear_attention", "full_attention"], **ATTN, **gdn),
        "kimi_linear": lambda: t.KimiLinearConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, moe_intermediate_size=12, num_hidden_layers=2,
            num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=8, q_lora_rank=None,
            qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, linear_head_dim=8, linear_num_heads=2,
            linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse"], **ATTN),
        "bailing_hybrid": lambda: t.BailingHybridConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, moe_intermediate_size=12, num_hidden_layers=2,
            num_local_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=8, q_lora_rank=None,
            qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, head_dim=8, short_conv_kernel_size=4,
            layer_types=["linear_attention", "full_attention"], first_k_dense_replace=1, num_mtp_layers=0, **ATTN),
        "mamba2": lambda: t.Mamba2Config(**IDS,
            vocab_size=V, hidden_size=24, num_hidden_layers=2, num_heads=4, head_dim=6, expand=1, n_groups=2,
            state_size=8, conv_kernel=4, chunk_size=8),
        "bamba": lambda: t.BambaConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, attn_layer_indices=[1],
            **ATTN, **ssm),
        "granitemoehybrid": lambda: t.GraniteMoeHybridConfig(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, num_local_experts=4,
            num_experts_per_tok=2, shared_intermediate_size=24, layer_types=["mamba", "attention"], **ATTN, **ssm),
        "falcon_h1": lambda: t.FalconH1Config(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, mamba_d_ssm=24, **ATTN, **ssm),
        "nemotron_h": lambda: t.NemotronHConfig(**IDS,
            vocab_size=V, hidden_size=24, layers_block_type=["mamba", "attention", "mlp"], head_dim=8,
            intermediate_size=24, ssm_state_size=8, mamba_num_heads=4, mamba_head_dim=6, n_groups=2, conv_kernel=4,
            expand=1, chunk_size=8, **ATTN),
        "zamba2": lambda: t.Zamba2Config(**IDS,
            vocab_size=V, hidden_size=24, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
            mamba_d_state=8, mamba_d_conv=4, mamba_expand=1, mamba_ngroups=2, n_mamba_heads=4, chunk_size=8,
            intermediate_size=24, num_attention_heads=2, num_key_value_heads=2, num_mem_blocks=1, adapter_rank=4),
        "lfm2": lambda: t.Lfm2Config(**IDS,
            vocab_size=V, hidden_size=24, intermediate_size=24, num_hidden_layers=2, conv_bias=True, conv_L_cache=3,
            layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False, **ATTN),
    }


def make_model(transformers, model_type: str, dtype=torch.float64, seed: int = 0):
    """The tiny model in eval mode, its recurrent parameters varied per head (HF initializes some to one value)."""
    modeling(model_type)  # skips where this transformers' file is not the one the patch knows
    cfg = _configs(transformers)[model_type]()
    if hasattr(cfg, "residual_in_fp32"):
        cfg.residual_in_fp32 = False
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="eager").to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("dt_bias", "D") or (leaf == "bias" and "conv" in name):
                p.normal_(0, 1)
            elif leaf == "A_log":
                p.uniform_(-1, 1)
    return model


def modeling(name: str):
    """transformers' modeling module of ``name``, imported when a test first needs it (importing every family's at
    collection took most of the suite's start-up); another transformers whose file differs skips the test."""
    from linattn.integrations import transformers as lt

    try:
        return lt.modeling(name)
    except RuntimeError as exc:  # another transformers: test_hf_patch checks the error itself
        pytest.skip(str(exc))


class Modeling(Mapping):
    """Every model type of the patch -> its modeling module, each imported on first access."""

    def __init__(self, names):
        self.names, self.loaded = tuple(names), {}

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        if name not in self.loaded:  # kept: a test may then change the module's functions
            self.loaded[name] = modeling(name)
        return self.loaded[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)
