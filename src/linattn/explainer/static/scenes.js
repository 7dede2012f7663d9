// ------------------------------------------------------------------------------------------------ scenes
const SCENES = [];
const scene = (def) => SCENES.push(def);

scene({ id: "intro", title: T("Linear attention, step by step", "线性注意力，一步一步"),
  text: [T("Softmax attention keeps every past key and value and rereads all of them for each new token. Linear attention folds the history into a fixed-size state S (and a normalizer z) as the tokens arrive, and reads it back with one query. Step through with → and ←, drag the timeline, or open a link such as #step=12. Every number in the scripted scenes was computed in float64 by linattn's reference when this page was built.",
    "Softmax 注意力保存所有过去的键和值，每来一个新词元都要把它们全部重读一遍。线性注意力在词元到来时把历史折叠进一个固定大小的状态 S（以及归一化向量 z），再用一个查询把它读出来。用 → 和 ← 翻页，拖动时间轴，或打开 #step=12 这样的链接。脚本场景里的每个数字都是构建本页时由 linattn 的 float64 参考实现算出的。")],
  build(root) {
    const svg = s("svg", { width: 560, height: 120, role: "img" });
    ["k₁v₁", "k₂v₂", "k₃v₃", "…"].forEach((t, i) => {
      svg.append(s("rect", { x: 10 + 62 * i, y: 40, width: 54, height: 36, rx: 6, fill: "#e7f0fa", stroke: "#1f6fb2" }), s("text", { x: 37 + 62 * i, y: 63, "text-anchor": "middle" }, t));
    });
    svg.append(s("path", { d: "M262 58 L330 58", stroke: "#1d232b", "stroke-width": 2 }), s("text", { x: 296, y: 50, "text-anchor": "middle" }, "write"));
    svg.append(s("rect", { x: 335, y: 22, width: 90, height: 72, rx: 8, fill: "#ffd98a", stroke: "#c2571a" }), s("text", { x: 380, y: 55, "text-anchor": "middle" }, "S (r × dv)"), s("text", { x: 380, y: 75, "text-anchor": "middle" }, "z (r)"));
    svg.append(s("path", { d: "M428 58 L490 58", stroke: "#1d232b", "stroke-width": 2 }), s("text", { x: 460, y: 50, "text-anchor": "middle" }, "read q"), s("text", { x: 520, y: 63, "text-anchor": "middle" }, "y"));
    const lab = h("a", { id: "lab-download", download: "lab.py", href: "data:text/x-python;charset=utf-8;base64," + DATA.lab_b64 }, ui("lab"));
    root.append(svg, h("p", {}, lab, h("span", { class: "muted" }, "  python3 lab.py --seed 7")));
    return () => {};
  } });

scene({ id: "softmax", title: T("Softmax attention rereads the whole history", "Softmax 注意力每次重读整个历史"),
  text: [T("A new query q scores every cached key: weight_i = exp(q·k_i/√d) / Σ_j exp(q·k_j/√d). The bars are those weights for five cached 2-d keys.",
      "新的查询 q 给缓存中的每个键打分：weight_i = exp(q·k_i/√d) / Σ_j exp(q·k_j/√d)。条形表示五个缓存的二维键的权重。"),
    T("Change the query and every weight changes: nothing can be summed in advance, because the query sits inside the exponential of every term.",
      "换一个查询，所有权重都会变：因为查询在每一项的指数里，没有任何东西能提前求和。"),
    T("So each decode step reads all n cached keys and values: memory and work grow with the history (blue), while a fixed state stays flat (orange).",
      "所以每个解码步都要读取全部 n 个缓存的键和值：内存和计算随历史增长（蓝色），而固定状态保持不变（橙色）。")],
  build(root) {
    const d = DATA.softmax, view = h("div", { class: "row" });
    root.append(view);
    return (sub) => {
      view.replaceChildren();
      if (sub === 0) {
        const qd = d.queries[0], max = Math.max(...qd.weights);
        view.append(box("q = " + vec(qd.q), ...qd.weights.map((w, i) => barRow("k" + (i + 1) + " " + vec(d.keys[i]), w, max))),
          box(ui("out"), h("div", { class: "big" }, "y = Σ wᵢ vᵢ = " + fmt(qd.y, 4)), h("div", { class: "muted" }, "v = " + vec(d.values))));
      } else if (sub === 1) {
        // Turn the query: every weight changes (computed here, in the page, from the same keys).
        const angle = h("input", { type: "range", id: "softmax-angle", min: 0, max: 360, step: 5, value: 90 });
        const bars = h("div", {});
        const draw = () => {
          const th = Number(angle.value) * Math.PI / 180, q = [1.5 * Math.cos(th), 1.5 * Math.sin(th)];
          const logits = d.keys.map((k) => (q[0] * k[0] + q[1] * k[1]) / Math.SQRT2), top = Math.max(...logits);
          const e = logits.map((l) => Math.exp(l - top)), sum = e.reduce((a, b) => a + b, 0), w = e.map((x) => x / sum);
          bars.replaceChildren(box("q = " + vec(q.map((x) => Number(x.toFixed(2)))), ...w.map((x, i) => barRow("k" + (i + 1) + " " + vec(d.keys[i]), x, 1))),
            box(ui("out"), h("div", { class: "big" }, "y = " + fmt(w.reduce((a, x, i) => a + x * d.values[i], 0), 4))));
        };
        angle.addEventListener("input", draw);
        view.append(h("label", {}, "q ∠ ", angle), bars);
        draw();
      } else {
        const pts = d.cost.map((c) => [c.n, c.kv_floats]), flat = d.cost.map((c) => [c.n, c.state_floats]);
        view.append(lineChart([{ points: pts, color: "#1f6fb2", label: tr(T("KV cache: 2·n·d", "KV 缓存：2·n·d")) }, { points: flat, color: "#c2571a", label: tr(T("state: r·dv + r", "状态：r·dv + r")) }],
          { xlabel: tr(T("n (history)", "n（历史长度）")), ylabel: tr(T("numbers kept / read per step", "每步保存 / 读取的数")) }));
      }
    };
  } });

scene({ id: "rewrite", title: T("The rewrite: a feature map, then pull the query out", "改写：特征映射，然后把查询提出求和号"),
  text: [T("Replace exp(q·k) by φ(q)ᵀφ(k) with a nonnegative feature map φ, such as elu(x)+1 or relu(x)+1 (plotted). Nonnegative features keep every weight ≥ 0 and the denominator positive.",
      "把 exp(q·k) 换成 φ(q)ᵀφ(k)，φ 是非负的特征映射，例如 elu(x)+1 或 relu(x)+1（见图）。非负特征保证每个权重 ≥ 0，分母为正。"),
    T("Now φ(q) does not depend on i and leaves both sums: y = φ(q)ᵀ[Σ φ(kᵢ)vᵢᵀ] / φ(q)ᵀ[Σ φ(kᵢ)]. The reordering is exact for this kernelized attention, but it is a different model from softmax: for the same q and keys the weights differ (elu+1 kernel vs softmax below).",
      "现在 φ(q) 与 i 无关，可以提到两个求和号外面：y = φ(q)ᵀ[Σ φ(kᵢ)vᵢᵀ] / φ(q)ᵀ[Σ φ(kᵢ)]。对这种核化注意力，重排是精确的；但它和 softmax 是不同的模型：同样的 q 和键，权重并不相同（下面是 elu+1 核与 softmax 的对比）。")],
  build(root) {
    const d = DATA.rewrite, view = h("div", {});
    root.append(view);
    return (sub) => {
      view.replaceChildren();
      if (sub === 0) {
        view.append(h("div", { class: "formula" }, "y = Σᵢ φ(q)ᵀφ(kᵢ) vᵢ / Σᵢ φ(q)ᵀφ(kᵢ)"),
          lineChart([{ points: d.x.map((x, i) => [x, d.elu1[i]]), color: "#1f6fb2", label: "elu(x)+1" },
            { points: d.x.map((x, i) => [x, d.relu1[i]]), color: "#c2571a", label: "relu(x)+1", dash: "6 4" }], { xlabel: "x", ylabel: "φ(x)" }));
      } else {
        const max = Math.max(...d.kernel_weights, ...d.softmax_weights);
        view.append(h("div", { class: "formula" }, "y = φ(q)ᵀ S / φ(q)ᵀ z,   S = Σᵢ φ(kᵢ) vᵢᵀ,   z = Σᵢ φ(kᵢ)"),
          h("div", { class: "row" }, box("elu+1 kernel", ...d.kernel_weights.map((w, i) => barRow("k" + (i + 1), w, max))),
            box("softmax", ...d.softmax_weights.map((w, i) => barRow("k" + (i + 1), w, max, "warm")))));
      }
    };
  } });

scene({ id: "matrix", title: T("The state is a matrix", "状态是一个矩阵"),
  text: [T("With 2-d keys and 2-d values each token contributes an outer product φ(k)vᵀ: a 2×2 matrix, one row per feature, one column per value channel.",
      "键和值都是二维时，每个词元贡献一个外积 φ(k)vᵀ：2×2 矩阵，每个特征一行，每个值通道一列。"),
    T("S is the sum of those outer products and z the sum of the features. One query reads both: numerator φ(q)ᵀS (a vector), denominator φ(q)ᵀz (a number).",
      "S 是这些外积之和，z 是特征之和。一个查询同时读取二者：分子 φ(q)ᵀS（向量），分母 φ(q)ᵀz（一个数）。")],
  build(root) {
    const d = DATA.matrix, view = h("div", { class: "row" });
    root.append(view);
    return (sub) => {
      view.replaceChildren();
      if (sub === 0) d.outers.forEach((o, t) => view.append(box("φ(k" + (t + 1) + ")=" + vec(d.keys[t]) + " · v" + (t + 1) + "ᵀ=" + vec(d.values[t]), grid(o))));
      else view.append(box("S", grid(d.S)), box("z", grid([d.z])), box("φ(q) = " + vec(d.query),
        h("div", {}, ui("num") + " φ(q)ᵀS = " + vec(d.num)), h("div", {}, ui("den") + " φ(q)ᵀz = " + fmt(d.den)),
        h("div", { class: "big" }, "y = [17/6, 10/3] = " + vec(d.y))));
    };
  } });

scene({ id: "tokens", title: T("One token at a time", "一次一个词元"),
  text: [T("The running example: φ(k) = [1,0], [0,1], [1,1] with values 2, 4, 3. S (2×1) and z (2) start at zero.",
      "贯穿全文的例子：φ(k) = [1,0]、[0,1]、[1,1]，值为 2、4、3。S（2×1）和 z（2）从零开始。"),
    T("Token 1 writes φ(k)vᵀ = [2, 0] into S and φ(k) = [1, 0] into z. Highlighted cells changed.", "词元 1 把 φ(k)vᵀ = [2, 0] 写入 S，把 φ(k) = [1, 0] 写入 z。高亮的格子发生了变化。"),
    T("Token 2 writes [0, 4] and [0, 1]. The old history is not kept anywhere else: only these four numbers.", "词元 2 写入 [0, 4] 和 [0, 1]。旧的历史不再另外保存：只剩这四个数。"),
    T("Token 3, φ(k) = [1,1], touches every cell: S = [5, 7], z = [2, 2].", "词元 3 的 φ(k) = [1,1] 改动了每个格子：S = [5, 7]，z = [2, 2]。"),
    T("The query φ(q) = [2, 1] reads: numerator 2·5 + 1·7 = 17, denominator 2·2 + 1·2 = 6, y = 17/6 — the same as weighting 2, 4, 3 by φ(q)ᵀφ(kᵢ) = 2, 1, 3.",
      "查询 φ(q) = [2, 1] 读取：分子 2·5 + 1·7 = 17，分母 2·2 + 1·2 = 6，y = 17/6——与用 φ(q)ᵀφ(kᵢ) = 2、1、3 对 2、4、3 加权完全相同。")],
  build(root) {
    const d = DATA.tokens, view = h("div", {});
    root.append(view);
    return (sub) => {
      const t = Math.min(sub, 3);
      const S = t ? d.S[t - 1] : zeros(2, 1), z = t ? d.z[t - 1] : [0, 0];
      const S0 = t > 1 ? d.S[t - 2] : zeros(2, 1), z0 = t > 1 ? d.z[t - 2] : [0, 0];
      const toks = d.keys.map((k, i) => h("span", { class: "token" + (i === t - 1 ? " active" : "") }, ui("token") + " " + (i + 1) + ": φ(k)=" + vec(k) + ", v=" + d.values[i]));
      const row = h("div", { class: "row" }, box("S", grid(S, { before: sub <= 3 && t ? S0 : null, rowHeads: ["φ₁", "φ₂"] })), box("z", grid(z.map((x) => [x]), { before: sub <= 3 && t ? z0.map((x) => [x]) : null })));
      if (sub >= 1 && sub <= 3) {
        const k = d.keys[t - 1], v = d.values[t - 1];
        row.append(box("+ φ(k" + t + ")v" + t + "ᵀ", grid(k.map((x) => [x * v]))), box("+ φ(k" + t + ")", grid(k.map((x) => [x]))));
      }
      if (sub === 4) row.append(box("φ(q) = " + vec(d.query), h("div", {}, ui("num") + " = " + fmt(d.num)), h("div", {}, ui("den") + " = " + fmt(d.den)),
        h("div", { class: "big" }, "y = 17/6 ≈ " + fmt(d.y_final, 4))));
      view.replaceChildren(h("div", {}, toks), row);
    };
  } });

scene({ id: "whyz", title: T("Why z", "为什么需要 z"),
  text: [T("Write one pair (φ(k) = [1,1], v = 3) m times and read with φ(q) = [2,1]. With z the output stays 3 whatever m: numerator and denominator both grow m-fold. Without z the output is m·(φ(q)ᵀφ(k))·v = 9m and grows with the history. Drag m.",
    "把同一对 (φ(k) = [1,1], v = 3) 写入 m 次，再用 φ(q) = [2,1] 读取。有 z 时无论 m 多大输出都是 3：分子和分母同样增长 m 倍。没有 z 时输出为 m·(φ(q)ᵀφ(k))·v = 9m，随历史增长。拖动 m 试试。")],
  build(root) {
    const d = DATA.whyz, out = h("div", {});
    const slider = h("input", { type: "range", id: "whyz-m", min: 1, max: d.rows.length, value: 3, oninput: () => draw() });
    root.append(h("label", {}, "m = ", slider), out);
    const draw = () => {
      const m = Number(slider.value), max = d.rows[d.rows.length - 1].unnormalized;
      const row = d.rows[m - 1];
      out.replaceChildren(h("div", { class: "row" }, box("m = " + m, barRow(tr(T("with z", "有 z")), row.normalized, max), barRow(tr(T("without z", "无 z")), row.unnormalized, max, "warm"))));
    };
    return draw;
  } });

scene({ id: "eps", title: T("ε: add or clamp", "ε：相加还是截断"),
  text: [T("Dividing by a denominator near zero needs a guard ε. linattn offers two: 'add' divides by den + ε, 'clamp' by max(den, ε). One token with feature d and value 3, read by q = 1: the exact answer is 3 for every d > 0. With ε = 1e-6, 'add' is already off at d = 1e-5, 'clamp' only once d < ε. They are different functions; pick one and use it in every form.",
    "分母接近零时需要一个保护量 ε。linattn 提供两种：'add' 除以 den + ε，'clamp' 除以 max(den, ε)。一个词元，特征为 d、值为 3，用 q = 1 读取：对任何 d > 0 精确答案都是 3。取 ε = 1e-6 时，'add' 在 d = 1e-5 已经偏离，'clamp' 只在 d < ε 时才偏离。它们是不同的函数；选定一个，并在每种计算形式中一致使用。")],
  build(root) {
    const d = DATA.eps, table = h("div", {});
    // The scripted table (ε = 1e-6) comes from the reference; another ε is recomputed by the page's engine.
    const read = (den, eps, mode) => run({ rule: "accumulate", q: [1], k: [[den]], v: [[d.value]], eps, eps_mode: mode }).y[0][0];
    const draw = (eps) => {
      const rows = d.rows.map((r) => eps === d.eps ? r : { den: r.den, add: read(r.den, eps, "add"), clamp: read(r.den, eps, "clamp") });
      table.replaceChildren(h("table", { class: "data", id: "eps-table" }, h("tr", {}, h("th", {}, "den = q·z"), h("th", {}, "add"), h("th", {}, "clamp"), h("th", {}, ui("exact"))),
        rows.map((r) => h("tr", {}, h("td", {}, fmt(r.den)), h("td", {}, fmt(r.add, 6)), h("td", {}, fmt(r.clamp, 6)), h("td", {}, fmt(d.value))))));
    };
    const choice = h("select", { id: "eps-choice", onchange: (e) => draw(Number(e.target.value)) },
      [1e-3, d.eps, 1e-9, 1e-12].map((x) => h("option", { value: x, selected: x === d.eps }, fmt(x))));
    root.append(h("label", { class: "formula" }, "ε = ", choice), table);
    draw(d.eps);
    return () => {};
  } });

scene({ id: "memory", title: T("Dimensions and memory", "维度与内存"),
  text: [T("The state costs B·L·H·(r·dv + r)·b bytes whatever the history length; a KV cache costs B·L·H_kv·2·T·d·b and grows with T. Edit the fields: the page uses the same formulas as linattn.memory.",
      "状态占用 B·L·H·(r·dv + r)·b 字节，与历史长度无关；KV 缓存占用 B·L·H_kv·2·T·d·b，随 T 增长。可以修改下面的数值：页面使用与 linattn.memory 相同的公式。"),
    T("Per head, the crossover is the smallest T whose KV cache holds at least the state's bytes. A fixed state can be larger than a short cache; a storage crossover is not a speed crossover.",
      "按每个头计算，交叉点是 KV 缓存字节数不少于状态字节数的最小 T。固定状态可能比短缓存更大；存储上的交叉点不等于速度上的交叉点。")],
  build(root) {
    const d = DATA.memory, inp = Object.assign({}, d.inputs), out = h("div", {});
    const field = (key) => h("label", {}, key + " ", h("input", { type: "number", min: 1, value: inp[key], id: "mem-" + key, oninput: (e) => { inp[key] = Math.max(1, Math.floor(Number(e.target.value)) || 1); draw(); } }));
    const dsel = (key) => h("label", {}, key + " ", h("select", { id: "mem-" + key, onchange: (e) => { inp[key] = e.target.value; draw(); } },
      Object.keys(d.dtype_bytes).map((n) => h("option", { value: n, selected: n === inp[key] }, n))));
    root.append(h("div", {}, ["B", "L", "H", "r", "dv"].map(field), dsel("state_dtype")), h("div", {}, ["kv_heads", "head_dim"].map(field), dsel("kv_dtype")), out);
    let sub = 0;
    const draw = () => {
      // BigInt: exact integers past 2^53, like linattn.memory's Python ints.
      const N = (key) => BigInt(inp[key]), b = BigInt(d.dtype_bytes[inp.state_dtype]), kb = BigInt(d.dtype_bytes[inp.kv_dtype]);
      const perHead = (N("r") * N("dv") + N("r")) * b, kvTok = 2n * N("head_dim") * kb;
      const total = N("B") * N("L") * N("H") * perHead;
      const cross = (perHead + kvTok - 1n) / kvTok;
      const res = h("div", { class: "row" }, box(tr(T("state", "状态")), h("div", { class: "big", id: "mem-state" }, bytes(total) + " bytes")),
        box(tr(T("per head", "每个头")), h("div", {}, tr(T("state ", "状态 ")) + bytes(perHead) + " B, KV " + bytes(kvTok) + tr(T(" B/token", " B/词元"))), h("div", { class: "big", id: "mem-cross" }, "T = " + bytes(cross))));
      out.replaceChildren(res);
      if (sub === 1) {
        const c = Number(cross), kv = Number(kvTok), st = Number(perHead), Ts = [0, 1, 2, 3, 4].map((i) => Math.round(c * i / 2));
        out.append(lineChart([{ points: Ts.map((t) => [t, t * kv]), color: "#1f6fb2", label: tr(T("KV cache", "KV 缓存")) }, { points: Ts.map((t) => [t, st]), color: "#c2571a", label: tr(T("state", "状态")) }],
          { xlabel: "T", ylabel: tr(T("bytes per head", "每个头的字节数")), marks: [c] }));
      }
    };
    return (n) => { sub = n; draw(); };
  } });

scene({ id: "gates", title: T("Gates: forgetting", "门控：遗忘"),
  text: [T("A gate 0 ≤ α ≤ 1 scales the old state before each write: S = αS + φ(k)vᵀ, z = αz + φ(k). Features 1, values 2, 4, 8, α = 0.5.",
      "门控 0 ≤ α ≤ 1 在每次写入前缩放旧状态：S = αS + φ(k)vᵀ，z = αz + φ(k)。特征为 1，值为 2、4、8，α = 0.5。"),
    T("Token i's weight at time t is the product of the gates that came after it: αᵢ₊₁⋯αₜ. Old tokens fade geometrically.",
      "词元 i 在时刻 t 的权重是它之后所有门控的乘积：αᵢ₊₁⋯αₜ。旧词元按几何级数淡出。"),
    T("Each step is an affine map S ↦ aS + B. Two compose as (a₂,B₂)∘(a₁,B₁) = (a₂a₁, a₂B₁+B₂): associative, so a tree combines all prefixes in log depth (not commutative: order matters). Four tokens, α = 0.5, writes 2, 4, 8, 16:",
      "每一步都是仿射映射 S ↦ aS + B。两步的复合为 (a₂,B₂)∘(a₁,B₁) = (a₂a₁, a₂B₁+B₂)：满足结合律，所以可以用一棵树在对数深度内合并所有前缀（不满足交换律：顺序重要）。四个词元，α = 0.5，写入 2、4、8、16：")],
  build(root) {
    const d = DATA.gates, view = h("div", {});
    root.append(view);
    return (sub) => {
      view.replaceChildren();
      if (sub === 0) {
        view.append(h("table", { class: "data" }, h("tr", {}, h("th", {}, "t"), h("th", {}, "α"), h("th", {}, "v"), h("th", {}, "S"), h("th", {}, "z"), h("th", {}, "y = S/z")),
          d.S.map((S, t) => h("tr", {}, h("td", {}, t + 1), h("td", {}, d.alpha[t]), h("td", {}, d.values[t]), h("td", {}, fmt(S[0][0])), h("td", {}, fmt(d.z[t][0])), h("td", {}, t === 1 ? "10/3 ≈ " + fmt(d.y[t][0], 4) : fmt(d.y[t][0]))))));
      } else if (sub === 1) {
        view.append(box(tr(T("weight of token i (columns) at time t (rows)", "词元 i（列）在时刻 t（行）的权重")), grid(d.weights.map((r) => r.map((x) => (x === null ? "" : x))), { rowHeads: ["t=1", "t=2", "t=3"], colHeads: ["i=1", "i=2", "i=3"] })));
      } else {
        const sc = d.scan, svg = s("svg", { width: 600, height: 200, role: "img" });
        const node = (x, y, p, label) => { svg.append(s("rect", { x: x - 58, y, width: 116, height: 34, rx: 6, fill: "#e7f0fa", stroke: "#1f6fb2" }), s("text", { x, y: y + 14, "text-anchor": "middle" }, label), s("text", { x, y: y + 28, "text-anchor": "middle" }, "(" + fmt(p.a) + ", " + fmt(p.B) + ")")); };
        const xs = [75, 225, 375, 525];
        xs.forEach((x, i) => node(x, 150, sc.leaves[i], "token " + (i + 1)));
        [[150, 0], [450, 1]].forEach(([x, i]) => { node(x, 80, sc.level1[i], i ? "4∘3" : "2∘1"); svg.append(s("path", { d: `M${x} 114 L${xs[2 * i]} 150 M${x} 114 L${xs[2 * i + 1]} 150`, stroke: "#5b6470", fill: "none" })); });
        node(300, 10, sc.root, "(4∘3)∘(2∘1)");
        svg.append(s("path", { d: "M300 44 L150 80 M300 44 L450 80", stroke: "#5b6470", fill: "none" }));
        view.append(svg, h("p", {}, tr(T("token loop: S₄ = ", "逐词元循环：S₄ = ")) + fmt(sc.loop_S) + tr(T(" = B of the root", " = 根节点的 B"))));
      }
    };
  } });

scene({ id: "delta", title: T("The delta rule: write only the error", "Delta 规则：只写入误差"),
  text: [T("Read what the memory holds for key k, then write only the difference: u = β(v − Sᵀk), S = S + k uᵀ. Unit key, v = 5, β = 0.5, S starting at 2: 3.5 → 4.25 → 4.625. No z here: this is a fast-weight memory, a different model.",
      "先读出记忆中键 k 对应的内容，再只写入差值：u = β(v − Sᵀk)，S = S + k uᵀ。单位键、v = 5、β = 0.5，S 从 2 开始：3.5 → 4.25 → 4.625。这里没有 z：这是一种快速权重记忆，是另一种模型。"),
    T("For one key each write multiplies the error by (1 − β‖k‖²): it converges when 0 < β‖k‖² < 2, lands in one write at 1, overshoots above 1 and diverges past 2.",
      "对同一个键，每次写入把误差乘以 (1 − β‖k‖²)：当 0 < β‖k‖² < 2 时收敛，等于 1 时一次写准，大于 1 时来回过冲，超过 2 时发散。"),
    T("Try it: the page's engine reruns the writes for the β you choose.", "试一试：页面的计算引擎会用你选的 β 重新执行这些写入。")],
  build(root) {
    const d = DATA.delta, view = h("div", {});
    root.append(view);
    const colors = ["#1f6fb2", "#2e7d32", "#c2571a", "#b00020"];
    return (sub) => {
      view.replaceChildren();
      const c = d.curves[0];
      if (sub === 0) view.append(h("div", { class: "row" }, c.S.slice(0, 4).map((x, i) => h("span", { class: "token" + (i === 3 ? " active" : "") }, (i ? tr(T("write ", "写入 ")) + i + ": " : "S₀ = ") + fmt(x)))),
        h("p", { class: "big", id: "delta-seq" }, c.S.slice(1, 4).map((x) => fmt(x)).join(" → ")));
      else if (sub === 1) view.append(lineChart(d.curves.slice(0, 3).map((cv, i) => ({ points: cv.S.map((x, n) => [n, x]), color: colors[i], label: "β‖k‖² = " + cv.beta })), { xlabel: tr(T("writes", "写入次数")), ylabel: "S" }),
        h("p", {}, "β‖k‖² = 2.5: " + d.curves[3].S.slice(0, 6).map((x) => fmt(x)).join(", ") + tr(T(" … (diverges)", " …（发散）"))));
      else {
        const slider = h("input", { type: "range", id: "delta-beta", min: 0, max: 2.5, step: 0.05, value: 0.5 });
        const out = h("div", {});
        const draw = () => {
          const beta = Number(slider.value), n = 8;
          const res = run({ rule: "delta", q: [1], k: Array(n).fill([1]), v: Array(n).fill([d.value]), beta: Array(n).fill(beta) });
          // the engine starts from zero; S from 2 is S0 = 2 shifted: error factor is what matters
          const seq = [0].concat(res.S.map((S) => S[0][0]));
          out.replaceChildren(h("p", {}, "β = " + beta.toFixed(2) + ", 1 − β = " + (1 - beta).toFixed(2)), lineChart([{ points: seq.map((x, i) => [i, x]), color: "#1f6fb2", label: "S (from 0)" }, { points: seq.map((x, i) => [i, d.value]), color: "#5b6470", label: "v", dash: "4 4" }], { xlabel: tr(T("writes", "写入次数")), ylabel: "S" }));
        };
        slider.addEventListener("input", draw);
        view.append(h("label", {}, "β ", slider), out);
        draw();
      }
    };
  } });

scene({ id: "chunks", title: T("Chunks: carried state plus the chunk itself", "分块：携带的状态加上块内部分"),
  text: [T("Training processes chunks of C tokens at once. Inside a chunk, each output is the part read from the state carried in (older history) plus a masked product over the chunk's own tokens; then the chunk hands on S + Kᵀ V and z + ΣK. Move the chunk size: the outputs do not change.",
      "训练时一次处理 C 个词元组成的块。块内每个输出等于从携带进来的状态读出的部分（更早的历史），加上块内词元的带掩码乘积；然后块把 S + KᵀV 和 z + ΣK 传给下一块。移动块大小：输出不变。"),
    T("The running example with two more tokens (φ(k) = [1,0], v = 6 and φ(k) = [1,1], v = 15): the last output is 74/11 for every chunk size, the same as the token loop.",
      "在贯穿的例子后再加两个词元（φ(k) = [1,0]、v = 6 与 φ(k) = [1,1]、v = 15）：无论块大小如何，最后的输出都是 74/11，与逐词元循环相同。")],
  build(root) {
    const d = DATA.chunks, out = h("div", {});
    const slider = h("input", { type: "range", id: "chunk-size", min: 1, max: d.keys.length, value: 2, oninput: () => draw() });
    root.append(h("label", {}, ui("chunk") + " C = ", slider), out);
    let sub = 0;
    const draw = () => {
      const C = Number(slider.value), chunks = d.layouts[String(C)];
      const toks = h("div", {}, d.keys.map((k, i) => h("span", { class: "token chunk" + (Math.floor(i / C) % 2) }, (i + 1) + ": " + vec(k) + ", v=" + d.values[i])));
      const rows = chunks.flatMap((c, ci) => c.y.map((y, j) => h("tr", {}, h("td", {}, ci + 1), h("td", {}, c.start + j + 1),
        h("td", {}, fmt(c.inter_num[j]) + " / " + fmt(c.inter_den[j])), h("td", {}, fmt(c.intra_num[j]) + " / " + fmt(c.intra_den[j])),
        h("td", {}, fmt(y, 4)), h("td", {}, fmt(d.loop_y[c.start + j], 4)))));
      const table = h("table", { class: "data" }, h("tr", {}, h("th", {}, tr(T("chunk", "块"))), h("th", {}, "t"), h("th", {}, ui("read")), h("th", {}, ui("own")), h("th", {}, "y"), h("th", {}, tr(T("token loop", "逐词元循环")))), rows);
      const hand = h("div", { class: "muted" }, ui("handed") + ": " + chunks.map((c) => "S=" + vec(c.S_out) + " z=" + vec(c.z_out)).join("  →  "));
      out.replaceChildren(toks, table, hand);
      if (sub === 1) out.append(h("p", { class: "big" }, "y₅ = " + fmt(d.num) + "/" + fmt(d.den) + " ≈ " + fmt(d.loop_y[4], 4)));
    };
    return (n) => { sub = n; draw(); };
  } });

scene({ id: "devices", title: T("Across devices: segments exchange states, not tokens", "跨设备：各段交换状态，而不是词元"),
  text: [T("Every rule maps a segment's incoming state affinely: S_out = P·S_in + Q. Each device runs its segment from a zero state (that is Q) and knows P from its own tokens: here gated delta, P = Π α(I − β k kᵀ) in token order. Composing the pairs with the rule of the gates scene, (P₂,Q₂)∘(P₁,Q₁) = (P₂P₁, P₂Q₁ + Q₂), gives the state of one pass over all tokens.",
    "每条规则都把一段的输入状态仿射地映射为 S_out = P·S_in + Q。每个设备从零状态运行自己的那一段（得到 Q），并由自己的词元得到 P：这里是门控 delta，P = Π α(I − β k kᵀ)，按词元顺序相乘。用门控那一场景的规则复合这些对，(P₂,Q₂)∘(P₁,Q₁) = (P₂P₁, P₂Q₁ + Q₂)，就得到对全部词元一次运行的状态。")],
  build(root) {
    const d = DATA.devices;
    const seg = (sg, i) => box(tr(T("device ", "设备 ")) + (i + 1) + tr(T(": tokens ", "：词元 ")) + sg.tokens.join("–"),
      h("div", { class: "row" }, h("div", {}, "P", grid(sg.P)), h("div", {}, "Q", grid(sg.Q))));
    root.append(h("div", { class: "muted" }, d.keys.map((k, t) => "k" + (t + 1) + "=" + vec(k) + ", v=" + d.values[t]).join("   ") + "   α = " + d.alpha[0] + ", β = " + d.beta[0]),
      h("div", { class: "row" }, d.segments.map(seg),
        box("P₂Q₁ + Q₂", grid(d.composed)), box(tr(T("one pass, all tokens", "一次运行全部词元")), grid(d.one_pass))));
    return () => {};
  } });

scene({ id: "code", title: T("The whole recurrence, as code", "整个递推，写成代码"),
  text: [T("This loop is the definition; every fast form (dense, chunked, scanned, one-step decode) must agree with it. Write it first in float64, then check each fast path against it on the same inputs: float64 first, speed second. lab.py (download on the first page) does exactly that with NumPy.",
    "这个循环就是定义；每一种快速形式（稠密、分块、扫描、单步解码）都必须与它一致。先用 float64 写出它，再在相同输入上用它检查每一条快速路径：先 float64，后速度。lab.py（在第一页下载）用 NumPy 做的正是这件事。")],
  build(root) {
    root.append(h("pre", {}, "import numpy as np\n\ndef linear_attention(q, k, v, eps=1e-6):   # q, k: features [T, r]; v: [T, dv]\n    S = np.zeros((k.shape[1], v.shape[1]))   # r x dv\n    z = np.zeros(k.shape[1])                 # r\n    y = []\n    for t in range(len(k)):\n        S += np.outer(k[t], v[t])            # write\n        z += k[t]\n        y.append(q[t] @ S / (q[t] @ z + eps))  # then read\n    return np.array(y), S, z"));
    return () => {};
  } });

scene({ id: "saves", title: T("What it saves, and where the difficulty moves", "省下了什么，难点又转移到了哪里"),
  text: [T("Decode with a KV cache keeps n(dk + dv) numbers per head and reads them all each step; the state keeps r·dv + r and does r·dv work per step, whatever n. The history is aggregated, so it can no longer be retrieved token by token.",
      "用 KV 缓存解码时，每个头保存 n(dk + dv) 个数，每步全部读取；状态只保存 r·dv + r 个数，每步做 r·dv 的计算，与 n 无关。历史被聚合了，所以不能再逐个词元地取回。"),
    T("Measured by linattn recall (no training; random unit keys, d = 64): softmax retrieves every pair at any distance; the fixed states lose accuracy as more writes come after the pair.",
      "由 linattn recall 测得（无训练；随机单位键，d = 64）：softmax 在任何距离都能取回每一对；固定状态在该对之后写入越多，准确率越低。")],
  build(root) {
    const m = DATA.measured, view = h("div", {});
    root.append(view);
    return (sub) => {
      view.replaceChildren();
      if (sub === 0) view.append(h("table", { class: "data" }, h("tr", {}, h("th", {}, ""), h("th", {}, "softmax + KV cache"), h("th", {}, "linear attention state")),
        [[T("decode state", "解码状态"), "O(n (dk + dv))", "O(r·dv + r)"], [T("work per step", "每步计算"), "O(n (dk + dv))", "O(r·dv)"], [T("history", "历史"), T("every token, retrievable", "每个词元，可取回"), T("aggregated", "聚合，不可逐个取回")], [T("hard part", "难点"), T("capacity, bandwidth", "容量与带宽"), T("exact retrieval, interference, forgetting", "精确检索、干扰、遗忘")]]
          .map((r) => h("tr", {}, r.map((c) => h("td", {}, tr(c)))))));
      else {
        const dists = [...new Set(m.recall_distance.map((r) => r.distance))], mechs = [...new Set(m.recall_distance.map((r) => r.mechanism))];
        const acc = (mech, dist) => m.recall_distance.find((r) => r.mechanism === mech && r.distance === dist).accuracy;
        view.append(h("table", { class: "data", id: "recall-table" }, h("tr", {}, h("th", {}, tr(T("writes after the pair →", "该对之后的写入数 →"))), dists.map((x) => h("th", {}, x))),
          mechs.map((mech) => h("tr", {}, h("td", {}, mech), dists.map((x) => h("td", {}, Math.round(100 * acc(mech, x)) + "%"))))),
          h("p", { class: "muted" }, tr(T("source: ", "来源：")) + m.recall_file));
      }
    };
  } });

scene({ id: "long", title: T("Long histories and precision", "长历史与精度"),
  text: [T("With nonnegative features z only grows, and so does S: the largest state entry rises with T. A low-precision running sum then rounds away small late writes: a bfloat16 state written token by token stops growing, while the chunk form, which carries its sum in float32, stays close. Keep the state in float32.",
    "特征非负时 z 只增不减，S 也一样：状态中最大的元素随 T 增长。低精度的累加和会把后来的小写入舍入掉：逐词元写入的 bfloat16 状态停止增长，而分块形式用 float32 携带累加和，误差保持很小。状态请用 float32。")],
  build(root) {
    const m = DATA.measured;
    const rec = m.stability.filter((r) => r.form === "recurrent" && r.dtype === "bfloat16");
    const chunk = (L, dt) => m.stability.find((r) => r.form === "chunk" && r.dtype === dt && r.length === L);
    root.append(h("table", { class: "data", id: "long-table" }, h("tr", {}, h("th", {}, "T"), h("th", {}, tr(T("largest |S|, float64", "最大 |S|，float64"))), h("th", {}, tr(T("largest |S|, bfloat16 token loop", "最大 |S|，bfloat16 逐词元"))), h("th", {}, tr(T("rel. error, bfloat16 token loop", "相对误差，bfloat16 逐词元"))),
      h("th", {}, tr(T("rel. error, chunk bfloat16", "相对误差，分块 bfloat16"))), h("th", {}, tr(T("rel. error, chunk float32", "相对误差，分块 float32")))),
      rec.map((r) => h("tr", {}, h("td", {}, bytes(r.length)), h("td", {}, fmt(r.reference_state_abs_max, 1)), h("td", {}, fmt(r.state_abs_max, 1)), h("td", {}, fmt(r.max_rel_err, 3)),
        h("td", {}, chunk(r.length, "bfloat16") ? fmt(chunk(r.length, "bfloat16").max_rel_err, 3) : ""), h("td", {}, chunk(r.length, "float32") ? fmt(chunk(r.length, "float32").max_rel_err, 3) : "")))),
    h("p", { class: "muted" }, tr(T("source: ", "来源：")) + m.stability_files.join(", ") + " (accumulate, input scale 1)"));
    return () => {};
  } });

const EXERCISES = [
  { q: T("Same three tokens as the running example (φ(k) = [1,0], [0,1], [1,1]; v = 2, 4, 3), but the query is φ(q) = [1, 2]. What is y?", "与贯穿例子相同的三个词元（φ(k) = [1,0]、[0,1]、[1,1]；v = 2、4、3），但查询为 φ(q) = [1, 2]。y 是多少？"),
    spec: { rule: "accumulate", q: [1, 2], k: [[1, 0], [0, 1], [1, 1]], v: [[2], [4], [3]], eps: 0, eps_mode: "add" } },
  { q: T("Gated, features 1, α = 0.5 every step, values 2, 4, 8 and a fourth token with v = 16. What is y after the fourth token?", "门控，特征为 1，每步 α = 0.5，值为 2、4、8，再加第四个词元 v = 16。第四个词元之后 y 是多少？"),
    spec: { rule: "gated", q: [1], k: [[1], [1], [1], [1]], v: [[2], [4], [8], [16]], alpha: [0.5, 0.5, 0.5, 0.5], eps: 0, eps_mode: "add" } },
  { q: T("Delta rule, unit key, v = 5, β = 1.5, S starting at 0. What is S after three writes (and is it converging)?", "Delta 规则，单位键，v = 5，β = 1.5，S 从 0 开始。三次写入后 S 是多少（是否收敛）？"),
    spec: { rule: "delta", q: [1], k: [[1], [1], [1]], v: [[5], [5], [5]], beta: [1.5, 1.5, 1.5] } },
];
scene({ id: "exercises", title: T("Exercises", "练习"),
  text: EXERCISES.map((e, i) => T("Exercise " + (i + 1) + ". " + e.q.en, "练习 " + (i + 1) + "。" + e.q.zh)),
  build(root) {
    const view = h("div", {});
    root.append(view);
    return (sub) => {
      const e = EXERCISES[sub], res = run(e.spec), t = e.spec.k.length - 1;
      const answer = h("div", { class: "answer", id: "answer", hidden: true },
        "y = " + fmt(res.y[t][0], 6) + (res.z ? "  (" + ui("num") + " " + fmt(res.S[t].reduce((acc, row, i) => acc + row[0] * (Array.isArray(e.spec.q[0]) ? e.spec.q[t][i] : e.spec.q[i]), 0), 6) + ", " + ui("den") + " " + fmt(res.z[t].reduce((acc, x, i) => acc + x * e.spec.q[i], 0), 6) + ")" : "  (S: " + res.S.map((S) => fmt(S[0][0])).join(" → ") + ")"));
      const button = h("button", { type: "button", id: "reveal", onclick: () => { answer.hidden = !answer.hidden; button.textContent = answer.hidden ? ui("show") : ui("hide"); } }, ui("show"));
      view.replaceChildren(button, answer);
    };
  } });

scene({ id: "playground", title: T("Playground", "试验场"),
  text: [T("Edit the tokens (features φ(k), φ(q), values), the rule, the gates α, the write strengths β, ε and its mode. S, z and y after every token are recomputed by the page's engine, the same one the exercises use and the tests compare with linattn's float64 reference.",
    "编辑词元（特征 φ(k)、φ(q)、值）、规则、门控 α、写入强度 β、ε 及其模式。每个词元之后的 S、z 和 y 都由页面的计算引擎重新计算；练习用的是同一个引擎，测试会把它与 linattn 的 float64 参考实现对比。")],
  build(root) {
    const st = { rule: "accumulate", dv: 1, eps: 1e-6, eps_mode: "add", normalize: true, toks: [
      { k: [1, 0], v: [2, 1], q: [2, 1], a: 0.5, b: 0.5 }, { k: [0, 1], v: [4, 3], q: [2, 1], a: 0.5, b: 0.5 }, { k: [1, 1], v: [3, 5], q: [2, 1], a: 0.5, b: 0.5 }] };
    const controls = h("div", {}), table = h("div", {}), out = h("div", {});
    root.append(controls, table, out);
    const num = (get, set, id, step) => h("input", { type: "number", step: step || "any", value: get(), id, oninput: (e) => { const x = Number(e.target.value); if (e.target.value !== "" && isFinite(x)) { set(x); compute(); } } });
    const sel = (id, opts, get, set) => h("select", { id, onchange: (e) => { set(e.target.value); drawTable(); compute(); } }, opts.map((o) => h("option", { value: o, selected: String(get()) === String(o) }, o)));
    controls.append(h("label", {}, "rule ", sel("pg-rule", ["accumulate", "gated", "delta", "gated_delta"], () => st.rule, (x) => { st.rule = x; })),
      h("label", {}, "dv ", sel("pg-dv", [1, 2], () => st.dv, (x) => { st.dv = Number(x); })),
      h("label", {}, "ε ", num(() => st.eps, (x) => { st.eps = Math.max(0, x); }, "pg-eps")),
      h("label", {}, "ε mode ", sel("pg-mode", ["add", "clamp"], () => st.eps_mode, (x) => { st.eps_mode = x; })),
      h("label", {}, h("input", { type: "checkbox", id: "pg-norm", checked: true, onchange: (e) => { st.normalize = e.target.checked; compute(); } }), " z"),
      h("button", { type: "button", id: "pg-add", onclick: () => { if (st.toks.length < 5) { st.toks.push({ k: [1, 1], v: [1, 1], q: [2, 1], a: 0.5, b: 0.5 }); drawTable(); compute(); } } }, "+ " + ui("token")),
      h("button", { type: "button", id: "pg-remove", onclick: () => { if (st.toks.length > 1) { st.toks.pop(); drawTable(); compute(); } } }, "− " + ui("token")));
    const drawTable = () => {
      const gated = st.rule.startsWith("gated"), delta = st.rule.endsWith("delta");
      const head = ["", "φ(k)₁", "φ(k)₂", "v₁"].concat(st.dv === 2 ? ["v₂"] : [], ["φ(q)₁", "φ(q)₂"], gated ? ["α"] : [], delta ? ["β"] : []);
      table.replaceChildren(h("table", { class: "data" }, h("tr", {}, head.map((x) => h("th", {}, x))), st.toks.map((tk, t) => h("tr", {}, h("td", {}, t + 1),
        [0, 1].map((i) => h("td", {}, num(() => tk.k[i], (x) => { tk.k[i] = x; }, "pg-k" + t + i))),
        (st.dv === 2 ? [0, 1] : [0]).map((j) => h("td", {}, num(() => tk.v[j], (x) => { tk.v[j] = x; }, "pg-v" + t + j))),
        [0, 1].map((i) => h("td", {}, num(() => tk.q[i], (x) => { tk.q[i] = x; }, "pg-q" + t + i))),
        gated ? h("td", {}, num(() => tk.a, (x) => { tk.a = Math.min(1, Math.max(0, x)); }, "pg-a" + t, "0.05")) : null,
        delta ? h("td", {}, num(() => tk.b, (x) => { tk.b = x; }, "pg-b" + t, "0.05")) : null))));
    };
    const compute = () => {
      const spec = { rule: st.rule, q: st.toks.map((t) => t.q.slice()), k: st.toks.map((t) => t.k.slice()), v: st.toks.map((t) => t.v.slice(0, st.dv)),
        alpha: st.toks.map((t) => t.a), beta: st.toks.map((t) => t.b), eps: st.eps, eps_mode: st.eps_mode,
        normalize: st.normalize && !st.rule.endsWith("delta") };  // the delta rules keep no z
      try {
        const res = run(spec);
        out.replaceChildren(h("div", { class: "row", id: "pg-out" }, res.S.map((S, t) => box(ui("token") + " " + (t + 1), grid(S), res.z ? h("div", {}, "z = " + vec(res.z[t])) : null, h("div", { class: "big" }, "y = " + vec(res.y[t]))))));
      } catch (err) {
        out.replaceChildren(h("p", { class: "error" }, err.message));
      }
    };
    drawTable(); compute();
    return () => {};
  } });
