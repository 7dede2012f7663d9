"""A generated catalogue of bad inputs: every bad value for every argument of ``linear_attention`` and ``step``, and
of ``linear_attention`` with packed sequences (``cu_seqlens``; the cases named ``packed-...``).

The cases are built by program: each argument crossed with generic bad values (None, bools, numbers, NaN, inf,
strings, containers, objects, tensors where a number belongs), every tensor argument with rank, size, dtype,
device, layout and value mutations, every state argument with state mutations, the feature map with callables
that return the wrong thing. Each case must end in one of two ways:

- a ``ValueError`` or ``TypeError`` raised inside linattn's own files (the traceback's last frame; not torch's),
  whose message names the argument; or
- a documented, correct result, when the contract says the value is valid (``ACCEPTED`` says why): the output
  (and the final state) equals the float64 reference on the same inputs. NaN and inf in q, k, v or beta are
  documented to propagate, not to raise: then the outputs of the earlier chunks still equal the reference and the
  output is non-finite.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import reference_call, rel_err

import linattn
from linattn import State

B, T, H, D, DV = 2, 5, 3, 4, 6
CHUNK = 2  # chunks [0, 1], [2, 3], [4]: a bad last token leaves the earlier chunks exact
# Packed: 3 sequences of 3, 0 and 3 tokens in one row; the last token is alone in its chunk there too.
PACKED_LENGTHS = (3, 0, 3)
PACKED_T = sum(PACKED_LENGTHS)
CU = torch.tensor([0, 3, 3, 6])
FUNCTIONS = {"linear_attention": linattn.linear_attention, "step": linattn.step, "packed": linattn.linear_attention}
LINATTN_DIR = Path(linattn.__file__).resolve().parent
TOL = 1e-4  # float32 inputs against the float64 reference

GENERIC = [
    ("None", None), ("True", True), ("False", False), ("int 3", 3), ("int 0", 0), ("int -1", -1),
    ("float 0.5", 0.5), ("nan", math.nan), ("inf", math.inf), ("huge int", 10**400), ("str", "bogus"),
    ("list", []), ("dict", {}), ("object", object()), ("0-d tensor", torch.tensor(0.5)), ("numpy int", np.int64(3)),
]

# (function, argument, case label) -> why the value is valid. "*" stands for both functions.
ACCEPTED = {
    ("*", "normalize", "None"): "the rule's own definition (True for gated)",
    ("*", "normalize", "True"): "gated defines the normalizer",
    ("*", "scale", "None"): "default r ** -0.5",
    **{("*", "scale", lab): "any finite real scale" for lab in ("int 3", "int 0", "int -1", "float 0.5")},
    **{("*", "eps", lab): "any finite eps >= 0" for lab in ("int 3", "int 0", "float 0.5")},
    ("*", "state_dtype", "None"): "default accumulation dtype",
    ("*", "g", "-inf"): "a full reset (the state before it is forgotten)",
    **{("*", a, lab): "any strides, any autograd flag" for a in ("q", "k", "v", "g", "beta")
       for lab in ("non-contiguous", "requires grad")},
    **{("*", a, lab): "cast to the accumulation dtype" for a in ("g", "beta") for lab in ("float64", "float16")},
    **{("*", a, lab): "documented: NaN/inf propagate" for a in ("q", "k", "v", "beta") for lab in ("NaN", "+inf")},
    ("packed", "cu_seqlens", "int32"): "any integer dtype",
    ("packed", "cu_seqlens", "strided view"): "any strides",
    ("linear_attention", "initial_state", "None"): "starts from zeros",
    ("linear_attention", "initial_state", "hand-built"): "a State(S, z) without record is trusted",
    ("linear_attention", "initial_state", "float64"): "converted to the accumulation dtype",
    ("linear_attention", "output_final_state", "True"): "a bool",
    ("linear_attention", "output_final_state", "False"): "a bool",
    ("linear_attention", "chunk_size", "int 3"): "any positive int",
    ("linear_attention", "chunk_size", "above T"): "one chunk of T tokens",
    ("linear_attention", "chunk_size", "2**63 - 1"): "any int up to 2**63 - 1; above T means one chunk",
    ("step", "state", "None"): "starts from zeros",
    ("step", "state", "hand-built"): "a State(S, z) without record is trusted",
    ("step", "state", "float64"): "the state's dtype is the accumulation dtype",
    ("step", "state", "separate S and z, inplace"): "the caller's S and z are updated (written back)",
    ("step", "inplace", "True"): "a bool",
    ("step", "inplace", "False"): "a bool",
}


def _inputs(rule: str, lead: tuple[int, ...]) -> dict:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(*lead, D, generator=gen)
    k = torch.randn(*lead, D, generator=gen)
    v = torch.randn(*lead, DV, generator=gen)
    kw = dict(q=q, k=k, v=v, rule=rule, feature_map="elu1")
    if rule in ("gated", "gated_delta"):
        kw["g"] = F.logsigmoid(torch.randn(*lead, generator=gen) + 2)
    if rule in ("delta", "gated_delta"):
        kw.update(k=F.normalize(k, dim=-1), feature_map=None, beta=torch.rand(*lead, generator=gen))
    return kw


def _made_state(rule: str, batch: int = B) -> State:
    """A state made by linattn for ``rule`` (so it carries the record), from a short prefill."""
    kw = _inputs(rule, (batch, 3, H))
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    return linattn.linear_attention(q, k, v, output_final_state=True, **kw)[1]


@functools.cache
def _base(fn: str, rule: str) -> dict:
    if fn == "linear_attention":
        kw = _inputs(rule, (B, T, H))
        kw.update(form="chunk", chunk_size=CHUNK, output_final_state=True, initial_state=_made_state(rule))
    elif fn == "packed":
        kw = _inputs(rule, (1, PACKED_T, H))
        kw.update(form="chunk", chunk_size=CHUNK, output_final_state=True, cu_seqlens=CU.clone(),
                  initial_state=_made_state(rule, len(PACKED_LENGTHS)))
    else:
        kw = _inputs(rule, (B, H))
        kw.update(state=_made_state(rule), inplace=False)
    return kw


def base(fn: str, rule: str) -> dict:
    """Valid keyword arguments of ``fn`` for ``rule`` (a fresh copy: step may update its state in place); every
    case changes one of them."""
    kw = dict(_base(fn, rule))
    for name in ("state", "initial_state"):
        if name in kw:
            kw[name] = kw[name].clone()
    return kw


def _tensor_mutations(x: torch.Tensor, arg: str) -> list[tuple[str, object]]:
    negative = arg == "g"  # gate values must stay <= 0

    def fresh(shape, dtype=torch.float32):
        y = torch.rand(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        return -y if negative else y

    out = [("rank - 1", x[..., 0]), ("rank + 1", x[..., None]), ("numpy", x.numpy())]
    for i in range(x.dim()):
        shape = list(x.shape)
        shape[i] += 1
        out.append((f"dim {i} + 1", fresh(shape)))
        shape[i] = 0
        out.append((f"dim {i} empty", fresh(shape)))
    for dtype in (torch.int64, torch.bool, torch.complex64, torch.float64, torch.float16):
        out.append((str(dtype).removeprefix("torch."), x.to(dtype)))
    out.append(("meta", x.to("meta")))
    out.append(("non-contiguous", x.transpose(0, 1).contiguous().transpose(0, 1)))
    out.append(("requires grad", x.clone().requires_grad_()))
    last = (slice(None), -1) if x.dim() >= 3 and arg != "state" else (0,)
    for label, value in (("NaN", math.nan), ("+inf", math.inf)) + ((("-inf", -math.inf),) if arg == "g" else ()):
        y = x.clone()
        y[last] = value
        out.append((label, y))
    return out


def _state_mutations(state: State, fn: str) -> list[tuple[str, object, dict]]:
    S, z = state.S, state.z
    rec = dict(rule=state.rule, feature_map=state.feature_map, normalized=state.normalized)
    out = [("tensor, not a State", S, {}), ("hand-built", State(S.clone(), z.clone()), {}),
           ("no z", State(S.clone()), {}), ("other rule", State(S, z, **{**rec, "rule": "accumulate"}), {}),
           ("other feature map", State(S, z, **{**rec, "feature_map": "relu1"}), {}),
           ("float64", state.to(torch.float64), {}), ("meta", state.to("meta"), {})]
    for i in range(4):
        shape = list(S.shape)
        shape[i] += 1
        out.append((f"S dim {i} + 1", State(torch.zeros(shape), torch.ones(shape[:3])), {}))
    int_S = state.clone()
    int_S.S = torch.zeros(S.shape, dtype=torch.int32)  # replaced after it was made: State could not check it
    out.append(("S replaced by int", int_S, {}))
    if fn == "step":
        out.append(("expanded, inplace", State(S[:1].expand(S.shape), z[:1].expand(z.shape)), {"inplace": True}))
        out.append(("requires grad, inplace", State(S.clone().requires_grad_(), z.clone()), {"inplace": True}))
        with torch.inference_mode():
            inference = state.clone()
        out.append(("inference tensors, inplace", inference, {"inplace": True}))
        out.append(("separate S and z, inplace", State(S.clone(), z.clone(), **rec), {"inplace": True}))
    return out


def _cu_mutations() -> list[tuple[str, object]]:
    """Bad (and two good) ``cu_seqlens`` for the packed base: 6 tokens in one row."""
    return [
        ("rank + 1", CU[None]), ("numpy", CU.numpy()), ("list", [0, 3, 3, 6]), ("one entry", CU[:1]),
        ("float", CU.float()), ("bool", CU.bool()), ("complex", CU.to(torch.complex64)), ("meta", CU.to("meta")),
        ("ends before T", torch.tensor([0, 3, 3, 5])), ("ends after T", torch.tensor([0, 3, 3, 7])),
        ("starts at 1", torch.tensor([1, 3, 3, 6])), ("decreasing", torch.tensor([0, 4, 3, 6])),
        ("other N", torch.tensor([0, 6])), ("int32", CU.int()), ("strided view", torch.tensor([9, 0, 3, 3, 6])[1:]),
    ]


def _callable_maps() -> list[tuple[str, object]]:
    return [
        ("returns an int", lambda x: 3),
        ("returns a list", lambda x: [x]),
        ("returns rank - 1", lambda x: x.sum(-1)),
        ("returns width 0", lambda x: x[..., :0]),
        ("returns float64", lambda x: x.double()),
        ("a valid map of another name", lambda x: F.elu(x) + 1),
    ]


def build_cases() -> list[tuple[str, str, str, str, object, dict]]:
    """(id, function, rule, argument, label, value, extra kwargs) for every case: every parameter in the
    functions' signatures, so an argument added later gets the generic bad values too."""
    cases = []
    for fn, func in FUNCTIONS.items():
        for arg in inspect.signature(func).parameters:
            rule = "gated_delta" if arg == "beta" else "gated"
            good = base(fn, rule)
            # (Without cu_seqlens the packed call is an unpacked one: the linear_attention cases cover it.)
            values = [(label, value, {}) for label, value in GENERIC if not (fn, arg, label) == ("packed",
                                                                                                 "cu_seqlens", "None")]
            if arg == "cu_seqlens" and fn == "packed":
                values += [(label, value, {}) for label, value in _cu_mutations()]
            elif isinstance(good.get(arg), torch.Tensor):
                values += [(label, value, {}) for label, value in _tensor_mutations(good[arg], arg)]
            if arg in ("initial_state", "state"):
                values += _state_mutations(good[arg], fn)
            if arg == "feature_map":
                values += [(label, value, {}) for label, value in _callable_maps()]
            if arg == "chunk_size":
                values += [("above T", 1000, {}), ("2**63 - 1", sys.maxsize, {})]
            for label, value, extra in values:
                cases.append((f"{fn}-{arg}-{label}", fn, rule, arg, label, value, extra))
    return cases


CASES = build_cases()


def _names(message: str, arg: str) -> bool:
    return re.search(rf"(?<![A-Za-z_]){re.escape(arg)}(?![A-Za-z_])", message) is not None


def _is_accepted(fn: str, arg: str, label: str, value: object = ...) -> bool:
    """Listed in ACCEPTED, or the parameter's own default where the base call leaves it at its default. A packed call
    takes what linear_attention takes."""
    names = (fn, "*") + (("linear_attention",) if fn == "packed" else ())
    if any((name, arg, label) in ACCEPTED for name in names):
        return True
    if arg in _base(fn, "gated_delta" if arg == "beta" else "gated"):
        return False
    default = inspect.signature(FUNCTIONS[fn]).parameters[arg].default
    return default is not inspect.Parameter.empty and value is default


def _call(fn: str, kw: dict):
    kw = dict(kw)
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    if fn in ("linear_attention", "packed"):
        return linattn.linear_attention(q, k, v, **kw)
    return linattn.step(q, k, v, kw.pop("state"), **kw)


def _expected(fn: str, kw: dict):
    """The float64 reference on the same inputs: (o, S, z); for step, one token continuing the state."""
    kw = {name: value for name, value in kw.items() if name not in ("form", "chunk_size", "output_final_state",
                                                                     "state_dtype", "inplace")}
    q, k, v = kw.pop("q"), kw.pop("k"), kw.pop("v")
    if fn == "step":
        q, k, v = q[:, None], k[:, None], v[:, None]
        kw = {name: (x[:, None] if name in ("g", "beta") and x is not None else x) for name, x in kw.items()}
        kw["initial_state"] = kw.pop("state")
    kw = {name: (x.detach() if isinstance(x, torch.Tensor) else x) for name, x in kw.items()}
    o, S, z = reference_call(q.detach(), k.detach(), v.detach(), **kw)
    return (o[:, 0] if fn == "step" else o), S, z


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_catalogue(case):
    _, fn, rule, arg, label, value, extra = case
    kw = base(fn, rule)
    kw[arg] = value
    kw.update(extra)
    if not _is_accepted(fn, arg, label, value):
        with pytest.raises((ValueError, TypeError)) as info:
            _call(fn, kw)
        last = Path(info.traceback[-1].path).resolve()
        assert LINATTN_DIR in last.parents, f"raised in {last}, not in linattn: {info.value}"
        assert _names(str(info.value), arg), f"message does not name {arg!r}: {info.value}"
        return
    o_ref, S_ref, z_ref = _expected(fn, kw)  # first: step(inplace=True) updates the state it is given
    o, state = _call(fn, kw)
    if label in ("NaN", "+inf"):  # documented to propagate: earlier chunks exact, the output non-finite
        assert not bool(torch.isfinite(o).all())
        if fn != "step":
            n = o.shape[1] - 1
            assert rel_err(o[:, :n], o_ref[:, :n]) <= TOL
        return
    assert rel_err(o, o_ref) <= TOL
    if state is not None:
        assert rel_err(state.S, S_ref) <= TOL
        assert (state.z is None and z_ref is None) or rel_err(state.z, z_ref) <= TOL
    if label == "separate S and z, inplace":  # the caller's own tensors were updated, not left stale
        assert state.S.data_ptr() == value.S.data_ptr() and state.z.data_ptr() == value.z.data_ptr()
        assert rel_err(value.S, S_ref) <= TOL and rel_err(value.z, z_ref) <= TOL


def test_catalogue_is_large():
    """The catalogue is generated, so check what it holds: every argument of both functions, hundreds of cases."""
    for fn, func in FUNCTIONS.items():
        assert {c[3] for c in CASES if c[1] == fn} == set(inspect.signature(func).parameters)
    assert len(CASES) > 1000
    assert sum(not _is_accepted(c[1], c[3], c[4], c[5]) for c in CASES) > 350
