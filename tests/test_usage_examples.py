"""docs/usage.md's "Use it in a model" code blocks run as written, one after another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

USAGE = Path(__file__).resolve().parents[1] / "docs" / "usage.md"


def blocks() -> list[str]:
    text = USAGE.read_text(encoding="utf-8")
    section = text.split("## Use it in a model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_use_it_in_a_model_runs():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    from linattn.integrations import transformers as lt

    try:  # transformers before 5 binds the rule per layer instance: the patch refuses it (tested with 5.24)
        lt.modeling("qwen3_next")
    except RuntimeError as exc:
        pytest.skip(str(exc))

    saved = {n: getattr(m, n) for n in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                                        "causal_conv1d_fn", "causal_conv1d_update")}
    code = blocks()
    assert len(code) == 3
    namespace: dict = {}
    torch.manual_seed(0)
    try:
        for block in code:
            exec(compile(block, str(USAGE), "exec"), namespace)
    finally:
        if "patched" in namespace:
            namespace["patched"].undo()
        for name, fn in saved.items():
            setattr(m, name, fn)
    assert namespace["state"].S.shape == (3, 4, 32, 32)
    assert namespace["y"].shape == (2, 50, 128) and namespace["y_next"].shape == (2, 1, 128)
    assert namespace["logits"].shape == (1, 16, 100) and namespace["tokens"].shape == (1, 16)
