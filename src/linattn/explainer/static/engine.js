/* The page's engine: the four update rules token by token, in JavaScript doubles (float64), write then read.
   window.linattnExplainer.run(spec) -> {S: [per token r x dv], z: [per token r] | null, y: [per token dv]}. */
"use strict";
const RULES = ["accumulate", "gated", "delta", "gated_delta"];

function checkMatrix(name, x, T) {
  if (!Array.isArray(x) || x.length !== T || !x.every((row) => Array.isArray(row) && row.length === x[0].length && row.length > 0))
    throw new Error(name + " must be a list of " + T + " rows of equal, nonzero length");
  x.forEach((row) => row.forEach((e) => { if (typeof e !== "number" || !isFinite(e)) throw new Error(name + " must hold finite numbers"); }));
}

function run(spec) {
  const rule = spec.rule;
  if (!RULES.includes(rule)) throw new Error("rule: unknown rule " + rule + "; expected one of " + RULES.join(", "));
  const gated = rule === "gated" || rule === "gated_delta";
  const delta = rule === "delta" || rule === "gated_delta";
  const k = spec.k, v = spec.v;
  if (!Array.isArray(k) || k.length === 0) throw new Error("k must list at least one token");
  const T = k.length;
  checkMatrix("k", k, T); checkMatrix("v", v, T);
  // q: one row per token, or one row for every token.
  const q = Array.isArray(spec.q[0]) ? spec.q : k.map(() => spec.q);
  checkMatrix("q", q, T);
  const r = k[0].length, dv = v[0].length;
  if (q[0].length !== r) throw new Error("q and k must have the same feature width");
  const normalize = spec.normalize === undefined || spec.normalize === null ? !delta : !!spec.normalize;
  if (normalize && delta) throw new Error("normalize: rule " + rule + " defines no normalizer z");
  const eps = spec.eps === undefined ? 1e-6 : spec.eps, mode = spec.eps_mode || "add";
  if (!(eps >= 0)) throw new Error("eps must be >= 0");
  if (mode !== "add" && mode !== "clamp") throw new Error("eps_mode must be add or clamp");
  if (gated && (!Array.isArray(spec.alpha) || spec.alpha.length !== T || spec.alpha.some((a) => !(a >= 0 && a <= 1))))
    throw new Error("alpha: one gate per token, each in [0, 1]");
  if (delta && (!Array.isArray(spec.beta) || spec.beta.length !== T || spec.beta.some((b) => typeof b !== "number" || !isFinite(b))))
    throw new Error("beta: one write strength per token");
  let S = Array.from({ length: r }, () => new Array(dv).fill(0));
  let z = normalize ? new Array(r).fill(0) : null;
  const out = { S: [], z: normalize ? [] : null, y: [] };
  for (let t = 0; t < T; t++) {
    const kt = k[t], vt = v[t], qt = q[t];
    if (gated) {
      const a = spec.alpha[t];
      S = S.map((row) => row.map((x) => a * x));
      if (z) z = z.map((x) => a * x);
    }
    if (delta) {
      const u = [];  // read what the memory holds for k, then write only the error
      for (let j = 0; j < dv; j++) {
        let read = 0;
        for (let i = 0; i < r; i++) read += S[i][j] * kt[i];
        u.push(spec.beta[t] * (vt[j] - read));
      }
      S = S.map((row, i) => row.map((x, j) => x + kt[i] * u[j]));
    } else {
      S = S.map((row, i) => row.map((x, j) => x + kt[i] * vt[j]));
      if (z) z = z.map((x, i) => x + kt[i]);
    }
    const num = [];
    for (let j = 0; j < dv; j++) {
      let s = 0;
      for (let i = 0; i < r; i++) s += S[i][j] * qt[i];
      num.push(s);
    }
    let y = num;
    if (z) {
      let den = 0;
      for (let i = 0; i < r; i++) den += qt[i] * z[i];
      const d = mode === "add" ? den + eps : Math.max(den, eps);
      y = num.map((x) => x / d);
    }
    out.S.push(S.map((row) => row.slice()));
    if (z) out.z.push(z.slice());
    out.y.push(y);
  }
  return out;
}
