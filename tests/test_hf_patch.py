"""linattn.integrations.transformers.patch(): one call replaces the functions of every family in every installed
modeling file, narrows with ``models=``, nests and undoes in any order, and refuses (patching nothing) a model
whose functions' signatures differ from those the adapters were written against."""

from __future__ import annotations

import functools

import pytest

transformers = pytest.importorskip("transformers")

from hf_tiny import Modeling  # noqa: E402

from linattn.integrations import transformers as lt  # noqa: E402

MODULES = Modeling(lt.MODELS)  # each modeling file imported when a test first reads it


def snapshot():
    return {(name, fn): getattr(module, fn) for name, module in MODULES.items()
            for fn in lt.FAMILIES[lt.FAMILY_OF[name]][1]}


def test_one_call_replaces_every_function_of_every_family():
    before = snapshot()
    assert len(before) == 4 * 4 + 4 * 2 + 5 * 6 + 2  # 13 model types, 48 functions
    with lt.patch() as p:
        assert p.models == lt.MODELS and p.skipped == ()
        for (name, fn), hf in before.items():
            now = getattr(MODULES[name], fn)
            assert isinstance(now, functools.partial) and now.keywords == {"backend": "auto", "fallback": hf}
            assert now.func is lt.FAMILIES[lt.FAMILY_OF[name]][1][fn][1], (name, fn)
    assert snapshot() == before


def test_models_narrows_and_patches_nest_in_any_order():
    before = snapshot()
    a = lt.patch(("mamba2", "kimi_linear"), backend="torch")
    b = lt.patch(("mamba2",), backend="cpu")
    assert MODULES["mamba2"].mamba2_chunk_scan.keywords["backend"] == "cpu"
    assert MODULES["kimi_linear"].chunk_kimi_delta_attention.keywords["backend"] == "torch"
    assert MODULES["bamba"].mamba2_chunk_scan is before[("bamba", "mamba2_chunk_scan")]
    a.undo()  # the older one first: the newer stays in force
    assert MODULES["mamba2"].mamba2_chunk_scan.keywords["backend"] == "cpu"
    assert MODULES["kimi_linear"].chunk_kimi_delta_attention is before[("kimi_linear", "chunk_kimi_delta_attention")]
    b.undo()
    b.undo()
    assert snapshot() == before
    with lt.patch(("lfm2",)), lt.use_hf_torch_fallback(("lfm2",)):  # HF's own torch code, not the patch below
        assert MODULES["lfm2"].causal_conv1d_fn is lt.hf_torch_fallback(before[("lfm2", "causal_conv1d_fn")])
    assert snapshot() == before


def test_patch_qwen3_next_is_the_gated_delta_alias():
    with lt.patch_qwen3_next() as p:
        assert p.models == ("qwen3_next",)
    with pytest.raises(ValueError, match="'mamba2' is not a Gated DeltaNet model"):
        lt.patch_qwen3_next(("mamba2",))


@pytest.mark.parametrize("bad, error, match", [
    (("llama",), ValueError, "unknown model type 'llama'"),
    (("mamba2", "llama"), ValueError, "unknown model type"),
    ("mamba2", TypeError, "models must be a tuple"),
    ((3,), TypeError, "models must be a tuple"),
])
def test_bad_models_patch_nothing(bad, error, match):
    before = snapshot()
    with pytest.raises(error, match=match):
        lt.patch(bad)
    assert snapshot() == before


def test_a_changed_signature_is_an_error_naming_model_and_version(monkeypatch):
    """A function whose parameters differ (another transformers) stops the whole patch before anything changes."""
    before = snapshot()

    def changed(hidden_states, dt, A, B, C, chunk_size, seq_idx=None, **kwargs):
        return None

    monkeypatch.setattr(MODULES["bamba"], "mamba2_chunk_scan", changed)
    version = transformers.__version__
    with pytest.raises(RuntimeError, match=f"transformers {version}: bamba's mamba2_chunk_scan takes .*seq_idx.*"
                                           "nothing was patched"):
        lt.patch(("mamba2", "bamba"))
    with pytest.raises(RuntimeError, match="bamba"):
        lt.patch()
    monkeypatch.delattr(MODULES["bamba"], "mamba2_chunk_scan")
    with pytest.raises(RuntimeError, match="bamba's mamba2_chunk_scan is missing"):
        lt.patch(("bamba",))
    monkeypatch.undo()
    assert snapshot() == before


def test_a_missing_modeling_file(monkeypatch):
    """Named in ``models``: an error naming the model and the version; by default: skipped and listed."""
    import importlib

    real = importlib.import_module

    def without_zamba2(name, *args):
        if name.endswith("modeling_zamba2"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_zamba2)
    with pytest.raises(RuntimeError, match=f"transformers {transformers.__version__} has no modeling file for "
                                           "'zamba2'"):
        lt.patch(("zamba2",))
    with lt.patch() as p:
        assert p.skipped == ("zamba2",) and "zamba2" not in p.models


def test_backend_is_checked():
    with pytest.raises(ValueError, match="backend"):
        lt.patch(backend="cuda")


def test_the_doc_example_runs():
    """docs/transformers.md's example: a tiny Mamba-2, patched, generates; HF's functions are back after it."""
    import re
    from pathlib import Path

    before = snapshot()
    text = (Path(__file__).resolve().parents[1] / "docs" / "transformers.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace: dict = {}
    exec(compile(block, "docs/transformers.md", "exec"), namespace)
    assert namespace["tokens"].shape == (1, 16)
    assert snapshot() == before
