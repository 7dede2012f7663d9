"""Forward + backward of the compiled CPU prefill (``backend="cpu"``) against the torch chunk form and the peers
that ``linattn perf`` times (HF's ``torch_chunk_gated_delta_rule``, fla's naive chunk functions), per variant, at
B=1, H=8, D=64 (``linattn perf``'s inputs and fixed upstream gradient). Interleaved, medians.

    python scripts/compiled_backward_cost.py --threads 1 --T 8192
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from linattn.tools.perf import peers as pp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(pp.VARIANTS))
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    B, H, D = 1, 8, 64
    print(f"load {os.getloadavg()[0]:.2f}, threads {args.threads}, B={B} H={H} D={D} T={args.T}, median of "
          f"{args.repeats}")
    print("| variant | impl | fwd ms | fwd+bwd ms |")
    print("|---|---|---|---|")
    for variant in args.variants.split(","):
        impls = {"linattn torch chunk": pp.linattn_call("chunk", backend="torch"),
                 "linattn compiled": pp.linattn_call("chunk", backend="cpu")}
        if not args.no_peers:
            for peer in pp.PEERS:
                if peer.variant == variant and peer.form == "chunk":
                    try:
                        impls[peer.name] = peer.load()
                    except ImportError as exc:
                        print(f"({peer.name}: {exc})")
        inp = pp.make_inputs(variant, B, args.T, H, D, grad=True)
        grad_o = torch.randn(B, args.T, H, D, generator=torch.Generator().manual_seed(2))
        leaves = inp.leaves()

        def fwd(fn, inp=inp):
            with torch.no_grad():
                fn(inp)

        def fwdbwd(fn, inp=inp, leaves=leaves, grad_o=grad_o):
            torch.autograd.grad(fn(inp), leaves, grad_o)

        times = {name: ([], []) for name in impls}
        for fn in impls.values():  # warm-up (compiles the kernels)
            fwd(fn)
            fwdbwd(fn)
        for _ in range(args.repeats):
            for name, fn in impls.items():
                for call, out in zip((fwd, fwdbwd), times[name], strict=True):
                    start = time.perf_counter()
                    call(fn)
                    out.append(time.perf_counter() - start)
        for name, (f, fb) in times.items():
            print(f"| {variant} | {name} | {statistics.median(f) * 1e3:.1f} | {statistics.median(fb) * 1e3:.1f} |")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
