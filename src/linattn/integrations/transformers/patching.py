"""The patch stack: which HF functions each model family calls, the check of their signatures, and
[`Patch`][linattn.integrations.transformers.Patch], which replaces them and undoes its replacements in any order.

Each family's layers look these module-level functions up at call time (transformers 5 does), so replacing the
module attribute reaches every instance, existing and future. Before anything is replaced, every requested model's
modeling file is imported and every function's parameters are compared with those the adapters were written
against (transformers 5.24): a difference is an error naming the model, the function and the transformers version,
and nothing is patched.
"""

from __future__ import annotations

import functools
import importlib
import inspect

from linattn import checks
from linattn.integrations.transformers import conv, gated_delta, kda, mamba2

_CONV = {"causal_conv1d_fn": (("hidden_states", "weight", "bias", "activation", "kwargs"), conv.causal_conv1d_fn),
         "causal_conv1d_update": (("hidden_states", "conv_state", "weight", "bias", "activation"),
                                  conv.causal_conv1d_update)}
_DELTA_CHUNK = ("query", "key", "value", "g", "beta", "chunk_size", "initial_state", "output_final_state",
                "use_qk_l2norm_in_kernel", "kwargs")
_DELTA_STEP = ("query", "key", "value", "g", "beta", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel",
               "kwargs")

# family -> (model types, {HF function name: (its parameters in transformers 5.24, linattn's replacement)})
FAMILIES = {
    "gated_delta": (("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid"), {
        "torch_chunk_gated_delta_rule": (_DELTA_CHUNK, gated_delta.chunk_gated_delta_rule),
        "torch_recurrent_gated_delta_rule": (_DELTA_STEP, gated_delta.recurrent_gated_delta_rule),
        **_CONV}),
    "kda": (("kimi_linear", "bailing_hybrid"), {
        "chunk_kimi_delta_attention": (_DELTA_CHUNK, kda.chunk_kimi_delta_attention),
        "recurrent_kimi_delta_attention": (_DELTA_STEP, kda.recurrent_kimi_delta_attention),
        **_CONV}),
    "mamba2": (("mamba2", "bamba", "granitemoehybrid", "falcon_h1", "nemotron_h", "zamba2"), {
        "mamba2_chunk_scan": (("hidden_states", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias", "initial_states",
                               "dt_softplus", "dt_limit", "return_final_states", "kwargs"), mamba2.mamba2_chunk_scan),
        "mamba2_selective_state_update": (("state", "hidden_states", "dt", "A", "B", "C", "D", "dt_bias",
                                           "dt_softplus", "z", "kwargs"), mamba2.mamba2_selective_state_update),
        "mamba2_split_conv1d_scan_combined": (
            ("zxbcdt", "conv1d_weight", "conv1d_bias", "dt_bias", "A", "D", "chunk_size", "initial_states",
             "dt_limit", "return_final_states", "activation", "rmsnorm_weight", "rmsnorm_eps", "outproj_weight",
             "outproj_bias", "headdim", "ngroups", "norm_before_gate", "kwargs"),
            mamba2.mamba2_split_conv1d_scan_combined),
        **_CONV}),
    "conv": (("lfm2",), dict(_CONV)),
}
FAMILY_OF = {model: family for family, (models, _) in FAMILIES.items() for model in models}
MODELS = tuple(FAMILY_OF)
GATED_DELTA_MODELS = FAMILIES["gated_delta"][0]

# The patches in force, per (module, function name): HF's original and a stack of (patch, replacement), latest last.
_ACTIVE: dict[tuple[object, str], tuple[object, list]] = {}


class Patch:
    """Functions that `patch` (or `use_hf_torch_fallback`) replaced. ``undo()`` (or leaving the
    ``with`` block) withdraws this patch's replacements: a function returns to the latest patch still in force, or
    to HF's original when none is, whatever order patches are undone in. A second ``undo()`` does nothing.
    ``models`` lists the model types patched; ``skipped`` those of the table whose modeling file this
    transformers lacks (only when no ``models=`` was given)."""

    def __init__(self, replacements: list[tuple[object, str, object]], models: tuple[str, ...] = (),
                 skipped: tuple[str, ...] = ()):
        self.replacements = replacements  # (module, name, replacement)
        self.models, self.skipped = models, skipped
        self.active = True
        for module, name, value in replacements:
            _, stack = _ACTIVE.setdefault((module, name), (getattr(module, name), []))
            stack.append((self, value))
            setattr(module, name, value)

    def undo(self) -> None:
        if not self.active:
            return
        self.active = False
        for module, name, _ in self.replacements:
            key = (module, name)
            if key not in _ACTIVE:  # a repeated entry of this patch already restored it
                continue
            base, stack = _ACTIVE[key]
            stack[:] = [entry for entry in stack if entry[0] is not self]
            setattr(module, name, stack[-1][1] if stack else base)
            if not stack:
                del _ACTIVE[key]

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def original(module, name: str):
    """``module.name`` as transformers left it, beneath any patch in force."""
    entry = _ACTIVE.get((module, name))
    return getattr(module, name) if entry is None else entry[0]


def hf_torch_fallback(fn):
    """HF's own torch implementation behind a function transformers may have pointed at another package."""
    return inspect.unwrap(fn)


def _version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"


def modeling(name: str, missing_ok: bool = False):
    """The model's modeling module, checked: every function of its family exists with the parameters the adapters
    were written against, and some class of the module calls the family's first function by its module-level
    name at call time. None when the file is missing and ``missing_ok``."""
    try:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ModuleNotFoundError as exc:
        if missing_ok:
            return None
        raise RuntimeError(f"{_version()} has no modeling file for {name!r} ({exc}); linattn's adapters were "
                           "written against transformers 5.24") from None
    functions = FAMILIES[FAMILY_OF[name]][1]
    for fn, (params, _) in functions.items():
        hf = original(module, fn) if hasattr(module, fn) else None
        got = None if hf is None else tuple(inspect.signature(inspect.unwrap(hf)).parameters)
        if got != params:
            raise RuntimeError(
                f"{_version()}: {name}'s {fn} {'is missing' if got is None else f'takes {got}'}; linattn's adapter "
                f"expects {params} (written against transformers 5.24); nothing was patched")
    first = next(iter(functions))
    callers = [obj for obj in vars(module).values() if isinstance(obj, type) and hasattr(obj, "forward")
               and first in getattr(inspect.unwrap(obj.forward), "__code__", None).co_names]
    if not callers:
        raise RuntimeError(f"{_version()}: no layer of {name} calls the module-level {first}, so it cannot be routed "
                           "to linattn (written against transformers 5.24); nothing was patched")
    return module


def _models(models) -> tuple[str, ...]:
    if not isinstance(models, (tuple, list)) or not all(isinstance(name, str) for name in models):
        raise TypeError(f"models must be a tuple of model types, some of {', '.join(MODELS)}; got {models!r}")
    for name in models:  # every name checked before anything is patched
        if name not in FAMILY_OF:
            raise ValueError(f"models: unknown model type {name!r}; expected some of {', '.join(MODELS)}")
    return tuple(models)


def patch(models: tuple[str, ...] | None = None, *, backend: str = "auto") -> Patch:
    """Route the recurrent layers of these transformers model types (default: every type in ``MODELS`` whose
    modeling file is installed) to linattn: the Gated DeltaNet and Kimi Delta rules, Mamba-2's scan and decode
    step and every family's short convolution. Affects every instance, existing and future; returns a
    `Patch` (``undo()``, or a context manager; patches nest and may be undone in any order).

    ``backend`` goes to every linattn call (``"auto"``, ``"torch"``, ``"cpu"``, ``"triton"``; see
    `linattn.linear_attention`); with ``"auto"`` (default) calls on CPU tensors run on linattn and calls on
    other devices run what HF chose (its kernels or its torch code). Raises before patching anything when a model
    type is unknown, its file missing (when named in ``models``) or a function's signature differs."""
    checks.check_backend(backend)
    skipped = ()
    if models is None:
        found = {name: modeling(name, missing_ok=True) for name in MODELS}
        skipped = tuple(name for name, module in found.items() if module is None)
        modules = {name: module for name, module in found.items() if module is not None}
    else:
        modules = {name: modeling(name) for name in _models(models)}
    replacements = []
    for name, module in modules.items():
        for fn, (_, ours) in FAMILIES[FAMILY_OF[name]][1].items():
            replacements.append((module, fn, functools.partial(ours, backend=backend, fallback=original(module, fn))))
    return Patch(replacements, tuple(modules), skipped)


def patch_qwen3_next(models: tuple[str, ...] = ("qwen3_next",), *, backend: str = "auto") -> Patch:
    """`patch` for Gated DeltaNet models (``GATED_DELTA_MODELS``; default Qwen3-Next alone)."""
    checks.check_backend(backend)
    for name in _models(models):
        if name not in GATED_DELTA_MODELS:
            raise ValueError(f"models: {name!r} is not a Gated DeltaNet model; expected some of "
                             f"{', '.join(GATED_DELTA_MODELS)} (patch() takes every family)")
    return patch(models, backend=backend)


def use_hf_torch_fallback(models: tuple[str, ...] = ("qwen3_next",)) -> Patch:
    """Route the same functions to transformers' own torch code (the slow reference; what HF runs without fla,
    mamba-ssm or causal-conv1d), e.g. to compare against. Returns a `Patch`."""
    modules = {name: modeling(name) for name in _models(models)}
    return Patch([(module, fn, hf_torch_fallback(original(module, fn)))
                  for name, module in modules.items() for fn in FAMILIES[FAMILY_OF[name]][1]], tuple(modules))
