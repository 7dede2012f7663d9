"""Sequence parallelism: 2, 3 and 4 gloo processes on loopback against one process running the whole sequence.

One spawn per world size runs every case inside the workers (torch threads pinned to 1) and writes its results to
a file; the test then asserts on them. Budget: about 30-40 s for the whole file on 2 shared cores.
"""

from __future__ import annotations

import datetime
import socket
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import linattn
from linattn import State
from linattn.distributed import RankMismatchError, linear_attention, message_bytes

TOL = 2e-5  # float32 rounding, relative to max(1, max |expected|)
CHUNK = 8
SEGMENTS = {2: [5, 19], 3: [1, 12, 6], 4: [9, 1, 3, 17]}  # one shorter than a chunk, one of length 1
B, H, D, DV = 2, 2, 5, 3


def _gates(gen, shape, kind):
    """Log-gates: ``near`` mixes alpha ~ 1 (g = -1e-6), alpha ~ 0 (g = -30) and resets (g = -inf, alpha = 0)
    with ordinary values."""
    g = F.logsigmoid(torch.randn(shape, generator=gen) * 2 + 1)
    if kind == "near":
        pick = torch.rand(shape, generator=gen)
        g = torch.where(pick < 0.3, torch.full_like(g, -1e-6), torch.where(pick > 0.85, torch.full_like(g, -30.0), g))
        g = torch.where(pick > 0.97, torch.full_like(g, -torch.inf), g)
    return g


def _case(name: str, T: int, seed: int) -> dict:
    """Full-sequence inputs (identical on every rank: same seed) and keyword arguments for one case."""
    gen = torch.Generator().manual_seed(seed)
    rule = name.split(":")[0]
    q, k = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
    v = torch.randn(B, T, H, DV, generator=gen)
    kw: dict = {"rule": rule}
    if rule in ("accumulate", "gated"):
        kw["feature_map"] = "elu1"
    else:
        k = F.normalize(k, dim=-1)
        kw["beta"] = torch.rand(B, T, H, generator=gen)
    if rule == "gated":
        kw["g"] = _gates(gen, (B, T, H, D) if "channel" in name else (B, T, H), "near")
    if rule == "gated_delta":
        kw["g"] = _gates(gen, (B, T, H), "near")
    if "nonorm" in name:
        kw["normalize"] = False
    if "clamp" in name:  # the read's other epsilon convention, and an explicit scale
        kw |= {"eps_mode": "clamp", "eps": 0.3, "scale": 0.7}
    normalize = kw.get("normalize", rule in ("accumulate", "gated"))
    init = None
    if "init" in name:
        S0 = torch.randn(B, H, D, DV, generator=gen) * 0.5
        z0 = torch.rand(B, H, D, generator=gen) + 0.5 if normalize else None
        init = State(S0, z0)
    return {"q": q, "k": k, "v": v, "kw": kw, "init": init, "normalize": normalize}


CASES = [
    "accumulate:init", "accumulate:nonorm", "accumulate:clamp", "gated:head:init", "gated:channel:init",
    "gated:channel:nonorm", "delta:init", "delta", "gated_delta:init",
]


def _rel(a, e) -> float:
    a, e = a.detach().double(), e.detach().double()
    return float((a - e).abs().max() / max(1.0, float(e.abs().max())))


def _run_case(name, seed, rank, world) -> dict:
    lengths = SEGMENTS[world]
    c = _case(name, sum(lengths), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    w_o = torch.randn(B, sum(lengths), H, DV, generator=gen)
    w_S = torch.randn(B, H, D, DV, generator=gen)
    w_z = torch.randn(B, H, D, generator=gen)

    def leaves(d):
        tensors = {n: d[n] for n in ("q", "k", "v")} | {n: d["kw"][n] for n in ("g", "beta") if n in d["kw"]}
        if d["init"] is not None:
            tensors |= {"S0": d["init"].S} | ({"z0": d["init"].z} if d["init"].z is not None else {})
        return {n: t.clone().requires_grad_(True) for n, t in tensors.items()}

    def loss(o, final, w):
        out = (o * w).sum()
        if final is not None:
            out = out + (final.S * w_S).sum() + (0 if final.z is None else (final.z * w_z).sum())
        return out

    def call(fn, x, **extra):
        kw = {**c["kw"], **{n: x[n] for n in ("g", "beta") if n in x}}
        init = None
        if "S0" in x:
            init = State(x["S0"], x.get("z0"))
        return fn(x["q"], x["k"], x["v"], initial_state=init, output_final_state=True, chunk_size=CHUNK, **kw, **extra)

    # The single process on the whole sequence (the chunk form), on this rank.
    full = leaves(c)
    o_full, final_full = call(linattn.linear_attention, full)
    loss(o_full, final_full, w_o).backward()

    # This rank's segment. The final-state term of the loss lives on the last rank only, so rank 0 backpropagates
    # through outputs alone (its outputs do not depend on the exchange, yet the others need its reduce-scatter).
    start = sum(lengths[:rank])
    seg = slice(start, start + lengths[rank])
    part = {n: (t[:, seg] if n not in ("S0", "z0") else t) for n, t in leaves(c).items()}
    if rank > 0:
        part.pop("S0", None)
        part.pop("z0", None)
    part = {n: t.detach().requires_grad_(True) for n, t in part.items()}
    o, final = call(linear_attention, part)
    loss(o, final if rank == world - 1 else None, w_o[:, seg]).backward()

    errs = {"o": _rel(o, o_full[:, seg]), "final.S": _rel(final.S, final_full.S)}
    if final_full.z is not None:
        errs["final.z"] = _rel(final.z, final_full.z)
    for n, t in part.items():
        ref = full[n].grad if n in ("S0", "z0") else full[n].grad[:, seg]
        errs[f"grad {n}"] = _rel(t.grad, ref)
    return errs


def _mismatch_cases(rank: int) -> dict:
    """Each bad call must raise on every rank; the group must still work afterwards."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 4, 2, 3, generator=gen)
    out = {}
    bad = {
        "heads": lambda: linear_attention(q[:, :, :1] if rank == 1 else q, q[:, :, :1] if rank == 1 else q,
                                          q[:, :, :1] if rank == 1 else q),
        "dtype": lambda: linear_attention(*(q.double() if rank == 1 else q,) * 3),
        "rule": lambda: linear_attention(q, q, q, rule="gated" if rank == 1 else "accumulate",
                                         g=torch.zeros(1, 4, 2) if rank == 1 else None),
        "batch": lambda: linear_attention(*(torch.cat([q, q]) if rank == 1 else q,) * 3),
        # One rank tracking gradients and another not would leave the first waiting in its backward.
        "grad": lambda: linear_attention(q.clone().requires_grad_(rank == 1), q, q),
        "bad_gate": lambda: linear_attention(q, q, q, rule="gated", g=torch.full((1, 4, 2), -1.0 + 2 * (rank == 1))),
        "init_off_rank0": lambda: linear_attention(
            q, q, q, normalize=False, initial_state=State(torch.zeros(1, 2, 3, 3)) if rank == 1 else None),
        "normalize_delta": lambda: linear_attention(q, q, q, rule="delta", beta=torch.ones(1, 4, 2), normalize=True),
        "cu_seqlens": lambda: linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 2, 4])),
        "bad_backend": lambda: linear_attention(q, q, q, backend="cuda"),
        "backend_mismatch": lambda: linear_attention(q, q, q, backend="torch" if rank == 1 else "auto"),
        "output_final_state": lambda: linear_attention(q, q, q, output_final_state=1),
        # The forced backend reaches each rank's own call: the compiled kernel keeps a float32 state only.
        "cpu_grad": lambda: linear_attention(q, q, q, backend="cpu", state_dtype=torch.float64),
    }
    for name, fn in bad.items():
        try:
            fn()
            out[name] = "no error"
        except RankMismatchError as exc:
            out[name] = f"RankMismatchError: {exc}"
        except (ValueError, TypeError) as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    o, _ = linear_attention(q, q, q)  # still usable: every rank holds a copy of q, the whole sequence repeats it
    whole = q.repeat(1, dist.get_world_size(), 1, 1)
    out["after"] = _rel(o, linattn.linear_attention(whole, whole, whole)[0][:, 4 * rank: 4 * rank + 4])
    out["backends"] = _backends(rank)
    return out


def _backends(rank: int) -> dict:
    """Forced backend="torch" and "cpu" (the numba kernel) give the same outputs and final state, every rule."""
    errs = {}
    seg = slice(0, 6) if rank == 0 else slice(6, 13)
    for name in ("accumulate:init", "gated:channel", "delta:init", "gated_delta:init"):
        c = _case(name, 13, 300)
        kw = {n: (x[:, seg] if n in ("g", "beta") else x) for n, x in c["kw"].items()}
        runs = {}
        for backend in ("torch", "cpu"):
            with torch.no_grad():
                runs[backend] = linear_attention(c["q"][:, seg], c["k"][:, seg], c["v"][:, seg], backend=backend,
                                                 initial_state=c["init"] if rank == 0 else None,
                                                 output_final_state=True, **kw)
        errs[name] = max(_rel(runs["cpu"][0], runs["torch"][0]), _rel(runs["cpu"][1].S, runs["torch"][1].S))
    return errs


def _worker(rank: int, world: int, port: int, path: str, mismatch: bool) -> None:
    torch.set_num_threads(1)
    result: dict = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        result["cases"] = {name: _run_case(name, 100 + i, rank, world) for i, name in enumerate(CASES)}
        if mismatch:
            result["mismatch"] = _mismatch_cases(rank)
        dist.destroy_process_group()
    except Exception:
        result["crash"] = traceback.format_exc()
    torch.save(result, f"{path}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world: int, tmp_path, mismatch: bool = False, timeout: float = 120.0) -> list[dict]:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, str(tmp_path), mismatch)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} did not finish within {timeout} s (a hang)"
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for r, res in enumerate(results):
        assert "crash" not in res, f"rank {r} crashed:\n{res['crash']}"
    return results


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_one_process(world, tmp_path):
    results = _launch(world, tmp_path, mismatch=world == 2)
    for r, res in enumerate(results):
        for case, errs in res["cases"].items():
            assert errs.keys() >= {"o", "final.S", "grad q", "grad k", "grad v"}
            for what, err in errs.items():
                assert err < TOL, f"world {world}, rank {r}, {case}: {what} differs by {err:.3g}"
        if r == 0:
            assert any("grad S0" in e for e in res["cases"].values())
    if world == 2:
        _check_mismatch([res["mismatch"] for res in results])


def _check_mismatch(per_rank: list[dict]) -> None:
    expect = {"heads": "heads H", "dtype": "input dtype", "rule": "rule", "batch": "batch size B", "grad": "autograd"}
    for r, out in enumerate(per_rank):
        for name, words in expect.items():
            assert out[name].startswith("RankMismatchError") and words in out[name], (r, name, out[name])
        assert "cu_seqlens" in out["cu_seqlens"] and "not supported" in out["cu_seqlens"], out["cu_seqlens"]
        assert out["after"] < TOL
        assert out["normalize_delta"].startswith("ValueError: normalize=True: rule 'delta'"), out["normalize_delta"]
        assert out["bad_backend"].startswith("ValueError: backend: unknown backend 'cuda'"), out["bad_backend"]
        assert out["backend_mismatch"].startswith("RankMismatchError") and "backend" in out["backend_mismatch"]
        assert out["output_final_state"].startswith("TypeError: output_final_state must be a bool")
        assert out["cpu_grad"].startswith("ValueError: backend='cpu' cannot run this call"), out["cpu_grad"]
        for rule, err in out["backends"].items():
            assert err < TOL, (r, rule, err)
    # The rank with the bad input raises its own error; the other names it.
    assert per_rank[1]["init_off_rank0"].startswith("ValueError: initial_state is given on rank 1; pass it on rank 0")
    assert "rank 1 rejected" in per_rank[0]["init_off_rank0"]
    assert per_rank[1]["bad_gate"].startswith("ValueError: g must be <= 0"), per_rank[1]["bad_gate"]
    assert per_rank[0]["bad_gate"].startswith("RankMismatchError") and "rank 1 rejected" in per_rank[0]["bad_gate"]


def test_no_process_group_says_how_to_start_one():
    assert not dist.is_initialized()
    q = torch.randn(1, 3, 1, 2)
    with pytest.raises(RuntimeError, match="init_process_group.*torchrun"):
        linear_attention(q, q, q)


def test_message_bytes_formula():
    # accumulate, normalized: S and z; gated per channel adds [B, H, Dk]; delta: B and M.
    assert message_bytes("accumulate", 2, 3, 4, 5) == 2 * 3 * 4 * 6 * 4
    assert message_bytes("gated", 2, 3, 4, 5, per_channel=True) == (2 * 3 * 4 * 6 + 2 * 3 * 4) * 4
    assert message_bytes("gated", 1, 1, 4, 5, normalize=False) == (4 * 5 + 1) * 4
    assert message_bytes("gated_delta", 1, 2, 4, 5, state_dtype=torch.float64) == 2 * 4 * 9 * 8


# One rank's bad argument: every rank raises within seconds, whether the bad process exits after its error or
# carries on with a good call. The process group's own timeout is short, so a rank left waiting in a collective
# fails the test (as a timeout) instead of hanging it.
BAD_ARGS = {
    "feature_map": lambda rank, q: dict(feature_map="l2x" if rank == 1 else "l2"),
    "initial_state": lambda rank, q: dict(normalize=False,
                                          initial_state=torch.zeros(1, 2, 3, 3) if rank == 0 else None),
    "state_record": lambda rank, q: dict(initial_state=object() if rank == 0 else None),
    "scale": lambda rank, q: dict(scale=torch.tensor(0.5) if rank == 1 else None),
    "eps": lambda rank, q: dict(eps=float("inf") if rank == 0 else 1e-6),
    "chunk_size": lambda rank, q: dict(chunk_size=0 if rank == 1 else 8),
    "state_dtype": lambda rank, q: dict(state_dtype="float32" if rank == 1 else None),
    "g": lambda rank, q: dict(rule="gated", g=torch.zeros(1, 4, 2) if rank == 0 else "zeros"),
    "beta": lambda rank, q: dict(rule="delta", beta=torch.ones(1, 4, 2) if rank == 0 else torch.ones(1, 4, 3)),
    "rule": lambda rank, q: dict(rule="deltax" if rank == 1 else "accumulate"),
    "group_of_q": lambda rank, q: dict(k=q[..., :2] if rank == 1 else q),
}


def _bad_arg_worker(rank: int, world: int, port: int, path: str, exit_after_error: bool) -> None:
    import time

    torch.set_num_threads(1)
    result: dict = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=20))
        q = torch.randn(1, 4, 2, 3, generator=torch.Generator().manual_seed(5))
        for name, args in BAD_ARGS.items():
            kw = args(rank, q)
            k = kw.pop("k", q)
            start = time.monotonic()
            try:
                linear_attention(q, k, q, **kw)
                result[name] = "no error"
            except RankMismatchError as exc:
                result[name] = f"RankMismatchError: {exc}"
            except Exception as exc:  # noqa: BLE001 - the test reads what was raised
                result[name] = f"{type(exc).__name__}: {exc}"
                if exit_after_error:  # the bad process leaves; its partner must not be left waiting
                    result["seconds"] = time.monotonic() - start
                    torch.save(result, f"{path}/rank{rank}.pt")
                    return
            result[f"{name} seconds"] = time.monotonic() - start
            if exit_after_error:  # its partner has left: nothing more to run together
                torch.save(result, f"{path}/rank{rank}.pt")
                return
        o, _ = linear_attention(q, q, q)  # the group still works for a good call
        result["after"] = o.shape == q.shape
        dist.destroy_process_group()
    except Exception:
        result["crash"] = traceback.format_exc()
    torch.save(result, f"{path}/rank{rank}.pt")


def _launch_bad(tmp_path, exit_after_error: bool) -> list[dict]:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_bad_arg_worker, args=(r, 2, port, str(tmp_path), exit_after_error)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} did not finish (a hang)"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]


def test_one_ranks_bad_argument_raises_on_every_rank(tmp_path):
    per_rank = _launch_bad(tmp_path, exit_after_error=False)
    for r, res in enumerate(per_rank):
        assert "crash" not in res, res["crash"]
        assert res["after"]
        for name in BAD_ARGS:
            out = res[name]
            assert out != "no error", (r, name)
            assert res[f"{name} seconds"] < 10, (r, name, res[f"{name} seconds"])
            if not out.startswith("RankMismatchError"):  # the bad rank's own error names the argument
                arg = {"state_record": "initial_state", "group_of_q": "q and k"}.get(name, name)
                assert out.startswith(("ValueError", "TypeError")) and arg in out, (r, name, out)
        # at least one rank (the good one) says which rank rejected its input
        for name in BAD_ARGS:
            assert any(p[name].startswith("RankMismatchError") and "rejected" in p[name] for p in per_rank), name


def test_bad_rank_that_exits_releases_its_partner(tmp_path):
    good, bad = _launch_bad(tmp_path, exit_after_error=True)
    assert "crash" not in good, good["crash"]
    assert bad["feature_map"].startswith(("ValueError", "RankMismatchError")) and "feature_map" in bad["feature_map"]
    assert good["feature_map"].startswith("RankMismatchError") and "rank 1 rejected" in good["feature_map"]
    assert good["feature_map seconds"] < 10
