"""Measure how close every form comes to the float64 reference, against the tolerance model of tests/test_forms.py.

Draws random cases from the test module's distribution (rules, feature maps, gates, chunk sizes, input scales,
initial states, eps) at the given lengths, runs every form in each dtype configuration and prints, per
configuration, the worst error, the worst ratio error / tolerance (must stay well below 1) and the largest
coefficient c in ``error - u_io <= c u_acc (kappa sqrt(T) + |G|max)`` (the model uses 8). docs/testing.md records
a run of:

    python scripts/tolerance_survey.py --cases 100 --lengths 2,5,10,20,40,70

(about 3 minutes on one core). Not a test: the numbers are what the tolerances are derived from.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from helpers import reference_call, rel_err  # noqa: E402
from test_forms import GATE_RANGES, Case, U, l2_map, make_inputs, softplus_map, tolerance  # noqa: E402

import linattn  # noqa: E402

CONFIGS = {  # name: (input dtype, state_dtype)
    "float64": (torch.float64, None),
    "float32": (torch.float32, None),
    "float32 / float64 state": (torch.float32, torch.float64),
    "bfloat16": (torch.bfloat16, None),
}


def draw(rng: random.Random, rule: str, T: int, exact_eps: bool) -> Case:
    """One case of test_forms.cases(rule) at length T (bfloat16 keeps eps = 1e-6 'add', as the test does)."""
    normalized = rule in ("accumulate", "gated")
    per_channel = rule == "gated" and rng.random() < 0.5
    maps = [None, "relu1", "elu1", "identity", "taylor2", softplus_map] if normalized else [None, "identity", l2_map]
    if per_channel:
        maps.remove("taylor2")
    fmap = rng.choice(maps)
    return Case(rule=rule, B=rng.randint(1, 3), H=rng.randint(1, 3), T=T,
                Dk=rng.randint(1, 4 if fmap == "taylor2" else 9), Dv=rng.randint(1, 9),
                chunk_size=rng.choice([1, 3, 8, 16, 64]), feature_map=fmap,
                per_channel=per_channel, gate_range=rng.choice(sorted(GATE_RANGES)), key_norm=rng.choice([0.3, 1.0]),
                input_scale=rng.choice([0.1, 1.0, 5.0]), with_initial=rng.random() < 0.5,
                eps=rng.choice([0.0, 1e-6]) if exact_eps else 1e-6,
                eps_mode=rng.choice(["add", "clamp"]) if exact_eps else "add", seed=rng.randint(0, 2**31 - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20, help="random cases per rule, length and configuration")
    parser.add_argument("--lengths", default="2,5,10,20,40,70")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(args.seed)
    lengths = [int(t) for t in args.lengths.split(",")]
    worst = {name: {"err": 0.0, "ratio": 0.0, "coef": 0.0, "n": 0} for name in CONFIGS}
    for _ in range(args.cases):
        for rule in linattn.RULES:
            for T in lengths:
                for name, (dtype, state_dtype) in CONFIGS.items():
                    case = draw(rng, rule, T, exact_eps=dtype != torch.bfloat16)
                    (q, k, v), kwargs = make_inputs(case, dtype)
                    acc = state_dtype or (torch.float64 if dtype == torch.float64 else torch.float32)
                    u_io = 0.0 if dtype == torch.float64 else U[dtype]
                    o_ref, S_ref, z_ref = reference_call(q, k, v, **kwargs)
                    tol = tolerance(case, q, k, v, kwargs, o_ref, state_dtype)
                    scale = (tol - 2 * u_io) / 8 / U[acc]  # kappa sqrt(T) + |G|max
                    for form in linattn.supported_forms(rule):
                        o, st = linattn.linear_attention(q, k, v, form=form, output_final_state=True,
                                                         state_dtype=state_dtype, **kwargs)
                        err = max(rel_err(o, o_ref), rel_err(st.S, S_ref),
                                  0.0 if z_ref is None else rel_err(st.z, z_ref))
                        w = worst[name]
                        w["err"], w["ratio"] = max(w["err"], err), max(w["ratio"], err / tol)
                        w["coef"] = max(w["coef"], max(0.0, err - u_io) / (U[acc] * scale))
                        w["n"] += 1
    print(f"{'inputs / state':<26}{'runs':>7}{'worst error':>13}{'worst err/tol':>15}{'largest c':>11}")
    for name, w in worst.items():
        print(f"{name:<26}{w['n']:>7}{w['err']:>13.2e}{w['ratio']:>15.2f}{w['coef']:>11.2f}")
    print(f"(lengths {lengths}, {args.cases} cases per rule and length, seed {args.seed}; "
          f"tol = 2 u_io + 8 u_acc (kappa sqrt(T) + |G|max))")


if __name__ == "__main__":
    main()
