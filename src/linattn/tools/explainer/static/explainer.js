/* Helpers for the scenes: DOM and SVG builders, one colour per symbol, motion, charts. Numbers of scripted scenes
   come from DATA (computed in Python, float64); what the learner edits is computed by run() from engine.js. */
const DATA = JSON.parse(document.getElementById("linattn-data").textContent);

// ------------------------------------------------------------------------------------------------ DOM
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [key, val] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), val);
    else if (val !== false && val !== null && val !== undefined) el.setAttribute(key, val === true ? "" : val);
  }
  for (const kid of kids.flat(Infinity)) if (kid !== null && kid !== undefined && kid !== false) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}
const SVGNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [key, val] of Object.entries(attrs || {})) if (val !== null && val !== undefined) el.setAttribute(key, val);
  for (const kid of kids.flat(Infinity)) if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}
function fmt(x, digits) {
  if (x === null || x === undefined) return "";
  if (Number.isInteger(x)) return Math.abs(x) >= 10000 ? x.toLocaleString("en-US") : String(x);
  if (x !== 0 && (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e6)) return x.toExponential(digits === undefined ? 3 : digits - 1).replace(/\.?0+e/, "e");
  return String(Number(x.toFixed(digits === undefined ? 4 : digits)));
}
const bytes = (n) => n.toLocaleString("en-US");
const vec = (x, d) => "[" + x.map((e) => fmt(e, d)).join(", ") + "]";
const mat = (m, d) => "[" + m.map((r) => vec(r, d)).join(", ") + "]";
const zeros = (r, c) => Array.from({ length: r }, () => new Array(c).fill(0));

// ------------------------------------------------------------------------------------------------ symbols
// One colour per symbol, in formulas, diagrams and legends alike (the CSS holds the same values).
const COLORS = { q: "#7b3fb5", k: "#1f6fb2", v: "#2e7d32", S: "#c2571a", z: "#9a6b00", gate: "#00838f", err: "#c62828", y: "#ad1457",
  A: "#455a64", other: "#5b6470" };
// φ(q) / φ(Q) / q̃ / Q̃ are the query; bare Q is not (the devices scene's segment offset is Q), nor is A in prose.
const SYMBOL = /(?<![A-Za-z0-9])φ\([qkQK][ₜᵢ₀-₉]*\)|α|(?<![A-Za-z0-9])(?:[qkQK]̃|[qkvKVSzey])(?![A-Za-z0-9(])/g;  // α: also in αS
const SYMCLASS = (t) => (t.startsWith("φ(q") || t.startsWith("φ(Q") || /^[qQ]/.test(t) ? "q" : t.startsWith("φ(k") || t.startsWith("φ(K") || /^[kK]/.test(t) ? "k"
  : /^[vV]/.test(t) ? "v" : t === "S" ? "S" : t === "z" ? "z" : t === "α" ? "gate" : t === "y" ? "y" : "err");
// Subscript words of the notation: S_prev -> S<sub>prev</sub> (never an underscore on screen).
const SUBWORD = /_(prev|next|state|in|out|c)(?![A-Za-z0-9])/g;
function fxPlain(el, text) {
  let last = 0;
  for (const m of text.matchAll(SYMBOL)) {
    if (m.index > last) el.append(text.slice(last, m.index));
    el.append(h("span", { class: "sym sym-" + SYMCLASS(m[0]) }, m[0]));
    last = m.index + m[0].length;
  }
  el.append(text.slice(last));
}
// Text with its symbols coloured and its notation typeset: "S = αS + φ(k)vᵀ" -> spans.
function fx(text, cls) {
  const el = h("span", { class: cls || null });
  let last = 0;
  for (const m of text.matchAll(SUBWORD)) {
    fxPlain(el, text.slice(last, m.index));
    el.append(h("sub", {}, m[1]));
    last = m.index + m[0].length;
  }
  fxPlain(el, text.slice(last));
  return el;
}
const formula = (...lines) => h("div", { class: "formula" }, lines.map((l) => h("div", {}, typeof l === "string" ? fx(l) : l)));

// ------------------------------------------------------------------------------------------------ motion
const reduced = () => window.matchMedia("(prefers-reduced-motion: reduce)").matches;
// While a control is being dragged the picture follows at once: nothing restarts its entrance.
let QUIET = false;
function quietly(fn) { return (...args) => { QUIET = true; try { return fn(...args); } finally { QUIET = false; } }; }
function anim(el, frames, opts) {
  if (reduced() || QUIET || !el || !el.animate) return null;
  return el.animate(frames, Object.assign({ duration: 500, easing: "ease-out", fill: "backwards" }, opts || {}));
}
const enter = (el, delay) => anim(el, [{ opacity: 0, transform: "translateY(10px)" }, { opacity: 1, transform: "none" }], { duration: 450, delay: delay || 0 });
const pulse = (el, color, delay) => anim(el, [{ backgroundColor: color, color: "#fff", transform: "scale(1.15)" }, {}], { duration: 650, delay: delay || 0 });
// A dot that carries a value along SVG waypoints (around other cards, never through them) and stays whole until it
// lands; then it is removed and arrive() runs: that is when the target shows its new value. Under reduced motion, or
// while a control is dragged, arrive() runs at once and nothing moves.
function flow(svg, points, color, delay, label, arrive) {
  if (reduced() || QUIET) { if (arrive) arrive(); return null; }
  const [x0, y0] = points[0];
  const g = s("g", { class: "flow" }, s("circle", { cx: x0, cy: y0, r: 8, fill: color }),
    label ? s("text", { x: x0, y: y0 - 12, "text-anchor": "middle", class: "num", style: "fill:" + color }, label) : null);
  svg.append(g);
  const frames = points.map(([x, y], i) => ({ transform: "translate(" + (x - x0) + "px," + (y - y0) + "px)", offset: i / (points.length - 1) }));
  const a = g.animate(frames, { duration: 420 * (points.length - 1), delay: delay || 0, easing: "ease-in-out", fill: "both" });
  a.onfinish = () => { g.remove(); if (arrive) arrive(); };
  a.oncancel = () => g.remove();
  return a;
}
// The same for HTML: a labelled dot from one element's centre to another's, inside a positioned container.
function travel(container, from, to, color, delay, label, arrive) {
  if (reduced() || QUIET || !from || !to) { if (arrive) arrive(); return null; }
  const box0 = container.getBoundingClientRect(), a0 = from.getBoundingClientRect(), b0 = to.getBoundingClientRect();
  const x = a0.left + a0.width / 2 - box0.left, y = a0.top + a0.height / 2 - box0.top;
  const dx = b0.left + b0.width / 2 - box0.left - x, dy = b0.top + b0.height / 2 - box0.top - y;
  const dot = h("span", { class: "traveller", style: "left:" + x + "px;top:" + y + "px;background:" + color }, label || "");
  container.append(dot);
  const a = dot.animate([{ transform: "translate(-50%,-50%)" }, { transform: "translate(calc(" + dx + "px - 50%),calc(" + dy + "px - 50%))" }],
    { duration: 650, delay: delay || 0, easing: "ease-in-out", fill: "both" });
  a.onfinish = () => { dot.remove(); if (arrive) arrive(); };
  a.oncancel = () => dot.remove();
  return a;
}
// An animation as a promise (resolved at once when nothing moves), so a scene can play its causal order in sequence.
const done = (a) => new Promise((res) => { if (!a) res(); else { a.onfinish = res; a.oncancel = res; } });
// Land a new value in a cell: the number changes now, and the cell flashes (no flash under reduced motion).
function land(cell, text, color) {
  cell.textContent = text;
  anim(cell, [{ backgroundColor: color, color: "#fff" }, {}], { duration: 500 });
}

// ------------------------------------------------------------------------------------------------ widgets
function grid(rows, opts) {
  opts = opts || {};
  const cols = rows[0].length;
  const g = h("div", { class: "grid" + (opts.sym ? " grid-" + opts.sym : ""), style: "grid-template-columns: repeat(" + (cols + (opts.rowHeads ? 1 : 0)) + ", auto)" });
  if (opts.colHeads) { if (opts.rowHeads) g.append(h("div", { class: "cell head" })); opts.colHeads.forEach((c) => g.append(h("div", { class: "cell head" }, c))); }
  rows.forEach((row, i) => {
    if (opts.rowHeads) g.append(h("div", { class: "cell head" }, opts.rowHeads[i]));
    row.forEach((x, j) => {
      const changed = opts.before && opts.before[i][j] !== x;
      const cell = h("div", { class: "cell" + (changed ? " changed" : "") + (x === "" ? " off" : ""), "data-i": i, "data-j": j }, typeof x === "number" ? fmt(x, opts.digits) : x);
      if (changed) pulse(cell, COLORS[opts.sym] || COLORS.S, 150);
      g.append(cell);
    });
  });
  return g;
}
// A titled card; runs of bar rows inside it share one grid, so their bars start at the same x.
function box(title, ...kids) {
  const out = [];
  for (const kid of kids.flat()) {
    if (kid && kid.classList && kid.classList.contains("barrow")) {
      if (!(out.length && out[out.length - 1].classList && out[out.length - 1].classList.contains("bars"))) out.push(h("div", { class: "bars" }));
      out[out.length - 1].append(kid);
    } else out.push(kid);
  }
  return h("div", { class: "box" }, h("h3", {}, typeof title === "string" ? fx(title) : title), ...out);
}
function barRow(label, value, max, color, id) {
  const bar = h("span", { class: "bar", id: id || null, style: "width:" + Math.max(0.5, 100 * Math.abs(value) / max).toFixed(1) + "%;background:" + (color || COLORS.k) });
  anim(bar, [{ transform: "scaleX(0)" }, { transform: "scaleX(1)" }], { duration: 550 });
  return h("div", { class: "barrow" }, h("span", { class: "barlabel" }, label), h("span", { class: "bartrack" }, bar), h("span", { class: "barval" }, fmt(value, 3)));
}
const scroll = (el) => h("div", { class: "scroll" }, el);
// A table; on a narrow screen (CSS) each row becomes a list of "column: value" lines (data-label).
function table(head, rows, opts) {
  const label = (x) => (x instanceof Node ? (x.dataset && x.dataset.label) || x.textContent : String(x));
  return scroll(h("table", { class: "data kv" + (opts && opts.text ? " text" : "") + (opts && opts.compact ? " compact" : ""), id: (opts && opts.id) || null }, h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.map((r) => h("tr", { class: r.on ? "on" : null }, (r.cells || r).map((c, i) => h("td", { "data-label": label(head[i] || "") }, c instanceof Node ? c : typeof c === "number" ? fmt(c) : c)))))));
}
// A line chart that scales with its box (viewBox); each series' legend entry is drawn in the series' colour.
// Its width is the space it gets (read when drawn; the player redraws on resize), so 14 px text stays 14 px on a phone.
const visualWidth = () => { const v = document.querySelector("#stage .visual"); return v && v.clientWidth ? v.clientWidth : 720; };
function lineChart(series, opts) {
  const W = opts.width || Math.round(Math.min(720, Math.max(300, visualWidth() - 4))), narrow = W < 560;
  const cols = !narrow && series.every((p) => p.label.length <= 20) ? 2 : 1;  // long legend labels get a row each
  // The left margin fits the longest y tick label (about 8.5 px a character at 14 px) beside the rotated axis title.
  const tickChars = Math.max(1, ...(opts.yticks || []).map((y) => fmt(y, 3).length));
  const H = opts.height || (narrow ? 250 : 330) + (cols === 1 ? 24 * series.length - 40 : 0), L = Math.max(narrow ? 56 : 84, 34 + 8.5 * tickChars), R = 20, top = 16 + 24 * Math.ceil(series.length / cols), bottom = 44;
  const xs = series.flatMap((p) => p.points.map((q) => q[0])), ys = series.flatMap((p) => p.points.map((q) => q[1]));
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = opts.ymin !== undefined ? opts.ymin : Math.min(opts.logy ? Infinity : 0, ...ys), y1 = opts.ymax !== undefined ? opts.ymax : Math.max(...ys);
  // logy: a log10 axis, so that a flat line far below a growing one stays visible; out-of-range points are clamped.
  // symlog: sign(y) log10(1 + |y|), for values of both signs that grow by factors (nothing is cut off).
  const ty = (y) => (opts.logy ? Math.log10(y) : opts.symlog ? Math.sign(y) * Math.log10(1 + Math.abs(y)) : y), Y0 = ty(y0), Y1 = ty(y1);
  const X = (x) => L + (W - L - R) * (x - x0) / (x1 - x0 || 1), Y = (y) => H - bottom - (H - bottom - top) * (Math.min(Y1, Math.max(Y0, ty(y))) - Y0) / (Y1 - Y0 || 1);
  const svg = s("svg", { viewBox: "0 0 " + W + " " + H, class: "chart", role: "img" });
  svg.append(s("line", { class: "axis", x1: L, y1: H - bottom, x2: W - R, y2: H - bottom }), s("line", { class: "axis", x1: L, y1: top, x2: L, y2: H - bottom }));
  svg.append(s("text", { x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle" }, opts.xlabel || ""));
  svg.append(s("text", { x: 12, y: (top + H - bottom) / 2, "text-anchor": "middle", transform: "rotate(-90 12 " + (top + H - bottom) / 2 + ")" }, opts.ylabel || ""));
  const xt = opts.xticks || [x0, x1], yt = opts.yticks || [y0, y1];
  xt.forEach((x) => svg.append(s("text", { x: X(x), y: H - bottom + 18, "text-anchor": "middle" }, fmt(x, 3))));
  yt.forEach((y) => svg.append(s("text", { x: L - 6, y: Y(y) + 4, "text-anchor": "end" }, fmt(y, 3)), s("line", { class: "gridline", x1: L, x2: W - R, y1: Y(y), y2: Y(y) })));
  series.forEach((ser, n) => {
    const d = ser.points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    const path = s("path", { d, fill: "none", stroke: ser.color, "stroke-width": 3, "stroke-dasharray": ser.dash || null, "data-series": n });
    svg.append(path);
    if (ser.dots) ser.points.forEach((p) => { if (p[1] >= y0 && p[1] <= y1) svg.append(s("circle", { cx: X(p[0]), cy: Y(p[1]), r: 4, fill: ser.color })); });
    anim(path, [{ opacity: 0 }, { opacity: 1 }], { duration: 500, delay: 120 * n });
    const lx = (narrow ? 8 : L + 10) + (n % cols) * (W - L - R) / 2, ly = 18 + 24 * Math.floor(n / cols);
    svg.append(s("line", { x1: lx, x2: lx + 26, y1: ly - 4, y2: ly - 4, stroke: ser.color, "stroke-width": 3, "stroke-dasharray": ser.dash || null }),
      s("text", { x: lx + 32, y: ly, "data-legend": n, style: "fill:" + ser.color, class: "legend" }, ser.label));
  });
  (opts.marks || []).forEach((m) => {
    svg.append(s("line", { x1: X(m.x), x2: X(m.x), y1: top, y2: H - bottom, stroke: COLORS.other, "stroke-dasharray": "4 3" }),
      X(m.x) > 0.7 * W ? s("text", { x: X(m.x) - 4, y: top + 14 + (m.row || 0) * 16, "text-anchor": "end" }, m.label) : s("text", { x: X(m.x) + 4, y: top + 14 + (m.row || 0) * 16 }, m.label));
  });
  return svg;
}
// A learner's answer: an integer, a decimal or a fraction such as 17/6, typed on any keyboard. NFKC folds full-width
// digits and slashes from a Chinese IME ("１７／６") into ASCII. Returns { value, exact, sig, decimals } or null.
function parseAnswer(text) {
  const t = String(text).normalize("NFKC").trim().replace(/[−–—]/g, "-").replace(/[。.,，、;；]+$/, "").replace(/\s+/g, "");
  const frac = /^(-?\d+)\/(-?\d+)$/.exec(t);
  if (frac) return Number(frac[2]) === 0 ? null : { value: Number(frac[1]) / Number(frac[2]), num: Number(frac[1]), den: Number(frac[2]), exact: true };
  const dec = /^-?(\d*)(?:\.(\d*))?$/.exec(t);
  if (!dec || !(dec[1] + (dec[2] || "")).length) return null;
  const digits = (dec[1] + (dec[2] || "")).replace(/^0+/, "");
  return { value: Number(t), exact: !dec[2], sig: digits.length, decimals: (dec[2] || "").length };
}
// Right when it is the number: a fraction equal to want's (cross-multiplied), an exact match, or a decimal that agrees
// with want to every digit typed (rounded or cut off), with at least 4 significant digits: 2.8333 is 17/6, 6.7 is not
// 74/11. want: { value, num, den }.
function matches(got, want) {
  if (!got || !Number.isFinite(got.value)) return false;
  if (got.num !== undefined && want.den) return got.num * want.den === want.num * got.den;
  if (Math.abs(got.value - want.value) <= 1e-12 * Math.max(1, Math.abs(want.value))) return true;
  return got.sig >= 4 && agrees(got, want);
}
// The typed decimal is want rounded, or cut off, to the digits typed.
function agrees(got, want) {
  const unit = Math.pow(10, -got.decimals), tiny = 1e-9 * unit;
  return Math.abs(got.value - want.value) <= unit / 2 + tiny || Math.abs(got.value - Math.trunc(want.value / unit) * unit) <= tiny;
}
// Close but too short: the digits typed agree with want, only too few of them.
const tooShort = (got, want) => got && got.num === undefined && got.sig < 4 && agrees(got, want);
// ------------------------------------------------------------------------------------------------ words
const T = (en, zh) => ({ en, zh });
let LANG = "en";
const tr = (x) => (typeof x === "string" ? x : x[LANG]);
const UI = {
  show: T("Show worked solution", "展开参考解答"), check: T("Check", "检查"), right: T("Correct.", "正确。"),
  wrong: T("Not yet: compare with the worked solution.", "还不对：对照参考解答再算一遍。"), blank: T("Enter a number (a fraction such as 17/6 works).", "请输入一个数（也可以写分数，如 17/6）。"),
  short: T("Close, but give the exact fraction or at least 4 significant digits: several answers round to that.", "接近了，但请写出精确分数，或至少 4 位有效数字：好几个答案都会四舍五入成这个数。"),
  lab: T("Download lab.py (NumPy only)", "下载 lab.py（只需 NumPy）"), token: T("token", "词元"), num: T("numerator", "分子"),
  den: T("denominator", "分母"), out: T("output", "输出"), exact: T("exact", "精确值"), chunk: T("chunk size", "块大小"),
  read: T("read from the carried state", "从携带的状态读出"), own: T("own chunk (masked)", "块内部分（带掩码）"),
  handed: T("state handed on", "传给下一块的状态"), source: T("source: ", "来源："), prev: T("previous step", "上一步"),
  next: T("next step", "下一步"), timeline: T("timeline", "时间轴"), state: T("state", "状态"), write: T("write", "写入"),
};
const ui = (key) => tr(UI[key]);
// Replace an element's children, skipping the null / false that optional parts leave.
function put(el, ...kids) { el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false)); return el; }
