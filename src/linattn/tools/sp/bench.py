"""``linattn sp-bench``: sequence parallelism on N local gloo processes against one process, and a paper model.

Measured here: forward and forward+backward time of `linattn.distributed.linear_attention` with the sequence
split N ways (each rank one torch thread; a step takes as long as its slowest rank) against one process running
the whole sequence with one thread (rank 0, while the others wait, interleaved with the SP calls), and the bytes
each rank writes to its sockets (``wchar`` of /proc/self/io, which counts gloo's socket writes) in the forward and
in the backward, checked against the message formula and shown flat in T. Modeled: the same step on 8-1024 ranks
from the measured per-token compute and composition cost and the message size, under a stated link model, next to
LASP-2's and ring attention's communication volumes.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import torch

import linattn
from linattn.tools.harness import cli as hcli
from linattn.tools.harness import machine
from linattn.tools.harness.plotting import pyplot, save_figure
from linattn.tools.harness.results import write_result
from linattn.tools.harness.timer import time_call, time_turns

SCHEMA = "sp_bench"
MODEL_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class SpConfig:
    ranks: int = 2
    lengths: tuple[int, ...] = (4096, 16384, 65536)  # whole-sequence T, split evenly
    rules: tuple[str, ...] = ("accumulate", "gated", "delta", "gated_delta")
    B: int = 1
    H: int = 4
    D: int = 64
    chunk_size: int = 64
    repeats: int = 5
    # Paper model: one sequence of model_T tokens; ring all-gather over links of this bandwidth and latency.
    model_T: int = 1 << 20
    link_GBps: float = 25.0  # per rank, one direction (about a 200 Gb/s InfiniBand port)
    latency_us: float = 5.0


QUICK = SpConfig(lengths=(256, 1024), rules=("accumulate", "gated_delta"), H=2, D=16, repeats=2)


def _inputs(rule: str, B: int, T: int, H: int, D: int, seed: int, grad: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=gen) for _ in range(3))
    kw: dict[str, Any] = {"rule": rule}
    if rule in ("delta", "gated_delta"):
        k = torch.nn.functional.normalize(k, dim=-1)
        kw["beta"] = torch.rand(B, T, H, generator=gen)
    else:
        kw["feature_map"] = "elu1"
    if rule in ("gated", "gated_delta"):
        kw["g"] = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen) + 4)
    tensors = {"q": q, "k": k, "v": v} | {n: kw[n] for n in ("g", "beta") if n in kw}
    for t in tensors.values():
        t.requires_grad_(grad)
    return {"q": q, "k": k, "v": v, "kw": kw, "leaves": list(tensors.values())}


def _wchar() -> int:
    """Bytes this process (all its threads, gloo's included) has written so far, to files and sockets."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise OSError("no wchar in /proc/self/io")


def _fwd_bwd(call, inp, chunk_size: int = 64):
    def run():
        o, _ = call(inp["q"], inp["k"], inp["v"], chunk_size=chunk_size, **inp["kw"])
        o.square().mean().backward()
        for t in inp["leaves"]:
            t.grad = None
    return run


def _worker(rank: int, world: int, port: int, cfg: SpConfig, path: str) -> None:
    import torch.distributed as dist

    from linattn.distributed import linear_attention as sp_attention

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=300))
    rows = []
    for rule in cfg.rules:
        for T in cfg.lengths:
            Tr = T // world
            seed = 1000 * rank + T
            fwd_in, grad_in = (_inputs(rule, cfg.B, Tr, cfg.H, cfg.D, seed, g) for g in (False, True))

            def fwd(inp=fwd_in):
                sp_attention(inp["q"], inp["k"], inp["v"], chunk_size=cfg.chunk_size, output_final_state=True,
                             **inp["kw"])

            # SP call and a plain call on the same segment, interleaved so that both see the same contention;
            # every timed call starts at a barrier. The first round is a warm-up.
            plain = lambda inp=fwd_in: linattn.linear_attention(  # noqa: E731
                inp["q"], inp["k"], inp["v"], chunk_size=cfg.chunk_size, **inp["kw"])
            calls = {"sp_fwd_s": fwd, "local_fwd_s": plain,
                     "sp_fwd_bwd_s": _fwd_bwd(sp_attention, grad_in, cfg.chunk_size),
                     "local_fwd_bwd_s": _fwd_bwd(linattn.linear_attention, grad_in, cfg.chunk_size)}
            # One process doing the whole sequence: rank 0 runs it while the others wait at the next barrier
            # (gloo's barrier sleeps), in the same window as the SP calls.
            whole_f, whole_g = (_inputs(rule, cfg.B, T, cfg.H, cfg.D, T, g) for g in (False, True)) if rank == 0 \
                else (None, None)
            calls |= {
                "single_fwd_s": (lambda i=whole_f: linattn.linear_attention(
                    i["q"], i["k"], i["v"], chunk_size=cfg.chunk_size, **i["kw"])) if rank == 0 else (lambda: None),
                "single_fwd_bwd_s": _fwd_bwd(linattn.linear_attention, whole_g, cfg.chunk_size) if rank == 0
                else (lambda: None),
            }
            # Wall time, and the CPU time of this process (all its threads, gloo's included): on a machine shared
            # with other jobs the CPU time is what a rank would take with a core of its own. The calls take turns,
            # each after a barrier; the first round is a warm-up.
            timings = time_turns(list(calls.values()), repeats=cfg.repeats, warmup=1, before=dist.barrier,
                                 cpu_time=True)
            times: dict[str, list[float]] = {}
            for name, t in zip(calls, timings, strict=True):
                times[name], times[name + "_cpu"] = list(t.samples_s), list(t.cpu_samples_s)
            row = {"rule": rule, "T": T, "T_rank": Tr, **times}
            # Bytes: one forward without autograd, then one forward and one backward with it, each measured alone.
            dist.barrier()
            w0 = _wchar()
            fwd()
            w1 = _wchar()
            o, _ = sp_attention(grad_in["q"], grad_in["k"], grad_in["v"], chunk_size=cfg.chunk_size,
                                **grad_in["kw"])
            w2 = _wchar()
            o.square().mean().backward()
            w3 = _wchar()
            row |= {"bytes_fwd": w1 - w0, "bytes_bwd": w3 - w2}
            rows.append(row)
    dist.destroy_process_group()
    torch.save(rows, f"{path}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs) -> None:
    """End the ranks still running (SIGTERM: no traceback; SIGKILL after 10 s) and reap them."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def _spawn(cfg: SpConfig) -> list[list[dict]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, cfg.ranks, port, cfg, tmp)) for r in range(cfg.ranks)]
        # The ranks start with SIGINT ignored (an ignored signal stays ignored across the spawn's exec, and Python
        # then installs no KeyboardInterrupt): a Ctrl-C reaches the whole process group, and only this process
        # answers it, by stopping the ranks before their directory goes; click prints one "Aborted!".
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for p in procs:
                p.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        try:
            for p in procs:
                p.join(1800)
        except BaseException:  # KeyboardInterrupt, to the group or to this process alone
            _stop(procs)
            raise
        failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
        for p in procs:
            if p.is_alive():
                p.kill()
        if failed:
            raise RuntimeError(f"sp-bench: ranks {failed} failed or hung (see their output above)")
        return [torch.load(f"{tmp}/rank{r}.pt") for r in range(cfg.ranks)]


def _compose_step_s(rule: str, cfg: SpConfig, repeats: int) -> float:
    """One step of the prefix composition in float64, as ``linattn.distributed`` does it, per extra rank."""
    S = torch.randn(cfg.B, cfg.H, cfg.D, cfg.D + (rule in ("accumulate", "gated")), dtype=torch.float64)
    if rule in ("delta", "gated_delta"):
        M = torch.randn(cfg.B, cfg.H, cfg.D, cfg.D, dtype=torch.float64)
        fn = lambda: torch.matmul(M, S) + S  # noqa: E731
    elif rule == "gated":
        a = torch.rand(cfg.B, cfg.H, dtype=torch.float64)
        fn = lambda: a.exp()[..., None, None] * S + S  # noqa: E731
    else:
        fn = lambda: S + S  # noqa: E731
    return time_call(fn, repeats=repeats * 20).median_s


def run(cfg: SpConfig) -> dict[str, Any]:
    from linattn.distributed import message_bytes

    started = time.perf_counter()
    load_before = os.getloadavg()
    torch.set_num_threads(1)  # the composition step is timed here, like the ranks: one thread
    per_rank = _spawn(cfg)
    W = cfg.ranks
    rows = []
    for i, base in enumerate(per_rank[0]):
        rule, T = base["rule"], base["T"]
        ranks = [pr[i] for pr in per_rank]

        def slowest(key, ranks=ranks):  # a step lasts as long as its slowest rank: max over ranks, median over reps
            return statistics.median(max(vals) for vals in zip(*(r[key] for r in ranks), strict=True))

        msg = message_bytes(rule, cfg.B, cfg.H, cfg.D, cfg.D)
        s_f, s_fb = (statistics.median(base[k]) for k in ("single_fwd_s", "single_fwd_bwd_s"))
        sp_f, sp_fb = slowest("sp_fwd_s"), slowest("sp_fwd_bwd_s")
        rows.append({
            "rule": rule, "T": T, "T_rank": base["T_rank"], "message_bytes": msg,
            # A ring all-gather sends W - 1 messages; gloo's reduce_scatter is an all-reduce of all W messages
            # (2 (W - 1) on a ring, measured), where NCCL's ring reduce-scatter would send W - 1.
            "formula_fwd_bytes": (W - 1) * msg, "formula_bwd_bytes": 2 * (W - 1) * msg,
            "bytes_fwd": [r["bytes_fwd"] for r in ranks], "bytes_bwd": [r["bytes_bwd"] for r in ranks],
            "single_fwd_ms": 1e3 * s_f, "single_fwd_bwd_ms": 1e3 * s_fb,
            "sp_fwd_ms": 1e3 * sp_f, "sp_fwd_bwd_ms": 1e3 * sp_fb,
            "local_plain_fwd_ms": 1e3 * slowest("local_fwd_s"),
            "local_plain_fwd_bwd_ms": 1e3 * slowest("local_fwd_bwd_s"),
            "sp_overhead_fwd": sp_f / slowest("local_fwd_s"),
            "sp_overhead_fwd_bwd": sp_fb / slowest("local_fwd_bwd_s"),
            "speedup_fwd": s_f / sp_f, "speedup_fwd_bwd": s_fb / sp_fb,
            # CPU time: what each call would take with a core to itself (no waiting for the machine).
            "single_fwd_cpu_ms": 1e3 * statistics.median(base["single_fwd_s_cpu"]),
            "single_fwd_bwd_cpu_ms": 1e3 * statistics.median(base["single_fwd_bwd_s_cpu"]),
            "sp_fwd_cpu_ms": 1e3 * slowest("sp_fwd_s_cpu"), "sp_fwd_bwd_cpu_ms": 1e3 * slowest("sp_fwd_bwd_s_cpu"),
            "local_plain_fwd_cpu_ms": 1e3 * slowest("local_fwd_s_cpu"),
            "local_plain_fwd_bwd_cpu_ms": 1e3 * slowest("local_fwd_bwd_s_cpu"),
        })
        r = rows[-1]
        r["cpu_speedup_fwd"] = r["single_fwd_cpu_ms"] / r["sp_fwd_cpu_ms"]
        r["cpu_speedup_fwd_bwd"] = r["single_fwd_bwd_cpu_ms"] / r["sp_fwd_bwd_cpu_ms"]
    doc = {
        "schema": "linattn.sp_bench/1",
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
        "environment": {
            "cpu": machine.processor_name(), "cores": os.cpu_count(), "torch_threads_per_process": 1, "backend": "gloo",
            "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()), "torch": torch.__version__,
            "linattn": linattn.__version__,
            "note": "with more ranks than free cores (see loadavg) wall times include waiting for a core; the *_cpu_ms "
                    "fields (process CPU time, all threads) are what a rank with a core of its own would take",
        },
        "rows": rows,
        "checks": _checks(rows, W),
        "model": _model(cfg, rows),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    return doc


def _checks(rows: list[dict], world: int) -> dict[str, Any]:
    """Measured bytes against the formula: the excess (the config descriptor and gloo's headers, about 1-2 KiB per
    peer) must be small and must not grow with T."""
    out = {}
    for rule in dict.fromkeys(r["rule"] for r in rows):
        rr = [r for r in rows if r["rule"] == rule]
        excess_f = [max(r["bytes_fwd"]) - r["formula_fwd_bytes"] for r in rr]
        excess_b = [max(r["bytes_bwd"]) - r["formula_bwd_bytes"] for r in rr]
        spread = max(max(r["bytes_fwd"]) for r in rr) - min(min(r["bytes_fwd"]) for r in rr)
        out[rule] = {
            "excess_fwd_bytes": excess_f, "excess_bwd_bytes": excess_b, "fwd_bytes_spread_over_T": spread,
            "ok": all(0 <= e <= 4096 * world for e in excess_f + excess_b) and spread <= 64,
        }
    return out


def _model(cfg: SpConfig, rows: list[dict]) -> dict[str, Any]:
    """Paper model of one step on W ranks, one sequence of ``model_T`` tokens (strong scaling).

    compute: the CPU time per local token of the slowest rank's SP call (at the longest T measured; CPU time, not
    wall time, so that the machine's other jobs do not count) times T/W; composition: W - 1
    measured float64 steps (sequential on each rank); communication: a ring all-gather,
    (W - 1) messages of the measured size, each costing latency + bytes / bandwidth; the backward repeats the
    composition and reduce-scatters the same volume (NCCL's ring; gloo's all-reduce would send twice that).
    LASP-2 all-gathers one [B, H, d, d] memory state per rank; ring attention passes every rank's K and V blocks
    around the ring, (W - 1) * 2 * (T/W) * H * D words.
    """
    bw, lat = cfg.link_GBps * 1e9, cfg.latency_us * 1e-6
    T = cfg.model_T
    elem = 4
    out: dict[str, Any] = {"T": T, "link_GBps": cfg.link_GBps, "latency_us": cfg.latency_us,
                           "per_token_source": f"SP call CPU time per token, {cfg.ranks} ranks, T = {max(cfg.lengths)}",
                           "rules": {}, "ranks": list(MODEL_RANKS)}
    for rule in dict.fromkeys(r["rule"] for r in rows):
        last = max((r for r in rows if r["rule"] == rule), key=lambda r: r["T"])
        c_f = last["sp_fwd_cpu_ms"] / 1e3 / last["T_rank"]
        c_fb = last["sp_fwd_bwd_cpu_ms"] / 1e3 / last["T_rank"]
        c_one = last["single_fwd_cpu_ms"] / 1e3 / last["T"]  # one process, plain call, whole sequence
        step = _compose_step_s(rule, cfg, cfg.repeats)
        msg = last["message_bytes"]
        per_w = []
        for W in MODEL_RANKS:
            comm = (W - 1) * (lat + msg / bw)
            fwd = c_f * T / W + (W - 1) * step + comm
            per_w.append({
                "W": W, "bytes_per_rank_fwd": (W - 1) * msg, "compute_fwd_ms": 1e3 * c_f * T / W,
                "compose_fwd_ms": 1e3 * (W - 1) * step, "comm_fwd_ms": 1e3 * comm, "fwd_ms": 1e3 * fwd,
                "fwd_bwd_ms": 1e3 * (c_fb * T / W + 2 * (W - 1) * step + 2 * comm),
                "speedup_fwd_vs_1_process": (c_one * T) / fwd,
            })
        out["rules"][rule] = {"per_token_fwd_us": 1e6 * c_f, "per_token_fwd_bwd_us": 1e6 * c_fb,
                              "compose_step_us": 1e6 * step, "message_bytes": msg, "by_ranks": per_w}
    out["lasp2_bytes_per_rank_fwd"] = [(W - 1) * cfg.B * cfg.H * cfg.D * cfg.D * elem for W in MODEL_RANKS]
    out["ring_attention_bytes_per_rank_fwd"] = [
        (W - 1) * 2 * (T // W) * cfg.B * cfg.H * cfg.D * elem for W in MODEL_RANKS]
    out["ring_attention_comm_fwd_ms"] = [
        1e3 * (W - 1) * (lat + 2 * (T // W) * cfg.B * cfg.H * cfg.D * elem / bw) for W in MODEL_RANKS]
    return out


def table(doc: dict[str, Any]) -> str:
    W = doc["config"]["ranks"]
    lines = [f"| rule | T | fwd ms: 1 process / {W} ranks (speedup) | fwd CPU ms: 1 process / slowest rank (speedup) | "
             f"fwd+bwd ms (speedup) | fwd+bwd CPU ms (speedup) | bytes/rank fwd (formula) | bytes/rank bwd (formula) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        lines.append(
            f"| {r['rule']} | {r['T']} | {r['single_fwd_ms']:.1f} / {r['sp_fwd_ms']:.1f} ({r['speedup_fwd']:.2f}x) | "
            f"{r['single_fwd_cpu_ms']:.1f} / {r['sp_fwd_cpu_ms']:.1f} ({r['cpu_speedup_fwd']:.2f}x) | "
            f"{r['single_fwd_bwd_ms']:.1f} / {r['sp_fwd_bwd_ms']:.1f} ({r['speedup_fwd_bwd']:.2f}x) | "
            f"{r['single_fwd_bwd_cpu_ms']:.1f} / {r['sp_fwd_bwd_cpu_ms']:.1f} ({r['cpu_speedup_fwd_bwd']:.2f}x) | "
            f"{max(r['bytes_fwd']):,} ({r['formula_fwd_bytes']:,}) | {max(r['bytes_bwd']):,} "
            f"({r['formula_bwd_bytes']:,}) |")
    return "\n".join(lines)


def plot_figure(doc: dict[str, Any], path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Bytes per rank and CPU time against T (measured), and the model's bytes and times against W."""
    fig, axes = pyplot().subplots(2, 2, figsize=(13, 9))
    axes = axes.ravel()
    ax = axes[0]
    for rule in doc["checks"]:
        rr = [r for r in doc["rows"] if r["rule"] == rule]
        Ts = [r["T"] for r in rr]
        line, = ax.plot(Ts, [max(r["bytes_fwd"]) for r in rr], "o-", label=f"{rule} forward")
        ax.plot(Ts, [max(r["bytes_bwd"]) for r in rr], "s-.", color=line.get_color(), label=f"{rule} backward")
        ax.plot(Ts, [r["formula_fwd_bytes"] for r in rr], ":", color=line.get_color(), alpha=0.6)
    ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="bytes sent per rank (measured)",
           title=f"measured ({doc['config']['ranks']} gloo ranks): flat in T\n(dotted: formula (W-1) x message)")
    ax.legend(fontsize=7)
    ax = axes[1]
    W = doc["config"]["ranks"]
    for rule in doc["checks"]:
        rr = [r for r in doc["rows"] if r["rule"] == rule]
        Ts = [r["T"] for r in rr]
        line, = ax.plot(Ts, [r["single_fwd_bwd_cpu_ms"] for r in rr], "o--", label=f"{rule}: 1 process")
        ax.plot(Ts, [r["sp_fwd_bwd_cpu_ms"] for r in rr], "s-", color=line.get_color(), label=f"{rule}: {W} ranks")
    ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel="forward+backward CPU ms (slowest rank)",
           title="measured CPU time per step (a core each; the machine was shared)")
    ax.legend(fontsize=7)
    m = doc["model"]
    ax = axes[2]
    for rule, d in m["rules"].items():
        ax.plot(m["ranks"], [x["bytes_per_rank_fwd"] for x in d["by_ranks"]], "o-", label=f"linattn {rule}")
    ax.plot(m["ranks"], m["lasp2_bytes_per_rank_fwd"], "k--", label="LASP-2 (d x d state)")
    ax.plot(m["ranks"], m["ring_attention_bytes_per_rank_fwd"], "r:", label="ring attention (K, V blocks)")
    ax.set(xscale="log", yscale="log", xlabel="ranks W", ylabel="bytes sent per rank, forward",
           title=f"model: T = {m['T']:,} tokens")
    ax.legend(fontsize=7)
    ax = axes[3]
    for rule, d in m["rules"].items():
        line, = ax.plot(m["ranks"], [x["fwd_ms"] for x in d["by_ranks"]], "o-", label=f"{rule} step")
        ax.plot(m["ranks"], [x["compute_fwd_ms"] for x in d["by_ranks"]], ":", color=line.get_color())
    ax.set(xscale="log", yscale="log", xlabel="ranks W", ylabel="forward ms (model)",
           title=f"model: compute (dotted) + composition + comm\n{m['link_GBps']} GB/s, {m['latency_us']} us links")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, overwrite=overwrite, dpi=100)


def _ints(ctx, param, value):
    try:
        return tuple(int(x) for x in value.split(",") if x)
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


@click.command(name="sp-bench", context_settings=hcli.CONTEXT)
@click.option("--ranks", type=click.IntRange(min=1, max=64), default=2,
              help="Local gloo processes (one torch thread each).")
@click.option("--lengths", default="4096,16384,65536", callback=_ints,
              help="Whole-sequence lengths T, split evenly across the ranks.")
@click.option("--rules", default="accumulate,gated,delta,gated_delta", help="Update rules, comma-separated.")
@click.option("--heads", type=click.IntRange(min=1), default=4, help="Heads H.")
@click.option("--dim", type=click.IntRange(min=1), default=64, help="Key and value width.")
@click.option("--repeats", type=click.IntRange(min=1), default=5, help="Timed rounds per length.")
@hcli.quick_option(help="Tiny shapes, two rules: checks the tool in seconds; its numbers mean nothing.")
@hcli.output_option()
@hcli.plot_option(help="Draw bytes, times and the model to this PNG.")
@hcli.overwrite_option()
def command(ranks, lengths, rules, heads, dim, repeats, quick, output, plot, overwrite) -> None:
    """Sequence parallelism: N gloo processes vs one, bytes per rank, and a model of 8-1024 ranks. Prints the
    table; writes files only with -o/--output and --plot."""
    rule_names = tuple(r for r in rules.split(",") if r)
    bad = [r for r in rule_names if r not in linattn.RULES]
    if bad or not rule_names:
        raise click.BadParameter(f"unknown rules {', '.join(bad) or '(none given)'}; expected some of "
                                 f"{', '.join(linattn.RULES)}", param_hint="--rules")
    if not lengths or any(T < ranks for T in lengths):
        raise click.BadParameter(f"every length must be >= ranks ({ranks}), got {', '.join(map(str, lengths))}",
                                 param_hint="--lengths")
    cfg = QUICK if quick else SpConfig(lengths=lengths, rules=rule_names, H=heads, D=dim, repeats=repeats)
    cfg = SpConfig(**(asdict(cfg) | {"ranks": ranks, "lengths": tuple(cfg.lengths), "rules": tuple(cfg.rules)}))
    hcli.check_outputs(overwrite, {"--output": output, "--plot": plot})  # before minutes of measuring
    doc = run(cfg)
    click.echo(table(doc))
    for rule, c in doc["checks"].items():
        click.echo(f"{rule}: bytes vs formula excess fwd {c['excess_fwd_bytes']} bwd {c['excess_bwd_bytes']}, "
                   f"spread over T {c['fwd_bytes_spread_over_T']} -> {'ok' if c['ok'] else 'CHECK FAILED'}")
    if output is not None:
        hcli.write("--output", lambda p, overwrite: write_result(doc, p, SCHEMA, overwrite=overwrite), output,
                   overwrite=overwrite)
    if plot is not None:
        hcli.write("--plot", lambda p, overwrite: plot_figure(doc, p, overwrite=overwrite), plot, overwrite=overwrite)
    click.echo(f"({doc['elapsed_s']:.1f} s)")
