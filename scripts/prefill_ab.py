"""The compiled prefill of two source trees side by side: alternating processes, B=1, H=8, D=64, T=8192, 1 thread (or
THREADS); also gated delta with ``feature_map="l2"`` on raw q and k (whole call, "auto") and one forward + backward
of an ``nn.LinearAttention`` delta layer with its short convolution (B=8, T=256, width 128: an MQAR training shape).
THREADS (default 1): torch's thread count in both trees.

    mkdir -p /tmp/linattn-base && git archive 9a62b5c src | tar -x -C /tmp/linattn-base
    python scripts/prefill_ab.py /tmp/linattn-base/src src [THREADS]

Each process imports one tree, times ``linattn.linear_attention(..., backend="cpu")`` without autograd (median of
7 calls after two warm-ups) for every rule; three rounds alternate the trees, and the median round is printed.
"""

import json
import statistics
import subprocess
import sys

CHILD = r'''
import sys, time, json, torch, statistics
sys.path.insert(0, sys.argv[1])
import linattn
torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)
B,T,H,D=1,8192,8,64
q,k,v=(torch.randn(B,T,H,D) for _ in range(3))
kn=torch.nn.functional.normalize(k,dim=-1)
g=torch.nn.functional.logsigmoid(torch.randn(B,T,H)); beta=torch.rand(B,T,H)
cases={"accumulate":dict(k=k,kw=dict(feature_map="elu1")),
       "gated":dict(k=k,kw=dict(rule="gated",g=g,feature_map="elu1")),
       "delta":dict(k=kn,kw=dict(rule="delta",beta=beta)),
       "gated_delta":dict(k=kn,kw=dict(rule="gated_delta",g=g,beta=beta))}
out={}
with torch.no_grad():
    for name,c in cases.items():
        f=lambda: linattn.linear_attention(q,c["k"],v,backend="cpu",**c["kw"])
        f(); f()
        ts=[]
        for _ in range(7):
            t0=time.perf_counter(); f(); ts.append((time.perf_counter()-t0)*1e3)
        out[name]=statistics.median(ts)
    f=lambda: linattn.linear_attention(q,k,v,rule="gated_delta",g=g,beta=beta,feature_map="l2")
    f(); f()
    ts=[]
    for _ in range(7):
        t0=time.perf_counter(); f(); ts.append((time.perf_counter()-t0)*1e3)
    out["gated_delta l2 call"]=statistics.median(ts)
from linattn.nn import LinearAttention
layer=LinearAttention(128,2,64,rule="delta")
x=torch.randn(8,256,128,requires_grad=True)
def train_step():
    y,_=layer(x); y.square().mean().backward()
train_step(); train_step()
ts=[]
for _ in range(7):
    t0=time.perf_counter(); train_step(); ts.append((time.perf_counter()-t0)*1e3)
out["nn delta layer fwd+bwd"]=statistics.median(ts)
print(json.dumps(out))
'''
trees = {"base": sys.argv[1], "this": sys.argv[2]}  # src/ folders
threads = sys.argv[3] if len(sys.argv) > 3 else "1"
res = {n: [] for n in trees}
for _round in range(3):
    for n, src in trees.items():
        p = subprocess.run([sys.executable, "-c", CHILD, src, threads], capture_output=True, text=True, check=True)
        res[n].append(json.loads(p.stdout.strip().splitlines()[-1]))
for case in res["base"][0]:
    b = statistics.median(x[case] for x in res["base"])
    t = statistics.median(x[case] for x in res["this"])
    print(f"{case:24s} base {b:7.1f} ms  this {t:7.1f} ms  this/base {t/b:.2f}")
