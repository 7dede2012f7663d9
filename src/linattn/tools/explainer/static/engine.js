/* The page's engine: the four update rules token by token, in JavaScript doubles (float64), write then read.
   window.linattnExplainer.run(spec) -> {S: [per token r x dv], z: [per token r] | null, y: [per token dv]}.
   A spec is checked field by field, as linattn.linear_attention checks its arguments: a bad one raises an Error
   whose message starts with the field's name. */
"use strict";
const RULES = ["accumulate", "gated", "delta", "gated_delta"];
const SPEC_FIELDS = ["rule", "q", "k", "v", "alpha", "beta", "normalize", "eps", "eps_mode", "initial_S", "initial_z"];
const show = (x) => { try { return JSON.stringify(x) === undefined ? String(x) : JSON.stringify(x); } catch (e) { return String(x); } };
function fail(field, what) { throw new Error(field + ": " + what); }
const finite = (x) => typeof x === "number" && Number.isFinite(x);

function checkMatrix(name, x, rows, cols) {
  if (x === undefined) fail(name, "missing; expected a list of rows of numbers");
  if (!Array.isArray(x) || x.length === 0 || !x.every(Array.isArray)) fail(name, "expected a nonempty list of rows (lists of numbers), got " + show(x));
  if (rows !== null && x.length !== rows) fail(name, "expected " + rows + " rows, got " + x.length);
  const width = cols === null ? x[0].length : cols;
  if (width === 0) fail(name, "rows must not be empty");
  x.forEach((row, i) => {
    if (row.length !== width) fail(name, "row " + i + " has " + row.length + " entries, expected " + width);
    row.forEach((e) => { if (!finite(e)) fail(name, "entries must be finite numbers, got " + show(e) + " in row " + i); });
  });
  return x;
}

function checkList(name, x, T, ok, what) {
  if (!Array.isArray(x) || x.length !== T) fail(name, "expected a list of " + T + " numbers (one per token), got " + show(x));
  x.forEach((e, i) => { if (!finite(e) || !ok(e)) fail(name, what + ", got " + show(e) + " at token " + i); });
  return x;
}

function checkSpec(spec) {
  if (spec === null || typeof spec !== "object" || Array.isArray(spec)) fail("spec", "expected an object, got " + show(spec));
  for (const key of Object.keys(spec)) if (!SPEC_FIELDS.includes(key)) fail(key, "unknown field; expected some of " + SPEC_FIELDS.join(", "));
  const rule = spec.rule === undefined ? "accumulate" : spec.rule;
  if (!RULES.includes(rule)) fail("rule", "unknown rule " + show(rule) + "; expected one of " + RULES.join(", "));
  const gated = rule === "gated" || rule === "gated_delta", delta = rule === "delta" || rule === "gated_delta";
  const k = checkMatrix("k", spec.k, null, null), T = k.length, r = k[0].length;
  const v = checkMatrix("v", spec.v, T, null), dv = v[0].length;
  if (spec.q === undefined) fail("q", "missing; expected one row of " + r + " numbers, or " + T + " such rows");
  // q: one row per token, or one row read by every token.
  const q = checkMatrix("q", Array.isArray(spec.q) && !Array.isArray(spec.q[0]) ? k.map(() => spec.q) : spec.q, T, r);
  if (spec.normalize !== undefined && spec.normalize !== null && typeof spec.normalize !== "boolean")
    fail("normalize", "must be true, false or null, got " + show(spec.normalize));
  const normalize = spec.normalize === undefined || spec.normalize === null ? !delta : spec.normalize;
  if (normalize && delta) fail("normalize", "rule " + rule + " defines no normalizer z");
  const eps = spec.eps === undefined ? 1e-6 : spec.eps;
  if (!finite(eps) || eps < 0) fail("eps", "must be a finite number >= 0, got " + show(spec.eps));
  const mode = spec.eps_mode === undefined ? "add" : spec.eps_mode;
  if (mode !== "add" && mode !== "clamp") fail("eps_mode", "must be \"add\" or \"clamp\", got " + show(spec.eps_mode));
  if (!gated && spec.alpha !== undefined) fail("alpha", "rule " + rule + " has no gate; use gated or gated_delta, or leave alpha out");
  if (!delta && spec.beta !== undefined) fail("beta", "rule " + rule + " has no write strength; use delta or gated_delta, or leave beta out");
  const alpha = gated ? checkList("alpha", spec.alpha, T, (a) => a >= 0 && a <= 1, "each gate must lie in [0, 1]") : null;
  const beta = delta ? checkList("beta", spec.beta, T, () => true, "each write strength must be a finite number") : null;
  const S0 = spec.initial_S === undefined ? null : checkMatrix("initial_S", spec.initial_S, r, dv);
  if (spec.initial_z !== undefined && !normalize) fail("initial_z", "given, but this run keeps no normalizer z");
  if (normalize && (spec.initial_S === undefined) !== (spec.initial_z === undefined))
    fail(spec.initial_z === undefined ? "initial_z" : "initial_S", "missing: a normalized initial state needs both initial_S and initial_z");
  const z0 = spec.initial_z === undefined ? null : checkMatrix("initial_z", [spec.initial_z], 1, r)[0];
  return { rule, gated, delta, q, k, v, T, r, dv, normalize, eps, mode, alpha, beta, S0, z0 };
}

function run(spec) {
  const c = checkSpec(spec);
  let S = c.S0 ? c.S0.map((row) => row.slice()) : Array.from({ length: c.r }, () => new Array(c.dv).fill(0));
  let z = c.normalize ? (c.z0 ? c.z0.slice() : new Array(c.r).fill(0)) : null;
  const out = { S: [], z: c.normalize ? [] : null, y: [] };
  for (let t = 0; t < c.T; t++) {
    const kt = c.k[t], vt = c.v[t], qt = c.q[t];
    if (c.gated) {
      const a = c.alpha[t];
      S = S.map((row) => row.map((x) => a * x));
      if (z) z = z.map((x) => a * x);
    }
    if (c.delta) {
      const u = [];  // read what the memory holds for k, then write only the error
      for (let j = 0; j < c.dv; j++) {
        let read = 0;
        for (let i = 0; i < c.r; i++) read += S[i][j] * kt[i];
        u.push(c.beta[t] * (vt[j] - read));
      }
      S = S.map((row, i) => row.map((x, j) => x + kt[i] * u[j]));
    } else {
      S = S.map((row, i) => row.map((x, j) => x + kt[i] * vt[j]));
      if (z) z = z.map((x, i) => x + kt[i]);
    }
    const num = [];
    for (let j = 0; j < c.dv; j++) {
      let s = 0;
      for (let i = 0; i < c.r; i++) s += S[i][j] * qt[i];
      num.push(s);
    }
    let y = num;
    if (z) {
      let den = 0;
      for (let i = 0; i < c.r; i++) den += qt[i] * z[i];
      const d = c.mode === "add" ? den + c.eps : Math.max(den, c.eps);
      y = num.map((x) => x / d);
    }
    out.S.push(S.map((row) => row.slice()));
    if (z) out.z.push(z.slice());
    out.y.push(y);
  }
  return out;
}
