"""Second derivatives (Hessian-vector products, gradient penalties) through the compiled CPU prefill equal those
of the torch forms, and those equal torch.autograd.gradgradcheck's numerical ones in float64. The compiled
backward is first-order: a graph of the gradient (create_graph=True) must take an exact path, not a silent one."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradgradcheck

import linattn
from linattn.backends import cpu as cpu_backend
from linattn.nn import LinearAttention

RULES = ("accumulate", "gated", "delta", "gated_delta")


def inputs(rule, *, B=1, T=37, H=2, D=5, Dv=3, dtype=torch.float32, per_channel=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {n: torch.randn(B, T, H, d, generator=gen, dtype=dtype) for n, d in (("q", D), ("k", D), ("v", Dv))}
    if rule in ("gated", "gated_delta"):
        x["g"] = F.logsigmoid(torch.randn(B, T, H, *((D,) if per_channel else ()), generator=gen, dtype=dtype) + 2)
    if rule in ("delta", "gated_delta"):
        x["beta"] = torch.rand(B, T, H, generator=gen, dtype=dtype)
    return {n: t.requires_grad_() for n, t in x.items()}


def hvp(rule, x, backend, feature_map, normalize, cu_seqlens=None, **extra):
    """d/dx <grad_x L, u> for L = sum(o * w): the row of the Hessian-vector product of every input that requires
    grad (``extra``: more arguments of linear_attention, e.g. form and chunk_size)."""
    o, _ = linattn.linear_attention(x["q"], x["k"], x["v"], rule=rule, feature_map=feature_map, normalize=normalize,
                                    g=x.get("g"), beta=x.get("beta"), backend=backend, cu_seqlens=cu_seqlens, **extra)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)  # the same w in any dtype
    names = [n for n in x if x[n].requires_grad]
    grads = torch.autograd.grad((o * w).sum() + (o * o).sum(), [x[n] for n in names], create_graph=True)
    u = [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in grads]
    inner = sum((gr * ui).sum() for gr, ui in zip(grads, u, strict=True))
    second = torch.autograd.grad(inner, [x[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(x[n]) if s is None else s) for n, s in zip(names, second, strict=True)}


def rel(a, e):
    return float((a.double() - e.double()).abs().max() / max(1e-6, float(e.double().abs().max())))


CASES = [(rule, fm, per_channel) for rule in RULES for fm in ("l2", None)
         for per_channel in ((False, True) if rule in ("gated", "gated_delta") else (False,))]


@pytest.mark.parametrize(("rule", "feature_map", "per_channel"), CASES)
@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_hessian_vector_product_equals_torch_forms(rule, feature_map, per_channel, backend):
    """Default and forced CPU backends against backend="torch", with and without a feature map (without one,
    the first-order backward once ended in "One of the differentiated Tensors appears to not have been used")."""
    normalize = False if feature_map is None else None  # identity features may make the normalizer cross 0
    x = inputs(rule, per_channel=per_channel)
    got = hvp(rule, x, backend, feature_map, normalize)
    want = hvp(rule, x, "torch", feature_map, normalize)
    for n in x:
        assert rel(got[n], want[n]) < 2e-4, (n, rel(got[n], want[n]))


def test_compiled_prefill_ran_in_the_forward(monkeypatch):
    """The cases above reach the compiled kernel (its forward), so the exact second derivative is its backward's."""
    seen = []
    original = cpu_backend.CompiledPrefill.apply

    def spy(*args):
        seen.append(True)
        return original(*args)

    monkeypatch.setattr(cpu_backend.CompiledPrefill, "apply", spy)
    x = inputs("delta")
    hvp("delta", x, "auto", "l2", None)
    assert seen


@pytest.mark.parametrize(("rule", "per_channel"), [("accumulate", False), ("gated", False), ("gated", True)])
def test_hessian_vector_product_over_many_chunks(rule, per_channel):
    """The chunk form's carry from chunk to chunk has an exact second derivative: over five chunks (the last one
    partial) its Hessian-vector product equals the recurrent form's, in float64."""
    x = inputs(rule, T=37, dtype=torch.float64, per_channel=per_channel)
    got = hvp(rule, x, "torch", "elu1", None, form="chunk", chunk_size=8)
    want = hvp(rule, x, "torch", "elu1", None, form="recurrent")
    for n in x:
        assert rel(got[n], want[n]) < 1e-10, (n, rel(got[n], want[n]))


@pytest.mark.parametrize(("rule", "per_channel"), [("accumulate", False), ("gated", False), ("gated", True)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_torch_func_grad_over_many_chunks(rule, per_channel, dtype):
    """torch.func.grad differentiates the chunk form over several chunks (its carry is a custom autograd Function)
    and gives autograd's gradient: the recurrent form's in float64, the chunk form's own in bfloat16; "auto"
    keeps the torch forms under the transform."""
    x = {n: t.detach() for n, t in inputs(rule, T=37, dtype=dtype, per_channel=per_channel).items()}

    def loss(v, form, backend="torch"):
        o, _ = linattn.linear_attention(x["q"], x["k"], v, rule=rule, feature_map="elu1", g=x.get("g"), form=form,
                                        chunk_size=8, backend=backend)
        return o.float().pow(2).sum()

    v = x["v"].clone().requires_grad_()
    want = torch.autograd.grad(loss(v, "recurrent" if dtype == torch.float64 else "chunk"), v)[0]
    for backend in ("torch", "auto"):
        got = torch.func.grad(lambda v_, b=backend: loss(v_, "chunk", b))(x["v"])
        assert rel(got.double(), want.double()) < (1e-10 if dtype == torch.float64 else 1e-6), backend


SUBSETS = [names for r in range(1, 6) for names in itertools.combinations(("q", "k", "v", "g", "beta"), r)]


@pytest.mark.parametrize("rule", ["gated", "delta", "gated_delta"])
@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_hessian_vector_product_when_only_some_inputs_require_grad(rule, backend):
    """Any subset of the inputs may require grad: with q alone, the final state does not depend on any of them
    (it holds keys and values only), which once ended the double backward in "element 1 of tensors does not
    require grad". (elu1 for "gated": positive features keep its normalizer away from 0.)"""
    fmap = "elu1" if rule == "gated" else "l2"
    base = {n: t.detach() for n, t in inputs(rule, T=19).items()}
    tried = 0
    for names in SUBSETS:
        if not set(names) <= set(base):
            continue
        tried += 1
        x = {n: t.clone().requires_grad_(n in names) for n, t in base.items()}
        got = hvp(rule, x, backend, fmap, None)
        want = hvp(rule, x, "torch", fmap, None)
        assert set(got) == set(names)
        for n in names:
            assert rel(got[n], want[n]) < 2e-4, (names, n, rel(got[n], want[n]))
    assert tried == 2 ** len(base) - 1


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_hessian_vector_product_packed(rule):
    x = inputs(rule, T=23)
    cu = torch.tensor([0, 5, 5, 23])
    got = hvp(rule, x, "cpu", "l2", None, cu_seqlens=cu)
    want = hvp(rule, x, "torch", "l2", None, cu_seqlens=cu)
    for n in x:
        assert rel(got[n], want[n]) < 2e-4, (n, rel(got[n], want[n]))


def test_float64_gradgradcheck_anchors_the_compiled_path():
    """The torch forms' second derivative passes gradgradcheck in float64, and the compiled path's (float32)
    equals that float64 second derivative to float32 rounding."""
    rule = "gated_delta"  # the delta rule is its g = None case, covered above
    x64 = inputs(rule, T=4, H=1, D=3, Dv=2, dtype=torch.float64, seed=3)
    names = list(x64)

    def f(*ts):
        kw = dict(zip(names, ts, strict=True))
        return linattn.linear_attention(kw["q"], kw["k"], kw["v"], rule=rule, feature_map="l2", g=kw.get("g"),
                                        beta=kw.get("beta"), backend="torch", chunk_size=2)[0]

    assert gradgradcheck(f, tuple(x64[n] for n in names))
    x32 = {n: t.detach().float().requires_grad_() for n, t in x64.items()}
    got = hvp(rule, x32, "cpu", "l2", None)
    want = hvp(rule, x64, "torch", "l2", None)
    for n in names:
        assert rel(got[n], want[n]) < 2e-4, (n, rel(got[n], want[n]))


def test_gradient_penalty_through_the_layer():
    """A gradient penalty ||d out / d x||^2 through LinearAttention(rule="gated_delta"): the weights' gradient
    on the default backend equals backend="torch"."""
    grads = {}
    for backend in ("auto", "torch"):
        torch.manual_seed(0)
        layer = LinearAttention(16, 2, 8, rule="gated_delta", backend=backend)
        x = torch.randn(2, 19, 16, generator=torch.Generator().manual_seed(2)).requires_grad_()
        y, _ = layer(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        penalty = gx.square().sum()
        grads[backend] = torch.autograd.grad(penalty, [layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight])
    for a, e in zip(grads["auto"], grads["torch"], strict=True):
        assert rel(a, e) < 2e-4, rel(a, e)
