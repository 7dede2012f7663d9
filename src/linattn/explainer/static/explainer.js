/* The slide player and its scenes. Numbers of scripted scenes come from DATA (computed in Python, float64);
   what the learner edits is computed by run() from engine.js. */
const DATA = JSON.parse(document.getElementById("linattn-data").textContent);

// ------------------------------------------------------------------------------------------------ helpers
function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [key, val] of Object.entries(attrs || {})) {
    if (key === "html") el.innerHTML = val;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), val);
    else if (val !== false && val !== null && val !== undefined) el.setAttribute(key, val === true ? "" : val);
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}
const SVGNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...kids) {
  const el = document.createElementNS(SVGNS, tag);
  for (const [key, val] of Object.entries(attrs || {})) el.setAttribute(key, val);
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
  return el;
}
function fmt(x, digits) {
  if (x === null || x === undefined) return "";
  if (Number.isInteger(x)) return Math.abs(x) >= 10000 ? x.toLocaleString("en-US") : String(x);
  if (Math.abs(x) < 1e-3 || Math.abs(x) >= 1e6) return x.toExponential(digits === undefined ? 3 : digits - 1).replace(/\.?0+e/, "e");
  return String(Number(x.toFixed(digits === undefined ? 4 : digits)));
}
const bytes = (n) => n.toLocaleString("en-US");
function grid(rows, opts) {
  opts = opts || {};
  const cols = rows[0].length;
  const g = h("div", { class: "grid", style: "grid-template-columns: repeat(" + (cols + (opts.rowHeads ? 1 : 0)) + ", auto)" });
  if (opts.colHeads) { if (opts.rowHeads) g.append(h("div", { class: "cell head" })); opts.colHeads.forEach((c) => g.append(h("div", { class: "cell head" }, c))); }
  rows.forEach((row, i) => {
    if (opts.rowHeads) g.append(h("div", { class: "cell head" }, opts.rowHeads[i]));
    row.forEach((x, j) => {
      const changed = opts.before && opts.before[i][j] !== x;
      g.append(h("div", { class: "cell" + (changed ? " changed" : ""), "data-i": i, "data-j": j }, typeof x === "number" ? fmt(x) : x));
    });
  });
  return g;
}
function box(title, ...kids) { return h("div", { class: "box" }, h("h3", {}, title), ...kids); }
function barRow(label, value, max, cls) {
  return h("div", {}, h("span", { style: "display:inline-block;width:7em" }, label),
    h("span", { class: "bar " + (cls || ""), style: "width:" + Math.max(1, 260 * value / max).toFixed(1) + "px" }), " ", fmt(value, 3));
}
function lineChart(series, opts) {
  const W = opts.width || 560, H = opts.height || 220, pad = 58;
  const xs = series.flatMap((p) => p.points.map((q) => q[0])), ys = series.flatMap((p) => p.points.map((q) => q[1]));
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys);
  const X = (x) => pad + (W - 2 * pad) * (x - x0) / (x1 - x0 || 1), Y = (y) => H - pad + (2 * pad - H) * (y - y0) / (y1 - y0 || 1);
  const svg = s("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img" });
  svg.append(s("line", { class: "axis", x1: pad, y1: H - pad, x2: W - pad, y2: H - pad }), s("line", { class: "axis", x1: pad, y1: pad / 2, x2: pad, y2: H - pad }));
  svg.append(s("text", { x: W / 2, y: H - 8, "text-anchor": "middle" }, opts.xlabel || ""), s("text", { x: 4, y: 14 }, opts.ylabel || ""));
  svg.append(s("text", { x: X(x0), y: H - pad + 16, "text-anchor": "middle" }, fmt(x0, 3)), s("text", { x: X(x1), y: H - pad + 16, "text-anchor": "middle" }, fmt(x1, 3)));
  svg.append(s("text", { x: pad - 4, y: Y(y1) + 4, "text-anchor": "end" }, fmt(y1, 3)), s("text", { x: pad - 4, y: Y(y0) + 4, "text-anchor": "end" }, fmt(y0, 3)));
  series.forEach((ser, n) => {
    const d = ser.points.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + " " + Y(p[1]).toFixed(1)).join(" ");
    svg.append(s("path", { d, fill: "none", stroke: ser.color, "stroke-width": 2.5, "stroke-dasharray": ser.dash || "" }));
    svg.append(s("text", { x: W - 4, y: 14 + 15 * n, "text-anchor": "end", fill: ser.color }, "— " + ser.label));
  });
  (opts.marks || []).forEach((m) => svg.append(s("line", { x1: X(m), x2: X(m), y1: pad / 2, y2: H - pad, stroke: "#c2571a", "stroke-dasharray": "4 3" })));
  return svg;
}
const vec = (x) => "[" + x.map((e) => fmt(e)).join(", ") + "]";
const zeros = (r, c) => Array.from({ length: r }, () => new Array(c).fill(0));

// ------------------------------------------------------------------------------------------------ words
const UI = {
  en: { step: "step", of: "of", show: "Show answer", hide: "Hide answer", lab: "Download lab.py (NumPy only)",
    token: "token", num: "numerator", den: "denominator", out: "output", exact: "exact", chunk: "chunk size",
    read: "read from the carried state", own: "own chunk (masked)", handed: "state handed on" },
  zh: { step: "第", of: "/", show: "显示答案", hide: "隐藏答案", lab: "下载 lab.py（只需 NumPy）",
    token: "词元", num: "分子", den: "分母", out: "输出", exact: "精确值", chunk: "块大小",
    read: "从携带的状态读出", own: "块内部分（带掩码）", handed: "传给下一块的状态" },
};
const T = (en, zh) => ({ en, zh });
let LANG = "en";
const tr = (x) => (typeof x === "string" ? x : x[LANG]);
const ui = (key) => UI[LANG][key];
