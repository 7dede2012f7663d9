// ------------------------------------------------------------------------------------------------ scenes
// A scene: id, title, text (one entry per step) and build(root) -> update(step within the scene), called on entry.
const SCENES = [];
const scene = (def) => SCENES.push(def);
const C = COLORS;
// The recall tool's mechanism names, in the page's words (its gate is α here as everywhere on the page).
const mechName = (m) => m.replace(/^gated a=/, tr(T("gated α = ", "门控 α = "))).replace(/^accumulate$/, tr(T("accumulate", "累加")));

scene({ id: "intro", title: T("Linear attention: writing the history into a state", "线性注意力：把历史写进状态"),
  text: [T("Instead of rereading every cached key and value for each new token, can a model keep a running notebook that any query can consult at once? Step with → and ←, drag the timeline, or open a link such as #step=12. Every number in the scripted scenes was computed in float64 by linattn's reference when this page was built.",
    "能不能不再为每个新词元把缓存的键和值逐条重读，而是维护一本随时可查的“笔记本”？用 → 和 ← 翻页，拖动时间轴，或打开 #step=12 这样的链接。脚本场景中的每个数字都是构建本页时由 linattn 的 float64 参考实现算出的。")],
  build(root) {
    // Wide: tokens, state and query in one row. Narrow (a phone): tokens above the state, drawn at 1:1 so text stays 14 px.
    const narrow = visualWidth() < 560, W = narrow ? Math.max(300, visualWidth() - 2) : 720, H = narrow ? 300 : 230;
    const svg = s("svg", { viewBox: "0 0 " + W + " " + H, class: "diagram", role: "img", id: "intro-svg" });
    const L = narrow ? { card: (i) => [10 + ((W - 20) / 3) * i, 30], cw: (W - 20) / 3 - 12, Sx: 20, Sy: 130, zy: 220, sw: 150, qx: W - 70, qy: 175, wr: [W / 2, 18], rd: [W - 70, 130] }
      : { card: (i) => [20 + 95 * i, 70], cw: 80, Sx: 380, Sy: 40, zy: 130, sw: 150, qx: 610, qy: 110, wr: [330, 30], rd: [610, 30] };
    const toks = [0, 1, 2].map((i) => {
      const [x, y] = L.card(i);
      svg.append(s("rect", { x, y, width: L.cw, height: 70, rx: 8, class: "card" }),
        s("text", { x: x + L.cw / 2, y: y + 28, "text-anchor": "middle", class: "sym-k" }, "k" + "₁₂₃"[i]), s("text", { x: x + L.cw / 2, y: y + 54, "text-anchor": "middle", class: "sym-v" }, "v" + "₁₂₃"[i]));
      return [x + L.cw / 2, y + 35];
    });
    const Sc = [L.Sx + L.sw / 2, L.Sy + 40], zc = [L.Sx + L.sw / 2, L.zy + 25];
    svg.append(s("rect", { x: L.Sx, y: L.Sy, width: L.sw, height: 80, rx: 10, class: "state-S" }), s("text", { x: Sc[0], y: L.Sy + 46, "text-anchor": "middle", class: "big-svg sym-S" }, "S"),
      s("rect", { x: L.Sx, y: L.zy, width: L.sw, height: 50, rx: 10, class: "state-z" }), s("text", { x: zc[0], y: L.zy + 32, "text-anchor": "middle", class: "big-svg sym-z" }, "z"),
      s("text", { x: L.wr[0], y: L.wr[1], "text-anchor": "middle" }, tr(T("write", "写入"))), s("text", { x: L.rd[0], y: L.rd[1], "text-anchor": "middle" }, tr(T("read", "读取"))),
      s("circle", { cx: L.qx, cy: L.qy, r: 26, class: "card" }), s("text", { x: L.qx, y: L.qy + 6, "text-anchor": "middle", class: "big-svg sym-q" }, "q"),
      s("path", { d: `M${L.qx - 26} ${L.qy} L${L.Sx + L.sw + 4} ${L.qy}`, stroke: C.q, "stroke-width": 3 }),
      s("text", { x: narrow ? L.qx : L.qx + 65, y: narrow ? L.qy + 62 : L.qy + 6, "text-anchor": "middle", class: "big-svg sym-y" }, narrow ? "↓ y" : "→ y"));
    const lab = h("a", { id: "lab-download", download: "lab.py", href: "data:text/x-python;charset=utf-8;base64," + DATA.lab_b64 }, ui("lab"));
    root.append(svg, h("p", {}, lab));
    // Wide: over the other cards, not through them; narrow: straight down (nothing lies between).
    return () => toks.forEach((p, i) => {
      if (narrow) { flow(svg, [p, [p[0], 118], [Sc[0], 118], Sc], C.S, 200 + 350 * i); flow(svg, [p, [p[0], 118], [L.Sx - 8 + 180, 118], [L.Sx + 180, zc[1]], zc], C.z, 300 + 350 * i); return; }
      flow(svg, [p, [p[0], 52], [380, 52], Sc], C.S, 200 + 350 * i); flow(svg, [p, [p[0], 160], [p[0], 200], [370, 200], zc], C.z, 300 + 350 * i);
    });
  } });

scene({ id: "softmax", title: T("What ordinary attention reads", "先看普通注意力在读什么"),
  text: [T("The current query q scores every cached key, softmax turns the scores into weights, and the values are summed with those weights: y = Σᵢ softmax(q·kᵢ/√d)ᵢ vᵢ. Every past position gets a weight.",
      "当前查询 q 给每个缓存的键打分，softmax 把分数变成权重，再用这些权重把值加起来：y = Σᵢ softmax(q·kᵢ/√d)ᵢ vᵢ。每个历史位置都有一个权重。"),
    T("A new query changes every score, because q sits inside the exponential of every term: nothing can be summed ahead of time, so the keys and values are read again. Turn the query.",
      "换一个查询，所有分数都会变，因为 q 在每一项的指数里：没有任何东西能提前求和，所以键和值要重新读一遍。转动查询试试。"),
    T("So each decode step reads all n cached pairs: the numbers kept and read grow with the history (one head, d = 128). Linear attention changes the similarity so that the history can be merged into a fixed-size state first and queried afterwards.",
      "于是每个解码步都读取全部 n 对缓存：保存和读取的数随历史增长（一个头，d = 128）。线性注意力换一种相似度，让历史先合并成固定大小的状态，再由查询读取。")],
  build(root) {
    const d = DATA.softmax, view = h("div", {});
    root.append(view);
    const bars = (q, w, y) => h("div", { class: "row" }, box("q = " + vec(q.map((x) => Number(x.toFixed(2)))), ...w.map((x, i) => barRow("k" + (i + 1) + " " + vec(d.keys[i]), x, 1, C.k))),
      box(ui("out"), h("div", { class: "big" }, "y = Σ wᵢvᵢ = " + fmt(y, 4)), h("div", { class: "muted" }, fx("v = " + vec(d.values)))));
    return (sub) => {
      put(view, );
      if (sub === 0) { const qd = d.queries[0]; view.append(bars(qd.q, qd.weights, qd.y)); }
      else if (sub === 1) {
        const angle = h("input", { type: "range", id: "softmax-angle", min: 0, max: 360, step: 5, value: 90 }), out = h("div", {});
        const draw = () => {
          const th = Number(angle.value) * Math.PI / 180, q = [1.5 * Math.cos(th), 1.5 * Math.sin(th)];
          const logits = d.keys.map((k) => (q[0] * k[0] + q[1] * k[1]) / Math.SQRT2), top = Math.max(...logits);
          const e = logits.map((l) => Math.exp(l - top)), sum = e.reduce((a, b) => a + b, 0), w = e.map((x) => x / sum);
          put(out, bars(q, w, w.reduce((a, x, i) => a + x * d.values[i], 0)));
        };
        angle.addEventListener("input", quietly(draw));
        view.append(h("label", { class: "control" }, fx("q ∠ "), angle), out);
        draw();
      } else {
        const ticks = [0, 64, 128, 192, 256];
        view.append(lineChart([{ points: d.cost.map((c) => [c.n, c.kv_floats]), color: C.k, label: tr(T("KV cache: 2·n·d", "KV 缓存：2·n·d")) },
          { points: d.cost.map((c) => [c.n, c.state_floats]), color: C.S, label: tr(T("state: d·d + d, whatever n", "状态：d·d + d，与 n 无关")) }],
        { xlabel: tr(T("n (tokens in the history)", "n（历史词元数）")), ylabel: tr(T("numbers read per step", "每步读取的数")), xticks: ticks, yticks: [0, d.cost[d.cost.length - 1].kv_floats / 2, d.cost[d.cost.length - 1].kv_floats] }));
      }
    };
  } });

scene({ id: "rewrite", title: T("The key rewrite: let the sums happen first", "关键改写：让求和先发生"),
  text: [T("Use φ(q)ᵀφ(k) as the similarity and normalize by the sum of the weights. Pick a nonnegative feature map φ, such as ELU(x) + 1 (plotted with relu(x) + 1): the weights are never negative, so they form a weighted average.",
      "用 φ(q)ᵀφ(k) 作相似度，再除以权重之和。选一个非负的特征映射 φ，例如 ELU(x) + 1（图中与 relu(x) + 1 对照）：权重不会为负，于是构成加权平均。"),
    T("Numerator: Σᵢ [φ(q)ᵀφ(kᵢ)] vᵢᵀ = φ(q)ᵀ [Σᵢ φ(kᵢ)vᵢᵀ]. The query does not depend on i, so it comes out of the sum: what is left, S, can be kept.",
      "分子：Σᵢ [φ(q)ᵀφ(kᵢ)] vᵢᵀ = φ(q)ᵀ [Σᵢ φ(kᵢ)vᵢᵀ]。查询与 i 无关，可以提到求和号外面：剩下的 S 可以保存起来。"),
    T("Denominator likewise: Σᵢ φ(q)ᵀφ(kᵢ) = φ(q)ᵀ [Σᵢ φ(kᵢ)] = φ(q)ᵀz. The history needs only S and z.",
      "分母同理：Σᵢ φ(q)ᵀφ(kᵢ) = φ(q)ᵀ [Σᵢ φ(kᵢ)] = φ(q)ᵀz。历史只需要维护 S 和 z。"),
    T("This reordering is exact for the kernelized attention it starts from. But a finite feature map is not softmax: for the same query and keys the weights differ (below, ELU+1 against softmax). It is a different model, trained as such.",
      "对出发时的核化注意力，这个重排是精确的。但有限维的特征映射不是 softmax：同样的查询和键，权重并不相同（下图：ELU+1 对 softmax）。这是另一个模型，要按它自己来训练。")],
  build(root) {
    const d = DATA.rewrite, view = h("div", {});
    root.append(view);
    return (sub) => {
      put(view, );
      if (sub === 0) view.append(formula("y = Σᵢ φ(q)ᵀφ(kᵢ) vᵢ / Σᵢ φ(q)ᵀφ(kᵢ)"), lineChart([{ points: d.x.map((x, i) => [x, d.elu1[i]]), color: C.k, label: "ELU(x) + 1" },
        { points: d.x.map((x, i) => [x, d.relu1[i]]), color: C.other, label: "relu(x) + 1", dash: "7 5" }], { xlabel: "x", ylabel: "φ(x)", xticks: [-3, 0, 3], yticks: [0, 1, 2, 4] }));
      else if (sub === 1 || sub === 2) {
        const f = formula("Σᵢ [φ(q)ᵀφ(kᵢ)] vᵢᵀ  =  φ(q)ᵀ [ Σᵢ φ(kᵢ)vᵢᵀ ]  =  φ(q)ᵀ S", sub === 2 ? "Σᵢ φ(q)ᵀφ(kᵢ)  =  φ(q)ᵀ [ Σᵢ φ(kᵢ) ]  =  φ(q)ᵀ z" : "", sub === 2 ? "y = φ(q)ᵀS / φ(q)ᵀz" : "");
        view.append(f);
        const qs = f.querySelectorAll(".sym-q");
        qs.forEach((el, i) => anim(el, [{ transform: "translateX(60px)", opacity: 0.3 }, { transform: "none", opacity: 1 }], { duration: 600, delay: 60 * i }));
      } else {
        const max = Math.max(...d.kernel_weights, ...d.softmax_weights);
        view.append(h("div", { class: "row" }, box(tr(T("ELU+1 kernel weights", "ELU+1 核的权重")), ...d.kernel_weights.map((w, i) => barRow("k" + (i + 1), w, max, C.k))),
          box(tr(T("softmax weights", "softmax 权重")), ...d.softmax_weights.map((w, i) => barRow("k" + (i + 1), w, max, C.other)))));
      }
    };
  } });

scene({ id: "dense", title: T("Which attention are we reordering?", "先确认我们在重排哪一种注意力"),
  text: [T("Write Q̃ = φ(Q), K̃ = φ(K): rows of r features; V has dv columns; M is the causal mask (past and present only). The whole sequence at once: A = (Q̃K̃ᵀ) ⊙ M, a T × T matrix, and Y = AV / rowsum(A), the division broadcast row by row. Here the running example: three tokens, every query φ(q) = [2, 1].",
      "记 Q̃ = φ(Q)、K̃ = φ(K)：每行 r 个特征；V 每行 dv 维；M 是因果掩码（只允许过去和当前）。整段一次算：A = (Q̃K̃ᵀ) ⊙ M，是 T × T 矩阵；Y = AV / rowsum(A)，除法按行广播。这里用贯穿的例子：三个词元，每个查询 φ(q) = [2, 1]。"),
    T("Row t: numerator Σᵢ≤ₜ (q̃ₜᵀk̃ᵢ) vᵢᵀ. Pull q̃ₜ out of the sum and it becomes q̃ₜᵀSₜ; the denominator becomes q̃ₜᵀzₜ. Same kernelized attention before and after; a finite φ is still not exp(qᵀk/√d). The rows equal the token loop's outputs.",
      "第 t 行：分子 Σᵢ≤ₜ (q̃ₜᵀk̃ᵢ) vᵢᵀ。把 q̃ₜ 提到求和外，就是 q̃ₜᵀSₜ；分母变成 q̃ₜᵀzₜ。重排前后是同一个核化注意力；有限维 φ 仍然不等于 exp(qᵀk/√d)。各行与逐词元循环的输出相同。")],
  build(root) {
    const d = DATA.dense, view = h("div", {});
    root.append(view);
    return (sub) => {
      const A = d.A.map((row, i) => row.map((x, j) => (d.mask[i][j] ? x : "")));
      const g = grid(A, { rowHeads: ["t=1", "t=2", "t=3"], colHeads: ["i=1", "i=2", "i=3"], sym: "A" });
      g.querySelectorAll(".cell:not(.head):not(.off)").forEach((c, n) => enter(c, 60 * n));
      put(view, formula("A = (Q̃K̃ᵀ) ⊙ M", "Y = (AV) / rowsum(A)"), h("div", { class: "row" }, box(h("span", { class: "sym sym-A" }, "A"), g),
        box("AV", grid(d.AV.map((x) => [x]), { sym: "v" })), box("rowsum(A)", grid(d.rowsum.map((x) => [x]))),
        box(h("span", { class: "sym sym-y" }, "Y"), grid(d.Y.map((x) => [fmt(x, 4)]), { sym: "y" })), sub === 1 ? box(tr(T("token loop", "逐词元循环")), grid(d.loop_y.map((x) => [fmt(x, 4)]), { sym: "y" })) : null));
      if (sub === 1) view.append(formula("yₜᵀ = q̃ₜᵀ Sₜ / q̃ₜᵀ zₜ"));
    };
  } });

scene({ id: "matrix", title: T("With 2-d values the state really is a matrix", "value 有两维时，状态真的是矩阵"),
  text: [T("k̃₁ = [1, 0], v₁ = [2, 1]; k̃₂ = [0, 1], v₂ = [4, 3]. Each token writes an outer product k̃vᵀ: one row per feature, one column per value channel. S = k̃₁v₁ᵀ + k̃₂v₂ᵀ, z = k̃₁ + k̃₂.",
      "k̃₁ = [1, 0]，v₁ = [2, 1]；k̃₂ = [0, 1]，v₂ = [4, 3]。每个词元写入一个外积 k̃vᵀ：每个特征一行，每个值通道一列。S = k̃₁v₁ᵀ + k̃₂v₂ᵀ，z = k̃₁ + k̃₂。"),
    T("Read with q̃ = [2, 1]: q̃ᵀS is a vector, q̃ᵀz a number, y = q̃ᵀS / q̃ᵀz. Term by term it is the same: the similarities 2 and 1 normalize to weights 2/3 and 1/3, and y = 2/3·[2, 1] + 1/3·[4, 3].",
      "用 q̃ = [2, 1] 读取：q̃ᵀS 是向量，q̃ᵀz 是一个数，y = q̃ᵀS / q̃ᵀz。逐项算也一样：相似度 2 和 1 归一化为权重 2/3 和 1/3，y = 2/3·[2, 1] + 1/3·[4, 3]。")],
  build(root) {
    const d = DATA.matrix, view = h("div", {});
    root.append(view);
    let gen = 0;
    return (sub) => {
      const my = ++gen;
      root.querySelectorAll(".traveller").forEach((el) => el.getAnimations().forEach((x) => x.cancel()));
      put(view, );
      if (sub === 0) {
        // k̃ as a column and vᵀ as a row sweep out the outer product cell by cell (cell (i, j) = kᵢvⱼ appears when kᵢ
        // and vⱼ light up together); the finished product then slides into S, whose cells change only when it lands.
        const cellsOf = (g) => [...g.querySelectorAll(".cell:not(.head)")];
        const tok = d.keys.map((k, t) => {
          const kg = grid(k.map((x) => [x]), { sym: "k" }), vg = grid([d.values[t]], { sym: "v" }), pg = grid([["·", "·"], ["·", "·"]], { sym: "S" });
          pg.id = "matrix-outer-" + (t + 1);
          const b = box("k̃" + "₁₂"[t] + "v" + "₁₂"[t] + "ᵀ", h("div", { class: "row outer" }, kg, h("span", { class: "op" }, "×"), vg, h("span", { class: "op" }, "="), pg));
          return { k: cellsOf(kg), v: cellsOf(vg), p: cellsOf(pg), pg, b, kg };
        });
        const Sg = grid([[0, 0], [0, 0]], { sym: "S", rowHeads: ["φ₁", "φ₂"] }), zg = grid([[0, 0]], { sym: "z" });
        Sg.id = "matrix-S";
        view.append(h("div", { class: "row" }, tok[0].b, tok[1].b), h("div", { class: "row" }, box("S = k̃₁v₁ᵀ + k̃₂v₂ᵀ", Sg), box("z = k̃₁ + k̃₂", zg)));
        const S = [[0, 0], [0, 0]], z = [0, 0], Sc = cellsOf(Sg), zc = cellsOf(zg);
        (async () => {
          for (let t = 0; t < 2; t++) {
            const o = d.outers[t], T_ = tok[t];
            for (let i = 0; i < 2; i++) for (let j = 0; j < 2; j++) {
              const lit = [{ backgroundColor: "#ffd98a" }, { backgroundColor: "#ffd98a", offset: 0.7 }, {}];
              anim(T_.k[i], lit, { duration: 300 });
              await done(anim(T_.v[j], lit, { duration: 300 }));
              if (my !== gen) return;
              land(T_.p[2 * i + j], fmt(o[i][j]), C.S);
            }
            // The product (and k̃ for z) travels into the state; S and z take their new values on arrival.
            await Promise.all([done(travel(root, T_.pg, Sg, C.S, 100, "k̃" + "₁₂"[t] + "v" + "₁₂"[t] + "ᵀ")), done(travel(root, T_.kg, zg, C.z, 250, "k̃" + "₁₂"[t]))]);
            if (my !== gen) return;
            for (let i = 0; i < 2; i++) { z[i] += d.keys[t][i]; land(zc[i], fmt(z[i]), C.z); for (let j = 0; j < 2; j++) { S[i][j] += o[i][j]; land(Sc[2 * i + j], fmt(S[i][j]), C.S); } }
          }
        })();
      } else {
        view.append(h("div", { class: "row" }, box("S", grid(d.S, { sym: "S" })), box("z", grid([d.z], { sym: "z" })),
          box("q̃ = " + vec(d.query), h("div", {}, fx("q̃ᵀS = " + vec(d.num))), h("div", {}, fx("q̃ᵀz = " + fmt(d.den))),
            h("div", { class: "big sym-y", id: "matrix-y" }, "y = [8/3, 5/3] ≈ " + vec(d.y, 4))),
          box(tr(T("term by term", "逐项")), barRow(fx("q̃ᵀk̃₁ = " + fmt(d.scores[0])), d.weights[0], 1, C.k), barRow(fx("q̃ᵀk̃₂ = " + fmt(d.scores[1])), d.weights[1], 1, C.k),
            h("div", { class: "muted" }, tr(T("weights ", "权重 ")) + "2/3, 1/3"))));
      }
    };
  } });

scene({ id: "tokens", title: T("Each token updates two accumulators", "每来一个词元，更新两个累加器"),
  text: [T("S keeps the associations between keys and values; z keeps the total key mass used to normalize. Both start at zero: S₀ = 0, z₀ = 0. Here φ(k) has 2 features and v one channel, so every number can be drawn.",
      "S 保存键与值的关联，z 保存用于归一化的键的总量。二者从零开始：S₀ = 0，z₀ = 0。这里 φ(k) 有 2 维、v 为 1 维，每个数都能画出来。"),
    T("Token 1: φ(k₁) = [1, 0], v₁ = 2. The outer product writes S = [2, 0] and z = [1, 0].", "词元 1：φ(k₁) = [1, 0]，v₁ = 2。外积写入后 S = [2, 0]，z = [1, 0]。"),
    T("Token 2: φ(k₂) = [0, 1], v₂ = 4. Added on: S = [2, 4], z = [1, 1]. The old tokens are not kept anywhere else.", "词元 2：φ(k₂) = [0, 1]，v₂ = 4。累加后 S = [2, 4]，z = [1, 1]。旧词元不再另外保存。"),
    T("Token 3: φ(k₃) = [1, 1], v₃ = 3 touches every cell: S = [5, 7], z = [2, 2].", "词元 3：φ(k₃) = [1, 1]，v₃ = 3，改动每个格子：S = [5, 7]，z = [2, 2]。"),
    T("The state is written up to position t before it is read, so the output at t includes the current token.", "先把状态更新到位置 t 再读取，所以位置 t 的输出包含当前词元。")],
  build(root) {
    // Two layouts of one diagram: side by side on a wide screen, tokens above the state on a phone.
    // Narrow: drawn at the column's width (1:1, text stays 14 px), the cards above the state.
    const d = DATA.tokens, vw = visualWidth(), narrow = vw < 560, NW = Math.max(300, Math.min(420, vw - 2)), third = (NW - 16) / 3;
    const G = narrow ? { W: NW, H: 330, card: (i) => [8 + third * i, 8], cw: third - 8, S: [Math.round(NW * 0.22), 150, 206], z: [Math.round(NW * 0.64), 150, 206], head: 138, note: [8, 292] }
      : { W: 720, H: 235, card: (i) => [20 + 120 * i, 40], cw: 104, S: [450, 50, 110], z: [590, 50, 110], head: 30, note: [20, 215] };
    const svg = s("svg", { viewBox: "0 0 " + G.W + " " + G.H, class: "diagram" + (narrow ? " fit" : ""), role: "img", id: "tokens-svg" });
    d.keys.forEach((k, i) => {
      const [x, y] = G.card(i), m = x + G.cw / 2;
      svg.append(s("rect", { x, y, width: G.cw, height: 84, rx: 8, class: "card", id: "tok-card-" + i }),
        s("text", { x: m, y: y + 22, "text-anchor": "middle" }, tr(UI.token) + " " + (i + 1)),
        s("text", { x: m, y: y + 46, "text-anchor": "middle", class: "sym-k" }, "φ(k)=" + vec(k)), s("text", { x: m, y: y + 70, "text-anchor": "middle", class: "sym-v" }, "v=" + fmt(d.values[i])));
    });
    const cells = {};
    const cell = (key, x, y, label) => {
      const r = s("rect", { x, y, width: 74, height: 46, rx: 6, class: "cellsvg cell-" + key[0] }), t = s("text", { x: x + 37, y: y + 30, "text-anchor": "middle", class: "num" }, "0");
      svg.append(r, t, s("text", { x: x - 8, y: y + 30, "text-anchor": "end", class: "muted-svg" }, label));
      t.setAttribute("id", "tokens-cell-" + key);
      cells[key] = { r, t, c: [x + 37, y + 23] };
    };
    svg.append(s("text", { x: G.S[0] + 37, y: G.head, "text-anchor": "middle", class: "big-svg sym-S" }, "S"), s("text", { x: G.z[0] + 37, y: G.head, "text-anchor": "middle", class: "big-svg sym-z" }, "z"));
    cell("S0", G.S[0], G.S[1], "φ₁"); cell("S1", G.S[0], G.S[2], "φ₂"); cell("z0", G.z[0], G.z[1], ""); cell("z1", G.z[0], G.z[2], "");
    const arrows = s("g", {}), note = s("text", { x: G.note[0], y: G.note[1], class: "num" }, ""), note2 = s("text", { x: G.note[0], y: G.note[1] + 26, class: "num" }, "");
    svg.append(arrows, note, note2);
    root.append(svg);
    let gen = 0;  // a step's pending arrivals are void once another step is shown
    return (sub) => {
      const t = Math.min(sub, 3), S = t ? d.S[t - 1] : zeros(2, 1), z = t ? d.z[t - 1] : [0, 0];
      const S0 = t > 1 ? d.S[t - 2] : zeros(2, 1), z0 = t > 1 ? d.z[t - 2] : [0, 0], my = ++gen;
      svg.querySelectorAll(".flow").forEach((g) => g.getAnimations().forEach((a) => a.cancel()));
      d.keys.forEach((_, i) => svg.getElementById("tok-card-" + i).setAttribute("class", "card" + (i === t - 1 && sub <= 3 ? " active" : "")));
      const writing = sub >= 1 && sub <= 3;
      // A cell keeps its old number until the token's contribution reaches it.
      const value = { S0: [S[0][0], S0[0][0]], S1: [S[1][0], S0[1][0]], z0: [z[0], z0[0]], z1: [z[1], z0[1]] };
      Object.entries(value).forEach(([key, [x, before]]) => { cells[key].t.textContent = fmt(writing ? before : x); });
      const landAt = (key, flash = true) => () => {
        if (my !== gen) return;
        if (--pending === 0) spell();
        cells[key].t.textContent = fmt(value[key][0]);
        if (flash) anim(cells[key].r, [{ fill: key[0] === "S" ? C.S : C.z }, {}], { duration: 500 });
      };
      const sb = "₀₁₂₃"[t], now = "S = " + vec(S.map((r) => r[0])) + ", z = " + vec(z);
      const write = sub >= 1 && sub <= 3 ? "+ φ(k" + sb + ")v" + sb + "ᵀ = " + vec(d.keys[t - 1].map((x) => x * d.values[t - 1])) + ",  + φ(k" + sb + ") = " + vec(d.keys[t - 1]) : "";
      // The new state is spelled out once every contribution has landed.
      const spell = () => { note.textContent = write ? write + (narrow ? "" : "  →  " + now) : sub === 4 ? now : "S₀ = 0, z₀ = 0"; note2.textContent = write && narrow ? "→  " + now : ""; };
      note.textContent = write || (sub === 4 ? now : "S₀ = 0, z₀ = 0"); note2.textContent = "";
      let pending = writing ? 4 : 0;
      if (!writing) spell();
      arrows.replaceChildren();
      if (sub >= 1 && sub <= 3) {  // where this token writes: φ(k)vᵀ into S, φ(k) into z (drawn still, animated too)
        const [x, y] = G.card(t - 1), m = x + G.cw / 2;
        if (narrow) {
          arrows.append(s("path", { d: `M${m} ${y + 84} C ${m} 120, ${G.S[0] + 37} 110, ${G.S[0] + 37} ${G.head - 24}`, stroke: C.S, "stroke-width": 2.5, fill: "none", opacity: 0.6 }),
            s("path", { d: `M${m} ${y + 84} C ${m} 120, ${G.z[0] + 37} 110, ${G.z[0] + 37} ${G.head - 24}`, stroke: C.z, "stroke-width": 2.5, fill: "none", opacity: 0.6, "stroke-dasharray": "6 4" }));
        } else {
          d.keys[t - 1].forEach((kv, i) => { if (kv) {
            const cy = cells["S" + i].c[1];
            arrows.append(s("path", { d: `M${x + G.cw} ${y + 42} C ${x + 170} ${y + 42}, 400 ${cy}, 448 ${cy}`, stroke: C.S, "stroke-width": 2.5, fill: "none", opacity: 0.6 }));
          } });
          const zx = cells.z1.c[0];
          arrows.append(s("path", { d: `M${m} ${y + 84} C ${m} 185, ${zx} 200, ${zx} 158`, stroke: C.z, "stroke-width": 2.5, fill: "none", opacity: 0.6, "stroke-dasharray": "6 4" }),
            s("text", { x: 400, y: 44, "text-anchor": "middle", class: "sym-S" }, "φ(k)vᵀ"), s("text", { x: zx + 44, y: 185, class: "sym-z" }, "φ(k)"));
        }
        // φ(k)ᵢ·v travels to S's row i, φ(k)ᵢ to z's entry i: around the other cards (over them on a wide screen).
        d.keys[t - 1].forEach((kv, i) => {
          const Sc = cells["S" + i].c, zc = cells["z" + i].c, from = [m, y + 60];
          const viaS = narrow ? [from, [m, y + 100], [Sc[0], y + 100], Sc] : [from, [m, 26], [420, 26], [420, Sc[1]], Sc];
          const viaZ = narrow ? [from, [m, y + 100], [zc[0], y + 100], zc] : [from, [m, 178], [560, 178], [560, zc[1]], zc];
          if (kv) {
            [[viaS, C.S, 250 * i, fmt(kv * d.values[t - 1]), "S" + i], [viaZ, C.z, 120 + 250 * i, fmt(kv), "z" + i]].forEach(([path, color, delay, label, key]) => {
              const a = flow(svg, path, color, delay, label, landAt(key));
              if (a) a.effect.target.dataset.to = key;  // which cell this contribution is for
            });
          }
          else { landAt("S" + i, false)(); landAt("z" + i, false)(); }  // φ(k)ᵢ = 0: nothing travels, nothing lands
        });
      }
    };
  } });

scene({ id: "read", title: T("A query reads numerator and denominator together", "查询时，分子和分母一起读"),
  text: [T("Keep the state just built: S = [5, 7], z = [2, 2]; the query is φ(q) = [2, 1]. The query does not fetch any old token: it multiplies the fixed-size S and z, twice.",
      "沿用刚才的状态：S = [5, 7]，z = [2, 2]；当前 φ(q) = [2, 1]。查询不需要取回任何旧词元：只对固定大小的 S 和 z 做两次乘法。"),
    T("Numerator = 2 × 5 + 1 × 7 = 17. Denominator = 2 × 2 + 1 × 2 = 6.", "分子 = 2 × 5 + 1 × 7 = 17。分母 = 2 × 2 + 1 × 2 = 6。"),
    T("y = 17 / 6 ≈ 2.83. The denominator turns a total contribution into a weighted average, so the output does not grow just because the history got longer. Real implementations guard a denominator near zero, for instance with ε.",
      "y = 17 / 6 ≈ 2.83。分母把“总贡献”变成“加权平均”，输出不会仅仅因为历史变长而变大。实际实现会防护接近 0 的分母，例如加上 ε。")],
  build(root) {
    const d = DATA.tokens, view = h("div", {});
    root.append(view);
    let gen = 0;
    return (sub) => {
      const S = d.S[2].map((r) => r[0]), z = d.z[2], q = d.query, my = ++gen;
      root.querySelectorAll(".traveller").forEach((el) => el.getAnimations().forEach((a) => a.cancel()));
      // φ(q)ᵀS: φ(q) is a row, S a column (one row per feature); qᵢ scales S's row i, the products sum to the numerator.
      const qg = grid([q], { sym: "q", colHeads: ["φ₁", "φ₂"] });
      const Sg = grid(S.map((x) => [x]), { sym: "S", rowHeads: ["φ₁", "φ₂"] }), zg = grid(z.map((x) => [x]), { sym: "z", rowHeads: ["φ₁", "φ₂"] });
      const prod = (a, b) => a.map((x, i) => fmt(x) + " × " + fmt(b[i])).join(" + ");
      const numV = h("div", { class: "big", id: "read-num" }, prod(q, S) + " = " + (sub >= 1 ? "…" : ""));
      const denV = h("div", { class: "big", id: "read-den" }, prod(q, z) + " = " + (sub >= 1 ? "…" : ""));
      const numB = box(ui("num") + "  φ(q)ᵀS", numV), denB = box(ui("den") + "  φ(q)ᵀz", denV);
      put(view, h("div", { class: "row" }, box("φ(q)", qg), box("S", Sg), box("z", zg)),
        sub >= 1 ? h("div", { class: "row" }, numB, denB) : null,
        sub === 2 ? h("div", { class: "big result sym-y", id: "read-y" }, "y = 17/6 ≈ " + fmt(d.y_final, 4)) : null);
      if (sub === 0) return;
      const cellsOf = (g) => [...g.querySelectorAll(".cell:not(.head)")];
      const [q1, q2] = cellsOf(qg), Sc = cellsOf(Sg), zc = cellsOf(zg);
      if (sub === 2) { numV.textContent = prod(q, S) + " = " + fmt(d.num); denV.textContent = prod(q, z) + " = " + fmt(d.den); enter(view.querySelector("#read-y"), 0); return; }
      // Each qᵢ goes to row i of S and of z; each product then goes into its sum, which shows its total when both are in.
      let inNum = 0, inDen = 0;
      const sumNum = () => { if (my === gen && ++inNum === 2) land(numV, prod(q, S) + " = " + fmt(d.num), C.q); };
      const sumDen = () => { if (my === gen && ++inDen === 2) land(denV, prod(q, z) + " = " + fmt(d.den), C.q); };
      [q1, q2].forEach((qc, i) => {
        travel(root, qc, Sc[i], C.q, 350 * i, "×" + fmt(q[i]), () => my === gen && travel(root, Sc[i], numV, C.S, 0, fmt(q[i] * S[i]), sumNum));
        travel(root, qc, zc[i], C.q, 150 + 350 * i, "×" + fmt(q[i]), () => my === gen && travel(root, zc[i], denV, C.z, 0, fmt(q[i] * z[i]), sumDen));
      });
    };
  } });

scene({ id: "whyz", title: T("Without z the output grows with repetition", "没有 z，输出会随重复次数增长"),
  text: [T("Repeat one identical pair m times: every similarity is a > 0 and the value v. Numerator m·a·v, denominator m·a, so y = v whatever m. Keep only the numerator and the output is m·a·v: twice the history, twice the output. Here φ(k) = [1, 1], v = 3, φ(q) = [2, 1], so a = 3. Some modern linear models use other normalizations, gates or an output norm and no z: they are other, well-defined models; do not mix their formulas.",
    "把同一对键值重复 m 次：每次相似度都是 a > 0，值为 v。分子 m·a·v，分母 m·a，所以无论 m 多大 y = v。只保留分子时输出是 m·a·v：历史翻倍，输出也翻倍。这里 φ(k) = [1, 1]，v = 3，φ(q) = [2, 1]，所以 a = 3。一些现代线性模型用别的归一化、门控或输出 norm，没有 z：它们是另外定义明确的模型，不要混用公式。")],
  build(root) {
    const d = DATA.whyz, out = h("div", {});
    const slider = h("input", { type: "range", id: "whyz-m", min: 1, max: d.rows.length, value: 3, oninput: quietly(() => draw()) });
    const label = h("output", { id: "whyz-m-value" }, "3");
    root.append(h("label", { class: "control" }, "m = ", slider, " ", label), out);
    const draw = () => {
      const m = Number(slider.value), max = d.rows[d.rows.length - 1].unnormalized, row = d.rows[m - 1];
      label.textContent = String(m);
      put(out, box("m = " + m, barRow(fx(tr(T("y with z", "有 z 的 y"))), row.normalized, max, C.y), barRow(fx(tr(T("y, numerator only", "只有分子的 y"))), row.unnormalized, max, C.err)));
    };
    return draw;
  } });

scene({ id: "eps", title: T("ε guards the division, and changes small denominators", "ε 是数值保护，也会改变很小分母的结果"),
  text: [T("y = numerator / (denominator + ε). Take numerator 2×10⁻⁶ over denominator 10⁻⁶: the exact ratio is 2. With ε = 10⁻⁶ the result becomes 1; with ε = 10⁻⁸ it is about 1.9802. Nonnegative φ stops positive and negative weights from cancelling, but when every feature is near 0 the denominator can still be tiny. Watch the range of the denominators, the state's precision and NaNs rather than raising ε.",
      "y = 分子 / (分母 + ε)。取分子 2×10⁻⁶、分母 10⁻⁶：精确比值为 2。ε = 10⁻⁶ 时结果变成 1；ε = 10⁻⁸ 时约为 1.9802。非负的 φ 防止正负权重相消，但所有特征都接近 0 时分母仍可能很小。与其盲目增大 ε，不如监测分母的范围、状态精度和 NaN。"),
    T("Adding ε and clamping, max(denominator, ε), are different functions. One token with feature d and value 3, read by q = 1: the exact answer is 3 for every d > 0. The implementation, the training run and the reference must use the same definition. Pick another ε: the page's engine recomputes the table.",
      "加上 ε 与截断 max(分母, ε) 是不同的函数。一个词元，特征为 d、值为 3，用 q = 1 读取：对任何 d > 0 精确答案都是 3。实现、训练和参考计算必须使用同一种定义。换一个 ε：页面的计算引擎会重算这张表。")],
  build(root) {
    const d = DATA.eps, view = h("div", {});
    root.append(view);
    const read = (den, eps, mode) => run({ rule: "accumulate", q: [1], k: [[den]], v: [[d.value]], eps, eps_mode: mode }).y[0][0];
    return (sub) => {
      put(view, );
      if (sub === 0) {
        const c = d.case, max = 2;
        view.append(formula("y = " + tr(T("numerator", "分子")) + " / (" + tr(T("denominator", "分母")) + " + ε)"),
          box(ui("num") + " = " + fmt(c.num) + ", " + ui("den") + " = " + fmt(c.den) + ", " + ui("exact") + " = 2",
            ...c.reads.map((r) => barRow("ε = " + fmt(r.eps) + " " + tr(r.mode === "add" ? T("add", "加上") : T("clamp", "截断")), r.y, max, r.mode === "add" ? C.err : C.other, "eps-" + r.mode + "-" + r.eps)),
            h("div", { class: "big", id: "eps-case" }, "ε = 1e-6: " + fmt(c.reads[0].y, 5) + "; ε = 1e-8: " + fmt(c.reads[2].y, 5))));
      } else {
        const tbl = h("div", {});
        const draw = (eps) => {
          const rows = d.rows.map((r) => (eps === d.eps ? r : { den: r.den, add: read(r.den, eps, "add"), clamp: read(r.den, eps, "clamp") }));
          put(tbl, table(["d = q·z", tr(T("add: d + ε", "加上：d + ε")), tr(T("clamp: max(d, ε)", "截断：max(d, ε)")), ui("exact")], rows.map((r) => [fmt(r.den), fmt(r.add, 6), fmt(r.clamp, 6), fmt(d.value)]), { id: "eps-table" }));
        };
        const choice = h("select", { id: "eps-choice", onchange: (e) => draw(Number(e.target.value)) }, [1e-3, d.eps, 1e-9, 1e-12].map((x) => h("option", { value: x, selected: x === d.eps }, fmt(x))));
        view.append(h("label", { class: "control" }, "ε = ", choice), tbl);
        draw(d.eps);
      }
    };
  } });

scene({ id: "shapes", title: T("Every dimension in the formula", "公式里的每个维度"),
  text: [T("Sₜ = Sₜ₋₁ + φ(kₜ)vₜᵀ,  zₜ = zₜ₋₁ + φ(kₜ),  yₜᵀ = φ(qₜ)ᵀSₜ / φ(qₜ)ᵀzₜ. φ(k) has dφ entries and v has dv: S is a dφ × dv matrix, z a vector of dφ.",
      "Sₜ = Sₜ₋₁ + φ(kₜ)vₜᵀ，zₜ = zₜ₋₁ + φ(kₜ)，yₜᵀ = φ(qₜ)ᵀSₜ / φ(qₜ)ᵀzₜ。φ(k) 有 dφ 维，v 有 dv 维：S 是 dφ × dv 矩阵，z 是 dφ 维向量。"),
    T("Why \"linear\": with these sizes fixed, each token's update and read cost the same however long the history is, so the total work grows linearly with the number of tokens (softmax attention's grows with its square).",
      "为什么叫“线性”：固定这些维度后，每个词元的更新与读取的工作量不随历史长度变化，总工作量随词元数线性增长（softmax 注意力随其平方增长）。")],
  build(root) {
    const view = h("div", {});
    root.append(view);
    return (sub) => {
      // Narrow: the same shapes squeezed sideways (text keeps its size) and the tokens on a row below.
      const narrow = visualWidth() < 560, f = narrow ? 0.62 : 1, X = (x) => x * f, W = narrow ? Math.max(300, visualWidth() - 2) : 720, H = narrow ? 300 : 220;
      const svg = s("svg", { viewBox: "0 0 " + W + " " + H, class: "diagram", role: "img", id: "shapes-svg" });
      svg.append(s("rect", { x: X(20), y: 40, width: X(30), height: 120, class: "state-k" }), s("text", { x: X(35), y: 180, "text-anchor": "middle", class: "sym-k" }, "φ(k)"), s("text", { x: X(35), y: 30, "text-anchor": "middle" }, "dφ"),
        s("text", { x: X(70), y: 105 }, "×"), s("rect", { x: X(90), y: 85, width: X(100), height: 30, class: "state-v" }), s("text", { x: X(140), y: 135, "text-anchor": "middle", class: "sym-v" }, "vᵀ"), s("text", { x: X(140), y: 78, "text-anchor": "middle" }, "dv"),
        s("text", { x: X(215), y: 105 }, "→"), s("rect", { x: X(245), y: 40, width: X(100), height: 120, class: "state-S" }), s("text", { x: X(295), y: 108, "text-anchor": "middle", class: "big-svg sym-S" }, "S"), s("text", { x: X(295), y: 180, "text-anchor": "middle" }, "dφ × dv"),
        s("rect", { x: X(375), y: 40, width: X(30), height: 120, class: "state-z" }), s("text", { x: X(390), y: 180, "text-anchor": "middle", class: "sym-z" }, "z: dφ"));
      if (sub === 1) {
        const tx = (i) => (narrow ? 10 + 46 * i : 440 + 44 * i), ty = narrow ? 205 : 70, cap = narrow ? [W / 2, 290] : [560, 160];
        [0, 1, 2, 3, 4, 5].forEach((i) => {
          const r = s("rect", { x: tx(i), y: ty, width: 38, height: 60, rx: 4, class: "card" });
          svg.append(r, s("text", { x: tx(i) + 19, y: ty + 35, "text-anchor": "middle" }, "t" + (i + 1)));
          anim(r, [{ opacity: 0 }, { opacity: 1 }], { duration: 300, delay: 80 * i });
        });
        svg.append(s("text", { x: cap[0], y: cap[1], "text-anchor": "middle" }, tr(T("same cost per token → total ∝ T", "每个词元成本相同 → 总量 ∝ T"))));
      }
      put(view, formula("Sₜ = Sₜ₋₁ + φ(kₜ) vₜᵀ", "zₜ = zₜ₋₁ + φ(kₜ)", "yₜᵀ = φ(qₜ)ᵀSₜ / φ(qₜ)ᵀzₜ"), svg);
    };
  } });

scene({ id: "memory", title: T("A fixed-size state need not be small", "固定大小的状态也可能不小"),
  text: [T("B requests, L layers, H state heads; each head keeps S of r × dv and z of r: M_state = B × L × H × (r·dv + r) × b bytes. One request, 32 layers, 16 heads, r = dv = 128, a float32 state: 512 × (16384 + 128) × 4 = 33,816,576 bytes = 32.25 MiB, whatever the history length. A short convolution's state, cached gates or full-attention layers add on top. Edit the fields: the page uses linattn.tools.memory's formulas.",
      "B 个请求、L 层、H 个状态头；每个头保存 r × dv 的 S 和 r 维的 z：M_state = B × L × H × (r·dv + r) × b 字节。单请求、32 层、16 个头、r = dv = 128、float32 状态：512 × (16384 + 128) × 4 = 33,816,576 字节 = 32.25 MiB，与历史长度无关。短卷积的状态、门控缓存或 full-attention 层要另外加上。可以修改下面的数值：页面使用与 linattn.tools.memory 相同的公式。")],
  build(root) {
    const d = DATA.memory, inp = Object.assign({}, d.inputs), out = h("div", {});
    const NAMES = { B: T("B requests", "B 请求数"), L: T("L layers", "L 层数"), H: T("H heads", "H 头数"), r: T("r features", "r 特征数"), dv: T("dv", "dv 值维度"),
      state_dtype: T("state dtype", "状态 dtype"), kv_heads: T("KV heads", "KV 头数"), head_dim: T("head dim", "头维度"), kv_dtype: T("KV dtype", "KV dtype") };
    const field = (key) => h("label", { class: "control" }, tr(NAMES[key]) + " ", h("input", { type: "number", min: 1, step: 1, value: inp[key], id: "mem-" + key, oninput: (e) => {
      const x = Math.floor(Number(e.target.value));
      e.target.classList.toggle("bad", !(x >= 1));  // an empty or zero field computes nothing
      if (x >= 1) { inp[key] = x; draw(); }
    } }));
    const dsel = (key) => h("label", { class: "control" }, tr(NAMES[key]) + " ", h("select", { id: "mem-" + key, onchange: (e) => { inp[key] = e.target.value; draw(); } },
      Object.keys(d.dtype_bytes).map((n) => h("option", { value: n, selected: n === inp[key] }, n))));
    root.append(h("div", { class: "controls" }, ["B", "L", "H", "r", "dv"].map(field), dsel("state_dtype")), h("div", { class: "controls" }, ["kv_heads", "head_dim"].map(field), dsel("kv_dtype")), out);
    const draw = () => {
      // BigInt: exact integers past 2^53, like linattn.tools.memory's Python ints.
      const N = (key) => BigInt(inp[key]), b = BigInt(d.dtype_bytes[inp.state_dtype]), kb = BigInt(d.dtype_bytes[inp.kv_dtype]);
      const perHead = (N("r") * N("dv") + N("r")) * b, kvTok = 2n * N("head_dim") * kb, total = N("B") * N("L") * N("H") * perHead;
      const mib = Number(total) / 1048576;
      put(out, h("div", { class: "row" }, box(tr(T("state, all layers and heads", "状态，全部层与头")), h("div", { class: "big", id: "mem-state" }, bytes(total) + tr(T(" bytes", " 字节"))), h("div", {}, "= " + fmt(mib, 4) + " MiB")),
        box(tr(T("per head", "每个头")), h("div", {}, tr(T("state ", "状态 ")) + bytes(perHead) + tr(T(" B", " 字节"))), h("div", {}, "KV " + bytes(kvTok) + tr(T(" B per token", " 字节/词元"))),
          h("div", { class: "big", id: "mem-cross" }, "T = " + bytes((perHead + kvTok - 1n) / kvTok)))));
    };
    draw();
    return () => enter(out, 0);
  } });

scene({ id: "crossover", title: T("For short sequences the state is not smaller", "短序列时，线性状态未必更省"),
  text: [T("One head against one head: a bfloat16 KV cache with 128-wide K and V, a float32 state with r = dv = 128. KV bytes = 2 × T × 128 × 2 = 512T; state bytes = (128×128 + 128) × 4 = 66,048. They are equal at T = 66,048 / 512 = 129.",
      "按同一个头比较：bfloat16 的 KV 缓存，K、V 各 128 维；float32 的线性状态，r = dv = 128。KV 字节 = 2 × T × 128 × 2 = 512T；状态字节 = (128×128 + 128) × 4 = 66,048。二者相等于 T = 66,048 / 512 = 129。"),
    T("At T = 32 the KV cache is only 16 KiB while the state is about 64.5 KiB; at T = 8192 the cache is 4 MiB and the fixed state's advantage is plain. This is a storage crossover, not a speed crossover: feature maps, projections, state reads and writes and kernel shapes all decide the speed.",
      "T = 32 时 KV 缓存只有 16 KiB，线性状态约 64.5 KiB；T = 8192 时缓存是 4 MiB，固定状态的优势才明显。这只是存储上的交点，不是速度上的交点：特征映射、投影、状态读写和 kernel 形状都会影响实际速度。")],
  build(root) {
    const d = DATA.memory, view = h("div", {});
    root.append(view);
    return (sub) => {
      const st = d.per_head_state_bytes, kv = d.per_head_kv_bytes_per_token, c = d.crossover;
      const far = sub === 0 ? 2 * c : 8192, Ts = sub === 0 ? [0, far / 4, far / 2, 3 * far / 4, far] : [8, 16, 32, 64, 129, 256, 512, 1024, 2048, 4096, 8192];
      const marks = sub === 0 ? [{ x: c, label: "T = " + c }] : [{ x: 32, label: "T = 32" }, { x: 8192, label: "T = 8192", row: 1 }];
      put(view, lineChart([{ points: Ts.map((t) => [t, t * kv]), color: C.k, label: tr(T("KV cache (bfloat16)", "KV 缓存（bfloat16）")) },
        { points: Ts.map((t) => [t, st]), color: C.S, label: tr(T("state (float32)", "状态（float32）")) }], sub === 0 ? { xlabel: "T", ylabel: tr(T("bytes per head", "每个头的字节数")), marks, xticks: [0, c, far], yticks: [0, st, far * kv] }
          : { xlabel: "T", ylabel: tr(T("bytes per head (log scale)", "每个头的字节数（对数刻度）")), marks, xticks: [8, 4096, 8192], yticks: [4096, st, far * kv], logy: true }),
        h("div", { class: "row" }, box("T = 32", h("div", { class: "big" }, "KV " + fmt(d.kv_at["32"] / 1024) + " KiB"), h("div", {}, tr(UI.state) + " " + fmt(st / 1024) + " KiB")),
          box("T = 129", h("div", { class: "big" }, "KV " + bytes(d.kv_at["129"]) + " B"), h("div", {}, tr(UI.state) + " " + bytes(st) + " B")),
          sub === 1 ? box("T = 8192", h("div", { class: "big" }, "KV " + fmt(d.kv_at["8192"] / 1048576) + " MiB"), h("div", {}, tr(UI.state) + " " + fmt(st / 1024) + " KiB")) : null));
    };
  } });

scene({ id: "gates", title: T("A gate: let old memories fade", "加一个门：让旧记忆逐渐淡出"),
  text: [T("Pure accumulation squeezes more and more into the same state, and old and new writes interfere. A gate 0 ≤ α ≤ 1 first shrinks the old state to αS, then the new φ(k)vᵀ is added; z is gated the same way in this normalized example. Features 1, values 2, 4, 8, α = 0.5: S goes 2 → 5 → 10.5, z 1 → 1.5 → 1.75. Move α: the page's engine recomputes.",
      "纯累加会把越来越多的内容挤进同一个状态，新旧写入互相干扰。门控 0 ≤ α ≤ 1 先把旧状态缩为 αS，再加入新的 φ(k)vᵀ；在这个归一化示例里 z 也用同样的门。特征为 1，值依次为 2、4、8，α = 0.5：S 从 2 → 5 → 10.5，z 从 1 → 1.5 → 1.75。移动 α：页面的计算引擎会重算。"),
    T("An old token's weight is the product of every gate after it: token i at time t carries αᵢ₊₁⋯αₜ. Smaller α forgets faster, α near 1 keeps longer. Modern gated models use vector gates, other normalizations and richer updates.",
      "旧词元的权重是它之后所有门值的乘积：词元 i 在时刻 t 的权重是 αᵢ₊₁⋯αₜ。α 越小遗忘越快，接近 1 则保留更久。现代门控模型还会用向量门、不同的归一化和更复杂的状态更新。")],
  build(root) {
    const d = DATA.gates;
    // The slider is built once and never moved (a rebuilt slider drops the drag); only the picture below redraws.
    const slider = h("input", { type: "range", id: "gate-alpha", min: 0, max: 1, step: 0.05, value: 0.5 }), shown = h("output", { id: "gate-alpha-value" }, "0.5");
    const head = h("div", {}), view = h("div", {});
    root.append(head, h("label", { class: "control" }, fx("α = "), slider, " ", shown), view);
    let sub = -1;
    const draw = (entering) => {
      const a = Number(slider.value);
      shown.textContent = fmt(a);
      // At the scripted α the numbers are the reference's; another α is the page's engine.
      const res = a === d.alpha[0] ? d : run({ rule: "gated", q: [1], k: [[1], [1], [1]], v: d.values.map((x) => [x]), alpha: [a, a, a], eps: 0 });
      const S = res.S.map((m) => m[0][0]), z = res.z.map((x) => x[0]), max = 16;
      if (sub === 0) {
        const rows = S.map((x, t) => {
          const prev = t ? S[t - 1] : 0, shrunk = a * prev, pc = (y) => (100 * y / max).toFixed(1) + "%";
          const bar = h("span", { class: "bar", style: "background:" + C.S + ";width:" + pc(x) });
          // The old state shrinks to αS first, then the write adds on top (only when the step is entered).
          if (entering) anim(bar, [{ width: pc(prev) }, { width: pc(prev), offset: 0.2 }, { width: pc(shrunk), offset: 0.55 }, { width: pc(x) }], { duration: 1400, delay: 700 * t, easing: "ease-in-out" });
          return h("div", { class: "barrow" }, h("span", { class: "barlabel" }, fx("t" + (t + 1) + ": " + (t ? "α·" + fmt(prev) + " + " + d.values[t] : String(d.values[t])))), h("span", { class: "bartrack" }, bar),
            h("span", { class: "barval" }, h("span", { class: "sym-S" }, "S=" + fmt(x)), "  ", h("span", { class: "sym-z" }, "z=" + fmt(z[t]))));
        });
        put(view, box(tr(T("state after each token", "每个词元之后的状态")), ...rows),
          h("div", { class: "big", id: "gate-seq" }, "S: " + S.map((x) => fmt(x)).join(" → ") + "; z: " + z.map((x) => fmt(x)).join(" → ")));
      } else {
        const w = [0, 1, 2].map((t) => [0, 1, 2].map((i) => (i <= t ? Math.pow(a, t - i) : "")));
        const g = grid(w, { rowHeads: ["t=1", "t=2", "t=3"], colHeads: ["i=1", "i=2", "i=3"], sym: "gate" });
        g.querySelectorAll(".cell:not(.head):not(.off)").forEach((c) => { const x = Number(c.textContent); c.style.background = "rgba(0,131,143," + (0.12 + 0.6 * x).toFixed(2) + ")"; });
        put(view, box(tr(T("weight of token i (columns) at time t (rows)", "词元 i（列）在时刻 t（行）的权重")), g));
      }
    };
    slider.addEventListener("input", quietly(() => draw(false)));
    return (n) => {
      if (n !== sub) put(head, n === 0 ? formula("S = αS + φ(k)vᵀ", "z = αz + φ(k)") : formula(tr(T("weight(i, t) = αᵢ₊₁ ⋯ αₜ", "权重(i, t) = αᵢ₊₁ ⋯ αₜ"))));
      sub = n; draw(true);
    };
  } });

scene({ id: "scan", title: T("Why a gated recurrence can run as a parallel scan", "门控递推为什么能做并行扫描"),
  text: [T("Write one update as an affine map f(S) = αS + B with B = k̃vᵀ. Two neighbours merge into one: f₂(f₁(S)) = α₂(α₁S + B₁) + B₂ = (α₂α₁)S + (α₂B₁ + B₂), so (α₂, B₂) ∘ (α₁, B₁) = (α₂α₁, α₂B₁ + B₂).",
      "把一次更新写成仿射变换 f(S) = αS + B，其中 B = k̃vᵀ。相邻两步可以合成一步：f₂(f₁(S)) = α₂(α₁S + B₁) + B₂ = (α₂α₁)S + (α₂B₁ + B₂)，即 (α₂, B₂) ∘ (α₁, B₁) = (α₂α₁, α₂B₁ + B₂)。"),
    T("Composition is associative, so a tree merges the pairs and yields every prefix, not only the root: each token's state comes out. Four tokens, α = 0.5, writes 2, 4, 8, 16; the prefixes equal the token loop.",
      "函数复合满足结合律，所以可以树形合并，并求出每个前缀，而不只是根：每个词元的状态都能得到。四个词元，α = 0.5，写入 2、4、8、16；各前缀等于逐词元循环。"),
    T("Order matters: a later gate decays earlier writes, so the two maps cannot be swapped. z composes the same way with B replaced by k̃. A scan shortens the dependency chain; the traffic of intermediate states and the matrix sizes still decide the speed.",
      "顺序不能交换：后来的门会衰减之前的写入。z 用同样的组合，只把 B 换成 k̃。并行扫描缩短依赖链；中间状态的流量与矩阵维度仍然决定效率。")],
  build(root) {
    const sc = DATA.gates.scan, view = h("div", {});
    root.append(view);
    const pair = (p) => "(" + fmt(p.a) + ", " + fmt(p.B) + ")";
    return (sub) => {
      put(view, );
      if (sub === 0) { view.append(formula("f₂(f₁(S)) = α₂(α₁S + B₁) + B₂", "= (α₂α₁) S + (α₂B₁ + B₂)", "(α₂, B₂) ∘ (α₁, B₁) = (α₂α₁, α₂B₁ + B₂)")); view.querySelectorAll(".formula > div").forEach((el, i) => enter(el, 200 * i)); return; }
      if (sub === 1) {
        // Sized to its column (1:1, so text stays 14 px on a phone). Each merge happens when both children's pairs have
        // travelled up into their parent: only then does the parent show its composed pair.
        const W = Math.max(320, Math.min(720, visualWidth() - 2)), nw = Math.min(140, W / 4 - 8), small = W < 560;
        const svg = s("svg", { viewBox: "0 0 " + W + " 300", class: "diagram", role: "img", id: "scan-tree" });
        const node = (x, y, p, label, waiting) => {
          const val = s("text", { x, y: y + 40, "text-anchor": "middle", class: "num", style: small ? "font-size:15px" : null }, waiting ? "…" : pair(p));
          svg.append(s("g", {}, s("rect", { x: x - nw / 2, y, width: nw, height: 48, rx: 7, class: "card" }), s("text", { x, y: y + 17, "text-anchor": "middle" }, label), val));
          return { x, y, val, p };
        };
        const xs = [1, 3, 5, 7].map((i) => (W * i) / 8), mid = [W / 4, (3 * W) / 4];
        [0, 1].forEach((i) => svg.append(s("path", { d: `M${mid[i]} 150 L${xs[2 * i]} 196 M${mid[i]} 150 L${xs[2 * i + 1]} 196`, class: "edge" })));
        svg.append(s("path", { d: `M${W / 2} 64 L${mid[0]} 106 M${W / 2} 64 L${mid[1]} 106`, class: "edge" }));
        const leaves = xs.map((x, i) => node(x, 196, sc.leaves[i], small ? "t" + (i + 1) : tr(UI.token) + " " + (i + 1), false));
        const lv = [node(mid[0], 106, sc.level1[0], "2∘1", true), node(mid[1], 106, sc.level1[1], "4∘3", true)];
        const root = node(W / 2, 20, sc.root, "(4∘3)∘(2∘1)", true);
        const merge = (kids, parent, delay, then) => {
          let n = 0;
          kids.forEach((k) => flow(svg, [[k.x, k.y + 10], [parent.x, parent.y + 30]], C.gate, delay, null, () => {
            if (++n === kids.length) { parent.val.textContent = pair(parent.p); anim(parent.val, [{ opacity: 0 }, { opacity: 1 }], { duration: 300 }); if (then) then(); }
          }));
        };
        let done = 0;
        merge(leaves.slice(0, 2), lv[0], 200, () => { if (++done === 2) merge(lv, root, 100); });
        merge(leaves.slice(2), lv[1], 200, () => { if (++done === 2) merge(lv, root, 100); });
        svg.append(s("text", { x: W / 2, y: 272, "text-anchor": "middle" }, tr(T("prefix 3 = token 3 ∘ (2∘1)", "前缀 3 = 词元 3 ∘ (2∘1)"))));
        view.append(svg, table([tr(T("prefix", "前缀")), "(α, B)", tr(T("token loop S", "逐词元循环 S"))], sc.prefixes.map((p, t) => ["1…" + (t + 1), pair(p), fmt(sc.loop_prefix_S[t])]), { id: "scan-prefixes" }));
      } else {
        view.append(h("div", { class: "row" }, box("(α₂, B₂) ∘ (α₁, B₁)", h("div", { class: "big" }, pair(sc.level1[0])), h("div", { class: "muted" }, tr(T("token 2 after token 1: the loop's S₂ = ", "词元 2 在词元 1 之后：循环的 S₂ = ")) + fmt(sc.loop_prefix_S[1]))),
          box("(α₁, B₁) ∘ (α₂, B₂)", h("div", { class: "big sym-err" }, pair(sc.swapped)), h("div", { class: "muted" }, tr(T("swapped: a different state", "交换顺序：得到不同的状态")))),
          box(tr(T("z, with B = k̃ = 1", "z，B = k̃ = 1")), h("div", { class: "big sym-z" }, pair(sc.z_root)), h("div", { class: "muted" }, tr(T("token loop z₄ = ", "逐词元循环 z₄ = ")) + fmt(sc.loop_z)))));
        view.querySelectorAll(".box").forEach((b, i) => enter(b, 150 * i));
      }
    };
  } });

scene({ id: "delta", title: T("The delta rule: read the old answer, write the error", "Delta 规则：先读旧答案，再写误差"),
  text: [T("Think of the state as a table of associations. Meeting a key again, first ask what the memory holds for it. This is a fast-weight memory without the normalizer. Key k = [1, 0]: the memory predicts 2; the new target value is 5. The error e = v − Sᵀk = 5 − 2 = 3.",
      "把状态看成一张关联表。再次遇到同一个键时，先问“我现在记得什么？”。这里换成不带分母的快速权重记忆。键 k = [1, 0]：记忆对它的预测是 2，新的目标值是 5。误差 e = v − Sᵀk = 5 − 2 = 3。"),
    T("Write back only what needs correcting, not a whole new 5: with β = 0.5, S ← S + β k eᵀ. The cell for this key goes from 2 to 3.5; an orthogonal key's 4 is untouched. Real keys are correlated, so a write also moves related directions. DeltaNet is built on this update.",
      "只把需要修正的部分写回，而不是再叠上一个完整的 5：取 β = 0.5，S ← S + β k eᵀ。这个键对应的格子从 2 变成 3.5；正交键对应的 4 保持不变。真实的键彼此相关，一次写入也会影响相关方向。DeltaNet 就建立在这种更新上。")],
  build(root) {
    const w = DATA.delta.one_write, view = h("div", {});
    root.append(view);
    let gen = 0;
    return (sub) => {
      const my = ++gen;
      root.querySelectorAll(".traveller").forEach((el) => el.getAnimations().forEach((a) => a.cancel()));
      const g = grid(w.S0, { rowHeads: ["k=[1,0]", "k=[0,1]"], sym: "S" }), cell = g.querySelector('.cell[data-i="0"]');
      const pred = h("span", { id: "delta-prediction" }, sub === 0 ? "…" : fmt(w.prediction));
      const err = h("div", { class: "big sym-err", id: "delta-error" }, sub === 0 ? "e = " + fmt(w.target) + " − …" : "e = " + fmt(w.target) + " − " + fmt(w.prediction) + " = " + fmt(w.error));
      const write = h("div", { class: "big", id: "delta-write" }, fmt(w.prediction) + " + " + fmt(w.beta) + " × " + fmt(w.error) + " = …");
      put(view, formula("e = v − Sᵀk", "S ← S + β k eᵀ"), h("div", { class: "row" }, box("S", g),
        box(tr(T("read for k = [1, 0]", "读取 k = [1, 0]")), h("div", {}, fx(tr(T("prediction Sᵀk = ", "预测 Sᵀk = "))), pred), h("div", {}, fx(tr(T("target v = ", "目标 v = ")) + fmt(w.target))), err),
        sub === 1 ? box(tr(T("after the write", "写入之后")), write, h("div", {}, tr(T("orthogonal key [0, 1] still reads ", "正交键 [0, 1] 仍读出 ")) + fmt(w.orthogonal_read))) : null));
      if (sub === 0) {  // read: the cell's 2 travels out as the prediction; then the error is formed
        travel(root, cell, pred, C.S, 300, fmt(w.prediction), () => {
          if (my !== gen) return;
          land(pred, fmt(w.prediction), C.S);
          land(err, "e = " + fmt(w.target) + " − " + fmt(w.prediction) + " = " + fmt(w.error), C.err);
        });
      } else {  // write: the error, scaled by β, travels back into the key's row; the cell changes when it lands
        travel(root, err, cell, C.err, 300, "β·e = " + fmt(w.beta * w.error), () => {
          if (my !== gen) return;
          land(cell, fmt(w.S[0][0]), C.S);
          write.textContent = fmt(w.prediction) + " + " + fmt(w.beta) + " × " + fmt(w.error) + " = " + fmt(w.S[0][0]);
        });
      }
    };
  } });

scene({ id: "repeat", title: T("Writing one key again and again: accumulate against correct", "重复写同一个键：累加和纠错差在哪"),
  text: [T("One-dimensional key 1, target 5, β = 0.5, memory starting at S = 2; each write first computes e = 5 − S. First: e = 3, S = 2 + 0.5×3 = 3.5. Second: e = 1.5, S = 4.25. Third: e = 0.75, S = 4.625. The error halves each time and S approaches 5; plain accumulation would keep adding 5 and grow without end.",
    "一维键为 1，目标值 5，β = 0.5，记忆从 S = 2 开始；每次先算误差 e = 5 − S。第一次：e = 3，S = 2 + 0.5×3 = 3.5。第二次：e = 1.5，S = 4.25。第三次：e = 0.75，S = 4.625。误差每次减半，S 逼近 5；纯累加则每次再加 5，无限增长。")],
  build(root) {
    const c = DATA.delta.curves[0], view = h("div", {});
    root.append(view);
    return () => {
      const n = 4, pts = c.S.slice(0, n).map((x, i) => [i, x]);
      put(view, lineChart([{ points: pts, color: C.S, label: "S (delta, β = 0.5)", dots: true }, { points: pts.map((p) => [p[0], 5]), color: C.v, label: tr(T("target v = 5", "目标 v = 5")), dash: "6 5" },
        { points: pts.map((p) => [p[0], 2 + 5 * p[0]]), color: C.other, label: tr(T("accumulate: S + v", "累加：S + v")), dash: "2 4" }], { xlabel: tr(T("writes", "写入次数")), ylabel: "S", xticks: [0, 1, 2, 3], yticks: [0, 2, 5, 17] }),
      h("div", { class: "big", id: "delta-seq" }, c.S.slice(0, n).map((x) => fmt(x)).join(" → ")),
      h("div", { class: "sym-err", id: "delta-errors" }, "e: " + c.errors.slice(0, n - 1).map((x) => fmt(x)).join(", ")));
    };
  } });

scene({ id: "norm", title: T("The key's norm sets how hard a write corrects", "键的范数决定了纠错力度"),
  text: [T("S′ = S + βk(v − kᵀS), so kᵀS′ = kᵀS + β‖k‖²(v − kᵀS): new error = (1 − β‖k‖²) × old error. With ‖k‖ = 1 and β = 0.5 the error halves. With ‖k‖ = 2 and still β = 1 it is multiplied by −3: it overshoots, flips sign and grows. For one key written repeatedly, it converges exactly when 0 < β‖k‖² < 2; normalized keys keep β's meaning stable. With many correlated keys the writes also interfere: this one-key analysis does not prove a whole model stable.",
      "S′ = S + βk(v − kᵀS)，所以 kᵀS′ = kᵀS + β‖k‖²(v − kᵀS)：新误差 = (1 − β‖k‖²) × 旧误差。‖k‖ = 1、β = 0.5 时误差减半。‖k‖ = 2 而仍取 β = 1 时误差乘以 −3：反向过冲并放大。对一个固定的键重复写入，当且仅当 0 < β‖k‖² < 2 时收敛；归一化的键能让 β 的含义保持稳定。多个相关的键还会互相干扰：这个单键分析不能保证整个模型稳定。"),
    T("Try it, starting from the scripted S = 2 and target 5: the chart shows the prediction kᵀS after each write, recomputed by the page's engine.",
      "试一试，从脚本中的 S = 2、目标 5 出发：图中是每次写入后的预测 kᵀS，由页面的计算引擎重算。")],
  build(root) {
    const d = DATA.delta, view = h("div", {});
    root.append(view);
    return (sub) => {
      put(view, );
      if (sub === 0) {
        // A sign-keeping log axis: the growing cases (×(−1.5) and ×(−3) per write) are drawn whole, not cut off.
        const colors = [C.k, C.v, C.gate, C.other], n2 = d.norm2;
        const series = d.curves.map((cv, i) => ({ points: cv.errors.slice(0, 7).map((x, n) => [n, x]), color: colors[i], label: "β‖k‖² = " + cv.beta, dots: true }));
        series.push({ points: n2.errors.map((x, n) => [n, x]), color: C.err, label: "β‖k‖² = " + n2.beta * n2.k * n2.k + " (‖k‖ = " + n2.k + ")", dots: true, dash: "6 4" });
        view.append(formula(tr(T("new e = (1 − β‖k‖²) × old e", "新 e = (1 − β‖k‖²) × 旧 e"))), lineChart(series,
          { xlabel: tr(T("writes", "写入次数")), ylabel: tr(T("error e (log scale, both signs)", "误差 e（对数刻度，含正负）")), symlog: true, xticks: [0, 3, 6], yticks: [-30, -10, -3, 0, 3, 10, 30] }),
        h("div", { class: "big sym-err", id: "norm-k2" }, "‖k‖ = 2, β = 1: e = " + d.norm2.errors.map((x) => fmt(x)).join(" → ")));
      } else {
        const kIn = h("input", { type: "range", id: "norm-k", min: 0.25, max: 2.5, step: 0.25, value: 1 }), bIn = h("input", { type: "range", id: "norm-beta", min: 0, max: 2, step: 0.05, value: 0.5 });
        const kOut = h("output", {}, "1"), bOut = h("output", {}, "0.5"), out = h("div", {});
        const draw = () => {
          const k = Number(kIn.value), b = Number(bIn.value), n = 8;
          kOut.textContent = fmt(k); bOut.textContent = fmt(b);
          const res = run({ rule: "delta", q: [k], k: Array(n).fill([k]), v: Array(n).fill([d.value]), beta: Array(n).fill(b), initial_S: [[d.start]] });
          const reads = [k * d.start].concat(res.y.map((y) => y[0])), f = 1 - b * k * k;
          const big = Math.max(...reads.map(Math.abs)), logy = big > 40;  // past 40 a sign-keeping log axis, never a clamp
          const lim = logy ? Math.pow(10, Math.ceil(Math.log10(big))) : Math.max(10, Math.ceil(big / 5) * 5);
          put(out, h("div", { class: "big", id: "norm-factor" }, "β‖k‖² = " + fmt(b * k * k) + "; 1 − β‖k‖² = " + fmt(f) + (Math.abs(f) < 1 ? tr(T(" (converges)", "（收敛）")) : tr(T(" (does not converge)", "（不收敛）")))),
            lineChart([{ points: reads.map((x, i) => [i, x]), color: C.S, label: tr(T("prediction kᵀS", "预测 kᵀS")), dots: true }, { points: reads.map((_, i) => [i, d.value]), color: C.v, label: "v = 5", dash: "6 5" }],
              { xlabel: tr(T("writes", "写入次数")), ylabel: "kᵀS" + (logy ? tr(T(" (log scale)", "（对数刻度）")) : ""), ymin: -lim, ymax: lim, symlog: logy, xticks: [0, 4, 8],
                yticks: logy ? [-lim, -Math.sqrt(lim) | 0, 0, 5, Math.sqrt(lim) | 0, lim] : [-lim, 0, 5, lim] }));
        };
        kIn.addEventListener("input", quietly(draw)); bIn.addEventListener("input", quietly(draw));
        view.append(h("div", { class: "controls" }, h("label", { class: "control" }, "‖k‖ = ", kIn, " ", kOut), h("label", { class: "control" }, "β = ", bIn, " ", bOut)), out);
        draw();
      }
    };
  } });

scene({ id: "chunks", title: T("In training, state updates run in parallel blocks", "训练时，状态更新也能按块并行"),
  text: [T("A token-by-token recurrence suits decoding; prefill and training want large blocks of work. Walking t₁, t₂, t₃ … one at a time hardly fills a GPU. For an associative update, a parallel scan or the chunk form does matrix products inside each chunk and passes the state between chunks.",
      "逐词元递推适合解码；prefill 和训练更适合把工作组织成大块。依次处理 t₁、t₂、t₃……很难喂满 GPU。对可结合的状态更新，可以用并行扫描或分块公式：块内做矩阵乘法，块与块之间传递状态。"),
    T("Without gates: the chunk starts with S_prev and z_prev. Numerator = Q̃_c S_prev + [(Q̃_c K̃_cᵀ) ⊙ M] V_c; denominator = Q̃_c z_prev + rowsum[(Q̃_c K̃_cᵀ) ⊙ M]; then S_next = S_prev + K̃_cᵀV_c and z_next = z_prev + Σrows K̃_c. The first term reads older history from the carried state, the second handles the chunk's own tokens. Move C: the outputs do not change.",
      "先看不带门的累加形式：块开始前已有 S_prev、z_prev。分子 = Q̃_c S_prev + [(Q̃_c K̃_cᵀ) ⊙ M] V_c；分母 = Q̃_c z_prev + rowsum[(Q̃_c K̃_cᵀ) ⊙ M]；然后 S_next = S_prev + K̃_cᵀV_c，z_next = z_prev + Σrows K̃_c。第一项从跨块状态读取更早的历史，第二项处理块内词元。移动 C：输出不变。"),
    T("The running example with two more tokens (φ(k) = [1, 0], v = 6; φ(k) = [1, 1], v = 15), query [2, 1]: the last output is 74/11 for every chunk size. A gated version multiplies in gate products; the delta rule cannot reuse this accumulate formula and needs a block algorithm of its own, with the same aim: keep the recurrence's meaning and give the GPU large regular products.",
      "在贯穿的例子后再加两个词元（φ(k) = [1, 0]，v = 6；φ(k) = [1, 1]，v = 15），查询 [2, 1]：无论块多大，最后的输出都是 74/11。门控版本要乘上门的乘积；delta 规则不能套用这条累加公式，需要专门的块算法，目标相同：保留递推的语义，同时让 GPU 做规整的大块运算。")],
  build(root) {
    const d = DATA.chunks, out = h("div", {});
    const slider = h("input", { type: "range", id: "chunk-size", min: 1, max: d.keys.length, value: 2, oninput: quietly(() => draw()) }), shown = h("output", { id: "chunk-size-value" }, "2");
    root.append(h("label", { class: "control" }, ui("chunk") + " C = ", slider, " ", shown), out);
    let sub = 0;
    const draw = () => {
      const C_ = Number(slider.value), chunks = d.layouts[String(C_)];
      shown.textContent = String(C_);
      // Sized to its column (1:1); on a phone the cards drop their "φ(k)=" and "v=" (the colours say which is which).
      const W = Math.max(300, Math.min(720, visualWidth() - 2)), pitch = (W - 24) / 5, cw = pitch - 10, short = cw < 110;
      const svg = s("svg", { viewBox: "0 0 " + W + " 130", class: "diagram", role: "img", id: "chunk-strip" });
      d.keys.forEach((k, i) => {
        const x = 16 + pitch * i, ci = Math.floor(i / C_);
        svg.append(s("rect", { x, y: 10, width: cw, height: 56, rx: 6, class: "card chunk" + (ci % 2) }), s("text", { x: x + cw / 2, y: 32, "text-anchor": "middle", class: "sym-k" }, (short ? "" : "φ(k)=") + vec(k)),
          s("text", { x: x + cw / 2, y: 54, "text-anchor": "middle", class: "sym-v" }, (short ? "" : "v=") + fmt(d.values[i])));
      });
      chunks.slice(0, -1).forEach((c, ci) => {
        const x = 16 + pitch * c.stop - 5, g = s("g", {}, s("circle", { cx: x, cy: 95, r: 13, fill: C.S }), s("text", { x, y: 100, "text-anchor": "middle", style: "fill:#fff" }, "S"));
        svg.append(g, s("text", { x, y: 124, "text-anchor": "middle", class: "muted-svg" }, vec(c.S_out)));
        anim(g, [{ transform: "translateX(-110px)", opacity: 0 }, { transform: "none", opacity: 1 }], { duration: 600, delay: 150 * ci });  // the state handed on
      });
      const rows = chunks.flatMap((c, ci) => c.y.map((y, j) => [ci + 1, c.start + j + 1, fmt(c.inter_num[j]), fmt(c.inter_den[j]), fmt(c.intra_num[j]), fmt(c.intra_den[j]),
        "(" + fmt(c.inter_num[j]) + " + " + fmt(c.intra_num[j]) + ") / (" + fmt(c.inter_den[j]) + " + " + fmt(c.intra_den[j]) + ")", fmt(y, 4), fmt(d.loop_y[c.start + j], 4)]));
      put(out, h("div", { class: "muted" }, fx("q̃ = " + vec(d.query) + tr(T(" for every token; each card: φ(k), then v", "（每个词元相同）；每张卡片：φ(k)，然后 v")))), svg,
        sub >= 1 ? formula(ui("num") + " = Q̃_c S_prev + [(Q̃_c K̃_cᵀ) ⊙ M] V_c", ui("den") + " = Q̃_c z_prev + rowsum[(Q̃_c K̃_cᵀ) ⊙ M]", "S_next = S_prev + K̃_cᵀ V_c,   z_next = z_prev + Σrows K̃_c") : null,
        table([tr(T("chunk", "块")), "t", tr(T("carried: num", "携带：分子")), tr(T("carried: den", "携带：分母")), tr(T("own: num", "块内：分子")), tr(T("own: den", "块内：分母")), tr(T("(num) / (den)", "(分子) / (分母)")), "y", tr(T("token loop", "逐词元循环"))], rows, { id: "chunk-table" }),
        h("div", { class: "muted" }, ui("handed") + ": " + chunks.map((c) => "S=" + vec(c.S_out) + " z=" + vec(c.z_out)).join("  →  ")),
        sub === 2 ? h("p", { class: "big", id: "chunk-final" }, "y₅ = " + fmt(d.num) + "/" + fmt(d.den) + " ≈ " + fmt(d.loop_y[4], 4)) : null);
    };
    return (n) => { sub = n; draw(); };
  } });

scene({ id: "orders", title: T("Three orders, one picture", "三种计算顺序，一张图"),
  text: [T("The same outputs three ways. Row t of the T × T matrix A holds how much each earlier token i counts for the query at t (dense form: Y = AV / rowsum(A)). The recurrent state Sₜ is exactly the sum of the writes lit in that row. Drag t: the row moves, and Sₜ is rebuilt from its entries.",
      "同一组输出，三种算法。T × T 矩阵 A 的第 t 行是每个更早的词元 i 对时刻 t 的查询有多重要（稠密形式：Y = AV / rowsum(A)）。递推状态 Sₜ 恰好是这一行里亮起的那些写入之和。拖动 t：这一行随之移动，Sₜ 由它的各项重新组成。"),
    T("A gate α multiplies entry (t, i) by the product of the gates after i, αᵢ₊₁⋯αₜ: the older the write, the paler its cell, and Sₜ shrinks by the same factors. Move α (1 means no gate).",
      "门 α 把第 (t, i) 项乘以 i 之后所有门的乘积 αᵢ₊₁⋯αₜ：写入越早，格子越淡，Sₜ 也按同样的因子缩小。移动 α（1 表示没有门）。"),
    T("The chunk form cuts A into diagonal blocks of C tokens. Each block is a small dense product; everything left of a block is never formed: it is read through the state carried from chunk to chunk (the strip below). Any C gives the same y.",
      "分块形式把 A 切成边长为 C 的对角块。每个块是一次小的稠密乘法；块左边的部分从不显式构造：它通过在块与块之间传递的状态读出（下方的条带）。任何 C 都给出同样的 y。")],
  build(root) {
    const d = DATA.chunks, n = d.keys.length, q = d.query;
    const mk = (id, min, max, step, value) => h("input", { type: "range", id, min, max, step, value });
    const tIn = mk("orders-t", 1, n, 1, n), aIn = mk("orders-alpha", 0.05, 1, 0.05, 1), cIn = mk("orders-chunk", 1, n, 1, 2);
    const tOut = h("output", { id: "orders-t-value" }), aOut = h("output", { id: "orders-alpha-value" }), cOut = h("output", { id: "orders-chunk-value" });
    const ctl = (label, inp, out) => h("label", { class: "control" }, fx(label), inp, " ", out);
    const controls = h("div", { class: "controls" }), view = h("div", {});
    root.append(controls, view);
    let sub = -1;
    const draw = (entering) => {
      const t = Number(tIn.value), a = Number(aIn.value), C_ = sub === 2 ? Number(cIn.value) : n;
      tOut.textContent = String(t); aOut.textContent = fmt(a); cOut.textContent = String(C_);
      // The engine runs the recurrence; A is formed from q, k and the gates directly, and the two must agree.
      const alpha = Array(n).fill(a), res = run({ rule: "gated", q, k: d.keys, v: d.values.map((x) => [x]), alpha, eps: 0 });
      const decay = (tt, i) => Math.pow(a, tt - i), dot = (x, y) => x[0] * y[0] + x[1] * y[1];
      const A = d.keys.map((_, tt) => d.keys.map((k, i) => (i <= tt ? dot(q, k) * decay(tt, i) : null)));
      const chunkOf = (i) => Math.floor(i / C_), ti = t - 1, Arow = A[ti];
      const g = h("div", { class: "grid orders-A", id: "orders-A", style: "grid-template-columns: repeat(" + (n + 1) + ", auto)" }, h("div", { class: "cell head" }, "t \\ i"),
        d.keys.map((_, i) => h("div", { class: "cell head" }, String(i + 1))));
      A.forEach((row, tt) => {
        g.append(h("div", { class: "cell head" + (tt === ti ? " lit-head" : "") }, String(tt + 1)));
        row.forEach((x, i) => {
          const inBlock = chunkOf(i) === chunkOf(tt), cls = x === null ? " off" : (tt === ti ? " lit" : "") + (sub === 2 ? (inBlock ? " block" : " carried") : "");
          const cell = h("div", { class: "cell" + cls, "data-t": tt + 1, "data-i": i + 1 }, x === null ? "" : fmt(x, 3));
          if (x !== null) cell.style.setProperty("--shade", (0.15 + 0.85 * decay(tt, i)).toFixed(3));
          g.append(cell);
        });
      });
      // Row t's writes, weighted as in A, sum to S_t (the engine's): the same numbers, two orders.
      const writes = Arow.map((x, i) => (x === null ? null : d.keys[i].map((kk) => decay(ti, i) * kk * d.values[i])));
      const sum = [0, 1].map((r) => writes.reduce((acc, w) => acc + (w ? w[r] : 0), 0)), S = res.S[ti].map((r) => r[0]);
      const num = Arow.reduce((acc, x, i) => acc + (x === null ? 0 : x * d.values[i]), 0), den = Arow.reduce((acc, x) => acc + (x || 0), 0);
      const wl = h("div", { class: "orders-writes" }, writes.map((w, i) => (w ? h("div", { class: "write" }, fx(fmt(decay(ti, i), 4) + " · φ(k" + "₁₂₃₄₅"[i] + ")v" + "₁₂₃₄₅"[i] + " = " + vec(w, 4))) : null)),
        h("div", { class: "big sym-S", id: "orders-sum" }, "Σ = " + vec(sum, 4)));
      const Sbox = box(fx("Sₜ " + tr(T("from the recurrence", "由递推得到"))), grid(S.map((x) => [fmt(x, 4)]), { sym: "S", rowHeads: ["φ₁", "φ₂"] }),
        h("div", { class: "big sym-y", id: "orders-y" }, "y" + "₁₂₃₄₅"[ti] + " = " + fmt(res.y[ti][0], 4)),
        h("div", { class: "muted", id: "orders-dense-y" }, tr(T("row t of AV / rowsum(A): ", "AV / rowsum(A) 的第 t 行：")) + fmt(num, 4) + " / " + fmt(den, 4) + " = " + fmt(num / den, 4)));
      const strip = sub === 2 ? h("div", { class: "orders-strip", id: "orders-strip" }, tr(T("carried state: ", "携带的状态：")),
        Array.from({ length: Math.ceil(n / C_) }, (_, c) => Math.min(n, (c + 1) * C_)).map((stop, c, all) => [
          h("span", { class: "chip chunk" + (c % 2) }, tr(T("chunk ", "块 ")) + (c + 1) + ": " + (c * C_ + 1) + "–" + stop),
          c < all.length - 1 ? h("span", { class: "chip state" }, fx("S = " + vec(res.S[stop - 1].map((r) => r[0]), 4))) : null])) : null;
      put(view, h("div", { class: "row" }, box(h("span", {}, h("span", { class: "sym sym-A" }, "A"), fx(" = (Q̃K̃ᵀ) ⊙ D")), g, h("div", { class: "muted" }, fx(tr(T("D: the causal mask times the gate products αᵢ₊₁⋯αₜ", "D：因果掩码乘以门的乘积 αᵢ₊₁⋯αₜ"))))), box(fx(tr(T("writes lit in row t", "第 t 行亮起的写入"))), wl), Sbox), strip);
      if (entering) view.querySelectorAll(".cell.lit").forEach((c, i) => anim(c, [{ transform: "scale(1.25)" }, { transform: "none" }], { duration: 450, delay: 90 * i }));
    };
    [tIn, aIn, cIn].forEach((inp) => inp.addEventListener("input", quietly(() => draw(false))));
    return (nsub) => {
      if (nsub !== sub) put(controls, ctl("t = ", tIn, tOut), nsub >= 1 ? ctl("α = ", aIn, aOut) : null, nsub === 2 ? ctl(ui("chunk") + " C = ", cIn, cOut) : null);
      if (nsub === 0) aIn.value = "1";
      if (nsub === 1 && sub !== 1) aIn.value = "0.7";  // a gate already on, so the shading shows at once
      sub = nsub; draw(true);
    };
  } });

scene({ id: "devices", title: T("Across devices: segments exchange states, not tokens", "跨设备：各段交换状态，而不是词元"),
  text: [T("Every rule maps a segment's incoming state affinely: S_out = P·S_in + Q. Each device runs its segment from a zero state (that is Q) and knows P from its own tokens: here gated delta, P = Π α(I − β k kᵀ) in token order. Composing the pairs as in the scan, (P₂,Q₂)∘(P₁,Q₁) = (P₂P₁, P₂Q₁ + Q₂), gives the state of one pass over all tokens.",
    "每条规则都把一段的输入状态仿射地映射为 S_out = P·S_in + Q。每个设备从零状态运行自己的那一段（得到 Q），并由自己的词元得到 P：这里是门控 delta，P = Π α(I − β k kᵀ)，按词元顺序相乘。像扫描那样复合这些对，(P₂,Q₂)∘(P₁,Q₁) = (P₂P₁, P₂Q₁ + Q₂)，就得到对全部词元一次运行的状态。")],
  build(root) {
    const d = DATA.devices;
    const seg = (sg, i) => box(tr(T("device ", "设备 ")) + (i + 1) + tr(T(": tokens ", "：词元 ")) + sg.tokens.join("–"), h("div", { class: "row" }, h("div", {}, "P", grid(sg.P, { digits: 3 })), h("div", {}, "Q", grid(sg.Q, { sym: "S", digits: 3 }))));
    const parts = [...d.segments.map(seg), box("P₂Q₁ + Q₂", grid(d.composed, { sym: "S", digits: 4 })), box(tr(T("one pass, all tokens", "一次运行全部词元")), grid(d.one_pass, { sym: "S", digits: 4 }))];
    root.append(h("div", { class: "muted" }, d.keys.map((k, t) => "k" + (t + 1) + "=" + vec(k) + ", v=" + d.values[t]).join("   ") + "   α = " + d.alpha[0] + ", β = " + d.beta[0]), h("div", { class: "row" }, parts));
    return () => parts.forEach((p, i) => enter(p, 150 * i));
  } });

scene({ id: "code", title: T("The minimal recurrence: every line is a tensor", "最小递推里，每一行都有张量意义"),
  text: [T("This loop is the definition: every fast form (dense, chunked, scanned, one-step decode) must agree with it. Check the formula in float64 at small sizes first, then swap the dtype and the kernel and watch how the error grows; compare only runs with the same feature map and ε. A NumPy loop is a teaching reference: never compare its speed with an optimized softmax GPU kernel.",
    "这个循环就是定义：每一种快速形式（稠密、分块、扫描、单步解码）都必须与它一致。先用 float64、小尺寸确认公式，再替换 dtype 与 kernel，观察误差如何增长；只比较同一种特征映射和 ε。NumPy 循环是教学参考，不能拿它与优化过的 softmax GPU kernel 比速度。")],
  build(root) {
    const lines = ["S = np.zeros((r, dv), dtype=np.float64)   # [r, dv]", "z = np.zeros(r, dtype=np.float64)         # [r]", "for q, k, v in zip(phi(Q), phi(K), V):",
      "    S += np.outer(k, v)    # [r, dv]" + tr(T(", includes the current token", "，包含当前词元")), "    z += k                 # [r]",
      "    denominator = q @ z    # " + tr(T("a number", "一个数")), "    y = (q @ S) / (denominator + eps)    # [dv]"];
    const pre = h("pre", { id: "code" }, lines.map((l) => h("span", { class: "codeline" }, fx(l.split("#")[0]), l.includes("#") ? h("span", { class: "muted" }, "#" + l.split("#")[1]) : null, "\n")));
    root.append(pre);
    return () => pre.querySelectorAll(".codeline").forEach((el, i) => anim(el, [{ opacity: 0 }, { opacity: 1 }], { duration: 350, delay: 90 * i }));
  } });

scene({ id: "saves", title: T("What it saves, and where the difficulty moves", "省下了什么，难点又转移到了哪里"),
  text: [T("Per head, with a fixed feature-map cost: decoding with a KV cache keeps and reads O(n(dk + dv)) numbers; the state keeps O(dφdv + dφ) and reads O(dφdv) per step. The history is written into a finite state, so exact retrieval, interference and forgetting become the hard part. Hybrids keep a linear state in some layers and full attention in others: read Kimi Linear and Qwen3-Next next. FlashAttention optimizes softmax attention's memory traffic; it does not turn it into a state model.",
      "按一个头、固定特征映射成本计算：用 KV 缓存解码保存并读取 O(n(dk + dv)) 个数；状态只保存 O(dφdv + dφ)，每步读取 O(dφdv)。历史被写进有限容量的状态，于是精确检索、干扰与遗忘成了难点。混合架构让部分层维护线性状态、部分层保留 full attention：接下来可以读 Kimi Linear 与 Qwen3-Next。FlashAttention 优化的是 softmax 注意力的访存，并没有把它变成状态模型。"),
    T("Measured by linattn recall (no training; random unit keys, d = 64): softmax retrieves every pair at any distance. Plain accumulation stays near 80% whatever the distance: its loss is interference, not distance. Gates forget with distance (α = 0.9 is near chance after 48 writes), and so does the delta rule at these settings.",
      "由 linattn recall 测得（无训练；随机单位键，d = 64）：softmax 在任何距离都能取回每一对。纯累加不论距离都停在 80% 左右：它的损失来自干扰，而不是距离。门控随距离遗忘（α = 0.9 在 48 次写入后接近随机），在这些设置下 delta 规则也一样。")],
  build(root) {
    const m = DATA.measured, view = h("div", {});
    root.append(view);
    return (sub) => {
      put(view, );
      if (sub === 0) {
        const rows = [[T("decode state", "解码时的历史状态"), "O(n(dk + dv))", "O(dφdv + dφ)"], [T("work per step on the history", "每步读历史的计算"), "O(n(dk + dv))", "O(dφdv)"],
          [T("shape of the history", "历史的形态"), T("every position kept, matched one by one", "保留每个位置，逐项匹配"), T("written into a finite state", "写进有限容量的状态")],
          [T("hard part", "关键挑战"), T("capacity and bandwidth of long histories", "长历史的容量与带宽"), T("exact retrieval, interference, forgetting", "精确检索、干扰与遗忘")]];
        const t = table(["", tr(T("full softmax attention", "完整 softmax 注意力")), tr(T("basic linear attention", "基础线性注意力"))], rows.map((r) => r.map(tr)), { id: "saves-table", text: true });
        t.querySelectorAll("tr").forEach((tr_, i) => enter(tr_, 100 * i));
        view.append(t);
      } else {
        const dists = [...new Set(m.recall_distance.map((r) => r.distance))], mechs = [...new Set(m.recall_distance.map((r) => r.mechanism))];
        const acc = (mech, dist) => m.recall_distance.find((r) => r.mechanism === mech && r.distance === dist).accuracy;
        const colors = [C.other, C.S, C.gate, C.k, C.err];
        view.append(lineChart(mechs.map((mech, i) => ({ points: dists.map((x) => [x, 100 * acc(mech, x)]), color: colors[i], label: mechName(mech), dots: true })),
          { xlabel: tr(T("writes after the pair", "该对之后的写入数")), ylabel: tr(T("recall %", "取回准确率 %")), ymin: 0, ymax: 100, xticks: dists, yticks: [0, 50, 80, 100] }),
        h("p", { class: "muted" }, ui("source") + m.recall_file));
      }
    };
  } });

// ------------------------------------------------------------------------------------------------ capacity lab
// N random unit keys with random unit values written into a d-dim state; then every key is read back and the stored
// value nearest the read counts as recalled. Seeded, so the same sliders give the same picture.
function rng(seed) {
  let a = seed >>> 0;
  const u = () => { a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
  return () => Math.sqrt(-2 * Math.log(1 - u())) * Math.cos(2 * Math.PI * u());
}
function unitVectors(n, d, seed) {
  const g = rng(seed);
  return Array.from({ length: n }, () => { const x = Array.from({ length: d }, g), r = Math.hypot(...x); return x.map((e) => e / r); });
}
const MECHS = ["accumulate", "gated", "delta", "softmax"];
// Which pairs come back: recalled[i] for each of the N pairs under one mechanism (α = 0.9 gates, β = 1 delta writes).
function recallPairs(mech, keys, vals) {
  const n = keys.length, d = keys[0].length, dot = (a, b) => a.reduce((acc, x, i) => acc + x * b[i], 0);
  let read;
  if (mech === "softmax") {  // the whole cache, sharp weights: exp(8 qᵀk)
    read = (q) => { const w = keys.map((k) => Math.exp(8 * dot(q, k))), sw = w.reduce((a, b) => a + b, 0); return vals[0].map((_, j) => w.reduce((acc, wi, i) => acc + wi * vals[i][j], 0) / sw); };
  } else {
    const S = Array.from({ length: d }, () => new Array(d).fill(0));
    keys.forEach((k, t) => {
      if (mech === "gated") S.forEach((row) => row.forEach((x, j) => { row[j] = 0.9 * x; }));
      const u = mech === "delta" ? vals[t].map((v, j) => v - k.reduce((acc, ki, i) => acc + ki * S[i][j], 0)) : vals[t];
      for (let i = 0; i < d; i++) for (let j = 0; j < d; j++) S[i][j] += k[i] * u[j];
    });
    read = (q) => S[0].map((_, j) => q.reduce((acc, qi, i) => acc + qi * S[i][j], 0));
  }
  return keys.map((k, i) => { const y = read(k), scores = vals.map((v) => dot(y, v)); return scores.indexOf(Math.max(...scores)) === i; });
}

scene({ id: "capacity", title: T("Capacity lab: how many pairs fit in a state?", "容量实验：一个状态能装下多少对？"),
  text: [T("Write N random key–value pairs (unit vectors of d entries) into a d × d state, then read every key back: a pair counts as recalled when the stored value closest to the read is its own. Each strip is one mechanism, one cell per pair (oldest on the left): accumulate, gated (α = 0.9), delta (β = 1), and softmax over the whole cache for contrast.",
      "把 N 对随机的键值（d 维单位向量）写进 d × d 的状态，再把每个键读回来：如果与读出最接近的已存值正是它自己的值，就算取回成功。每一条是一种机制，每格一对（最旧的在左）：累加、门控（α = 0.9）、delta（β = 1），以及作为对照、读取整个缓存的 softmax。"),
    T("The curve: the share recalled as N grows, for this d (the mean of three random draws). Every fixed-size state starts losing pairs before N reaches d and keeps losing as N grows; the strips show how: accumulation loses pairs anywhere, through interference; the gate loses the oldest first; the delta rule mostly loses older pairs that later writes overwrote. Softmax over the cache keeps every pair while the keys stay well apart (at d = 4, 64 random keys crowd each other and it slips too), at the price of a cache that grows with N. Change d: the drop moves with it.",
      "曲线：在这个 d 下，随 N 增大的取回比例（三次随机抽样的平均）。每种固定大小的状态都在 N 达到 d 之前开始丢失，并随 N 增大继续丢失；各条带显示了丢失的方式：累加因干扰而在任意位置丢失；门控先丢最旧的；delta 规则主要丢失被后来的写入覆盖的较旧的对。只要键彼此相隔足够远，读取整个缓存的 softmax 就能保住每一对（d = 4 时 64 个随机键挤在一起，它也会出错），代价是随 N 增长的缓存。改变 d：下降的位置随之移动。")],
  build(root) {
    const nIn = h("input", { type: "range", id: "cap-n", min: 1, max: 64, step: 1, value: 24 }), dIn = h("input", { type: "range", id: "cap-d", min: 4, max: 32, step: 4, value: 16 });
    const nOut = h("output", { id: "cap-n-value" }), dOut = h("output", { id: "cap-d-value" }), view = h("div", {});
    root.append(h("div", { class: "controls" }, h("label", { class: "control" }, "N = ", nIn, " ", nOut), h("label", { class: "control" }, "d = ", dIn, " ", dOut)), view);
    const names = { accumulate: T("accumulate", "累加"), gated: T("gated α = 0.9", "门控 α = 0.9"), delta: T("delta β = 1", "delta β = 1"), softmax: T("softmax (cache)", "softmax（缓存）") };
    const colors = { accumulate: C.S, gated: C.gate, delta: C.k, softmax: C.other };
    let sub = 0;
    const draw = () => {
      const N = Number(nIn.value), d = Number(dIn.value);
      nOut.textContent = String(N); dOut.textContent = String(d);
      const keys = unitVectors(N, d, 1000 + d), vals = unitVectors(N, d, 2000 + d);
      if (sub === 0) {
        const strips = MECHS.map((m) => {
          const got = recallPairs(m, keys, vals), share = got.filter(Boolean).length;
          return h("div", { class: "barrow" }, h("span", { class: "barlabel", style: "color:" + colors[m] }, tr(names[m])),
            h("span", { class: "heat", id: "cap-strip-" + m }, got.map((ok, i) => h("span", { class: "heatcell " + (ok ? "hit" : "miss"), title: (i + 1) + (ok ? " ✓" : " ✗") }))),
            h("span", { class: "barval", id: "cap-share-" + m }, share + " / " + N));
        });
        put(view, box(tr(T("recalled pairs, oldest → newest", "取回的对，从旧到新")), ...strips));
      } else {
        const Ns = [1, 2, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64];
        const share = (m, n) => [0, 1, 2].reduce((acc, r) => acc + recallPairs(m, unitVectors(n, d, 1000 + d + 97 * r), unitVectors(n, d, 2000 + d + 97 * r)).filter(Boolean).length / n, 0) / 3;
        const series = MECHS.map((m) => ({ points: Ns.map((n) => [n, 100 * share(m, n)]), color: colors[m], label: tr(names[m]), dots: true }));
        put(view, lineChart(series, { xlabel: tr(T("N pairs stored", "存储的对数 N")), ylabel: tr(T("recalled %", "取回 %")), ymin: 0, ymax: 100, xticks: [1, d, 64], yticks: [0, 50, 100], marks: [{ x: d, label: "N = d" }] }));
        view.firstChild.id = "cap-curve";
      }
    };
    [nIn, dIn].forEach((inp) => inp.addEventListener("input", quietly(draw)));
    return (n) => { sub = n; draw(); };
  } });

scene({ id: "long", title: T("Over long histories the state's range grows", "长历史下，状态的数值范围会增长"),
  text: [T("Nonnegative features make z grow steadily, and S's positive and negative terms may cancel. A low-precision sum then rounds away small new writes. A reproducible check: fix Q, K, V, run the float64 recurrence as the reference and sweep length, input scale and chunk size, recording the largest error and the smallest denominator. Measured here (accumulate): a bfloat16 state written token by token stops growing, the chunk form that carries float32 stays close.",
      "非负特征让 z 持续变大；S 的正负项还可能相互抵消。低精度的加法会逐渐丢掉较小的新写入。可复现的检查：固定 Q/K/V，以 float64 递推为参考，扫描长度、输入尺度与块大小，记录最大误差与分母的最小值。这里的实测（累加规则）：逐词元写入的 bfloat16 状态停止增长，用 float32 携带的分块形式保持接近。"),
    T("Remedies: a suitable accumulation precision, and the model's own normalization or forgetting. Rescaling S and z by the same constant keeps the current ratio when ε is ignored; with ε, scale ε too. But if the next token writes at the old scale, later outputs change: the rescale must be part of the model's definition.",
      "工程上的处理：合适的累加精度，以及模型定义的归一化或遗忘机制。忽略 ε 时，S 和 z 同除一个常数保持当前比值；保留 ε 时，ε 也要同比缩放。但下一个词元若仍按原尺度写入，之后的输出就会改变：重缩放必须是模型定义的一部分。")],
  build(root) {
    const m = DATA.measured, L = DATA.long, view = h("div", {});
    root.append(view);
    return (sub) => {
      put(view, );
      if (sub === 0) {
        const rec = m.stability.filter((r) => r.form === "recurrent" && r.dtype === "bfloat16");
        const chunk = (len, dt) => m.stability.find((r) => r.form === "chunk" && r.dtype === dt && r.length === len);
        view.append(lineChart([{ points: rec.map((r) => [Math.log2(r.length), r.reference_state_abs_max]), color: C.S, label: tr(T("largest |S|, float64", "最大 |S|，float64")), dots: true },
          { points: rec.map((r) => [Math.log2(r.length), r.state_abs_max]), color: C.err, label: tr(T("largest |S|, bfloat16 token loop", "最大 |S|，bfloat16 逐词元")), dots: true, dash: "6 4" }],
        { xlabel: "log₂ T", ylabel: "|S|max", xticks: rec.map((r) => Math.log2(r.length)), yticks: [0, Math.round(Math.max(...rec.map((r) => r.reference_state_abs_max)))] }),
        table(["T", tr(T("rel. error, bfloat16 token loop", "相对误差，bfloat16 逐词元")), tr(T("rel. error, chunk bfloat16", "相对误差，分块 bfloat16")), tr(T("rel. error, chunk float32", "相对误差，分块 float32"))],
          rec.map((r) => [bytes(r.length), fmt(r.max_rel_err, 3), chunk(r.length, "bfloat16") ? fmt(chunk(r.length, "bfloat16").max_rel_err, 3) : "", chunk(r.length, "float32") ? fmt(chunk(r.length, "float32").max_rel_err, 3) : ""]), { id: "long-table" }),
        h("p", { class: "muted" }, ui("source") + m.stability_files.join(", ")));
      } else {
        const b1 = box(tr(T("now", "当前")), h("div", {}, fx("S = " + vec(L.S.map((r) => r[0])) + ", z = " + vec(L.z))), h("div", { class: "big" }, "y = " + fmt(L.y, 6)));
        const b2 = box(tr(T("S, z and ε × ", "S、z 与 ε × ")) + fmt(L.c), h("div", {}, fx("S = " + vec(L.S.map((r) => L.c * r[0])) + ", z = " + vec(L.z.map((x) => L.c * x)))), h("div", { class: "big", id: "long-rescaled" }, "y = " + fmt(L.y_rescaled, 6)));
        const b3 = box(tr(T("next write at the old scale: ", "下一次按原尺度写入：")) + "k = " + vec(L.next.k) + ", v = " + fmt(L.next.v),
          h("div", {}, tr(T("not rescaled: y = ", "未缩放：y = ")) + fmt(L.next.y, 4)), h("div", { class: "sym-err", id: "long-next" }, tr(T("rescaled: y = ", "已缩放：y = ")) + fmt(L.next.y_rescaled, 4)));
        view.append(h("div", { class: "row" }, b1, b2, b3));
        [b1, b2, b3].forEach((b, i) => enter(b, 200 * i));
      }
    };
  } });

scene({ id: "quality", wide: true, title: T("Speed stays flat, quality may fall as the history gets harder", "速度平了，质量却可能随历史变难"),
  text: [T("A hypothetical experiment: decode attention takes about 0.3 ms at 2K, 8K and 32K tokens, but exact long-range retrieval falls from 98% to 89% and 61%. Flat latency says the fixed state works; it says nothing about what the state still holds. The table lists each symptom, the first suspect and a control experiment. These numbers are for diagnosis practice only, and a linear layer usually needs training to adapt: softmax weights dropped into it are not equivalent.",
      "假想实验：解码注意力在 2K、8K、32K 时都约 0.3 ms，但远距离精确检索的准确率从 98% 降到 89%、61%。延迟平稳说明固定状态生效了，却说明不了状态里还保留着什么。表中列出每种现象、优先怀疑的原因和对照实验。这些数字只用于练习诊断；换成线性结构通常需要训练适配，把 softmax 层的权重原样放进去并不等价。"),
    T("Measured, with training: linattn's MQAR sweep (multi-query associative recall in zoology's setup, 2-layer models, at most 1,000 steps on CPU; †: 3,000 steps, for a group that no learning rate took off the plateau in 1,000). Per mixer and setting: the learning rate (of four) with seed 0's best validation accuracy, then the test accuracy of 3 seeds at that rate, mean and lowest–highest. Columns: width d, length T, stored pairs. State: the floats of the fixed-size state; an attention layer adds a KV cache that grows with the sequence. *: no learning rate got past twice chance (chance: a random one of the stored values).",
      "有训练的实测：linattn 的 MQAR 扫描（多查询关联回忆，按 zoology 的设置，2 层模型，CPU 上最多 1,000 步；†：某组在 1,000 步内没有任何学习率离开平台期时，改训 3,000 步）。每种混合器与设置：先取种子 0 验证准确率最高的学习率（四个之一），再报告该学习率下 3 个种子的测试准确率，平均与最低–最高。列：宽度 d、长度 T、存储的键值对数。状态：固定大小状态的浮点数；注意力层另有随序列增长的 KV 缓存。*：没有任何学习率超过两倍随机水平（随机：从存储的值里随便挑一个）。")],
  build(root) {
    const q = DATA.quality.hypothetical, m = DATA.measured, view = h("div", {});
    root.append(view);
    return (sub) => {
      put(view, );
      if (sub === 0) {
        view.append(h("div", { class: "row" }, box(tr(T("hypothetical: decode time", "假想：解码时间")), ...q.lengths.map((L, i) => barRow(L, q.ms[i], 0.5, C.other))),
          box(tr(T("hypothetical: long-range retrieval", "假想：远距离检索")), ...q.lengths.map((L, i) => barRow(L, q.accuracy[i], 100, C.err)))),
        table([tr(T("symptom", "现象")), tr(T("first suspect", "优先调查")), tr(T("control experiment", "对照实验"))], [
          [T("latency hardly changes with T", "延迟基本不随 T 变"), T("the fixed state is really in use", "固定状态确实生效"), T("measure state bytes and the kernel's reads", "测状态字节与 kernel 读取量")],
          [T("near pairs good, far pairs bad", "近距离好、远距离差"), T("forgetting and state interference", "遗忘与状态干扰"), T("move the evidence, keep the total length", "改变证据位置，固定总长度")],
          [T("repeated keys get overwritten", "重复 key 容易覆盖"), T("write rule and associative capacity", "写入规则与关联容量"), T("compare accumulate, gated, delta", "比较累加、门控、delta 结构")],
          [T("only long low-precision runs fail", "只有低精度长序列出错"), T("accumulated rounding error", "数值累加误差"), T("float64 / float32 reference on the same input", "同输入的 FP64 / FP32 参考")]].map((r) => r.map(tr)), { id: "quality-table", text: true }));
      } else {
        const src = h("p", { class: "muted" }, ui("source") + m.mqar_file + tr(T(` (${m.mqar_config.runs} of ${m.mqar_config.total_runs} runs finished)`, `（已完成 ${m.mqar_config.runs} / ${m.mqar_config.total_runs} 次运行）`)));
        if (!m.mqar_groups.length) {
          view.append(h("p", {}, tr(T("No setting has finished for every mixer yet.", "还没有一个设置对所有混合器都已完成。"))), src);
          return;
        }
        const widths = Object.keys(m.mqar[0].state_floats).sort((a, b) => a - b), kv = tr(T("KV cache", "KV 缓存"));
        const state = (r) => (widths.every((d) => r.state_floats[d]) ? widths.map((d) => bytes(r.state_floats[d])).join(" / ") + (r.kv_cache ? " + " + kv : "") : kv);
        const pct = (x) => Math.round(100 * x);
        // Compact so that every column fits beside the narration: the state under the mixer's name, each setting's
        // header on three short lines (a phone shows each row as a list instead).
        const setting = (g) => { const pairs = tr(T(`${g.num_pairs} pairs`, `${g.num_pairs} 对`)); return h("span", { "data-label": `d ${g.d_model} · T ${g.seq_len} · ${pairs}` }, `d ${g.d_model}`, h("br"), `T ${g.seq_len}`, h("br"), pairs); };
        view.append(table([h("span", { "data-label": tr(T("mixer", "混合器")) }, tr(T("mixer", "混合器")), h("br"), h("small", { class: "muted" }, tr(T("state floats", "状态浮点数")) + " (" + widths.map((d) => "d " + d).join(" / ") + ")")),
          ...m.mqar_groups.map(setting)],
          m.mqar.map((r) => [h("span", {}, r.mixer, h("br"), h("small", { class: "muted" }, state(r))), ...r.accuracy.map(([mean, lo, hi], i) => h("span", {}, `${pct(mean)}%` + (r.plateau[i] ? "*" : "") + (r.extended && r.extended[i] ? "†" : ""), h("br"), h("small", { class: "muted" }, `${pct(lo)}–${pct(hi)}`)))]), { id: "mqar-table", compact: true }), src);
      }
    };
  } });

const EXERCISES = [
  { title: T("Exercise 1: the 2-d output without per-token weights", "练习 1：不看逐项权重，算出二维输出"),
    q: T("k̃₁ = [1, 0], v₁ = [2, 1]; k̃₂ = [0, 1], v₂ = [4, 3]; k̃₃ = [1, 1], v₃ = [3, 2]. Find S and z, then read y with q̃ = [2, 1]. Enter y's two entries.",
      "k̃₁=[1,0]，v₁=[2,1]；k̃₂=[0,1]，v₂=[4,3]；k̃₃=[1,1]，v₃=[3,2]。求 S、z，再用 q̃=[2,1] 读出 y。填入 y 的两个分量。"),
    labels: ["y₁", "y₂"],
    solution: (e) => [T("The first two tokens give S = [[2, 1], [4, 3]]; the third outer product is [[3, 2], [3, 2]], so S = " + mat(e.S) + " and z = " + vec(e.z) + ".",
      "前两项 S = [[2, 1], [4, 3]]，第三个外积为 [[3, 2], [3, 2]]；所以 S = " + mat(e.S) + "，z = " + vec(e.z) + "。"),
    T("Numerator [2, 1]S = " + vec(e.num) + ", denominator [2, 1]·" + vec(e.z) + " = " + fmt(e.den) + ": y = [17/6, 11/6] ≈ " + vec(e.answers, 4) + ".",
      "分子 [2, 1]S = " + vec(e.num) + "，分母 [2, 1]·" + vec(e.z) + " = " + fmt(e.den) + "：y = [17/6, 11/6] ≈ " + vec(e.answers, 4) + "。")] },
  { title: T("Exercise 2: how much weight is left on an old token?", "练习 2：门控后的旧词元还剩多少权重？"),
    q: T("Three tokens, every 1-d feature 1, values [2, 4, 8]; α₂ = 0.5, α₃ = 0.25; S and z start at 0. What is the final output?",
      "三个词元的一维特征都为 1，values = [2, 4, 8]。α₂ = 0.5、α₃ = 0.25；S/z 从 0 开始。求最终输出。"),
    labels: ["y"],
    solution: (e) => [T("The unnormalized history coefficients are [α₂α₃, α₃, 1] = " + vec(e.coeffs) + ".", "三个词元的未归一化历史系数为 [α₂α₃, α₃, 1] = " + vec(e.coeffs) + "。"),
      T("Numerator 0.125×2 + 0.25×4 + 8 = " + fmt(e.num) + "; denominator " + fmt(e.den) + "; y = 9.25/1.375 = 74/11 ≈ " + fmt(e.answers[0], 4) + ".",
        "分子 = 0.125×2 + 0.25×4 + 8 = " + fmt(e.num) + "；分母 = " + fmt(e.den) + "；输出 = 9.25/1.375 = 74/11 ≈ " + fmt(e.answers[0], 4) + "。")] },
  { title: T("Exercise 3: does the unit-key result carry over to k = 2?", "练习 3：单位键的结论能直接套到 k = 2 吗？"),
    q: T("1-d state S = 1, key k = 2, target v = 5, β = 0.5. Find the old prediction, the error, the new S and the new prediction. Why is the prediction not 5 now?",
      "一维 S = 1，k = 2，目标 v = 5，β = 0.5。先算旧预测、误差、新 S、新预测。为什么这次没有把预测改成 5？"),
    labels: [T("new S", "新 S"), T("new prediction", "新预测")],
    solution: (e) => [T("Old prediction kS = " + fmt(e.prediction) + ", error e = " + fmt(e.error) + "; new S = 1 + 0.5×2×3 = " + fmt(e.S) + ", new prediction kS = " + fmt(e.answers[1]) + ": an overshoot.",
      "旧预测 kS = " + fmt(e.prediction) + "，误差 e = " + fmt(e.error) + "；新 S = 1 + 0.5×2×3 = " + fmt(e.S) + "，新预测 kS = " + fmt(e.answers[1]) + "，发生过冲。"),
    T("The effective rate βk² = 2 turns the error 3 into −3. With β = 1/k² = " + fmt(e.fixed_beta) + ": S′ = " + fmt(e.fixed_S) + ", prediction " + fmt(e.fixed_prediction) + ". The key's norm must enter the analysis.",
      "有效修正率 βk² = 2，误差从 3 变为 −3。若 β = 1/k² = " + fmt(e.fixed_beta) + "，则 S′ = " + fmt(e.fixed_S) + "、预测 = " + fmt(e.fixed_prediction) + "；key 的范数必须进入分析。")] },
];
// Named mistakes: answers a learner reaches by one specific slip, and what that slip was. Each entry's values are
// exact fractions [num, den] per box (null: any value there).
const F = (num, den) => ({ value: num / (den || 1), num, den: den || 1 });
const MISTAKES = [
  [{ at: [F(8, 3), F(5, 3)], says: T("That is [8/3, 5/3]: the read of the first two tokens. Token 3 (k̃₃ = [1, 1], v₃ = [3, 2]) was forgotten: add its outer product to S and k̃₃ to z.",
      "这是 [8/3, 5/3]：只有前两个词元时的读数。漏掉了词元 3（k̃₃ = [1, 1]，v₃ = [3, 2]）：把它的外积加进 S，把 k̃₃ 加进 z。") },
    { at: [F(17), F(11)], says: T("That is the numerator q̃ᵀS = [17, 11] alone: divide it by the denominator q̃ᵀz = 6.", "这只是分子 q̃ᵀS = [17, 11]：还要除以分母 q̃ᵀz = 6。") },
    { at: [F(17, 4), F(11, 4)], says: T("Divided by z's entries summed (4), not by q̃ᵀz = 2·2 + 1·2 = 6: the query weights z too.", "除的是 z 各分量之和 (4)，而不是 q̃ᵀz = 2·2 + 1·2 = 6：查询也要给 z 加权。") },
    { at: [F(11, 6), F(17, 6)], says: T("The two entries are swapped: y₁ comes from S's first column.", "两个分量写反了：y₁ 来自 S 的第一列。") },
    { at: [F(3), F(2)], says: T("That is v₃ alone: the read averages every token written so far, not only the last.", "这只是 v₃：读取是对所有已写入词元的加权平均，而不只是最后一个。") }],
  [{ at: [F(6)], says: T("6 is what you get with the gates on the wrong tokens (token 1 × α₃, token 2 × α₂). A gate shrinks everything written before it: token 1 carries α₂α₃ = 0.125, token 2 only α₃ = 0.25.",
      "6 是把门乘错了词元得到的（词元 1 × α₃，词元 2 × α₂）。门会缩小它之前写入的一切：词元 1 带 α₂α₃ = 0.125，词元 2 只带 α₃ = 0.25。") },
    { at: [F(14, 3)], says: T("14/3 is the plain average of 2, 4, 8: the gates were left out.", "14/3 是 2、4、8 的普通平均：漏掉了门。") },
    { at: [F(37, 4)], says: T("9.25 is the numerator alone: divide by z = 0.125 + 0.25 + 1 = 1.375.", "9.25 只是分子：还要除以 z = 0.125 + 0.25 + 1 = 1.375。") },
    { at: [F(8)], says: T("8 is the last value alone: the gates shrink the old tokens, they do not erase them.", "8 只是最后一个值：门把旧词元缩小，但没有抹掉。") }],
  [{ at: [null, F(5)], says: T("Prediction 5 is the unit-key result applied to k = 2. With ‖k‖ = 2 the write changes the prediction kS by βk²·e = 0.5·4·3 = 6, not by β·e: the key's norm enters twice.",
      "预测 5 是把单位键的结论套到了 k = 2 上。‖k‖ = 2 时，写入让预测 kS 改变 βk²·e = 0.5·4·3 = 6，而不是 β·e：键的范数出现了两次。") },
    { at: [F(5, 2), null], says: T("S = 2.5 leaves the key out of the write: S ← S + β k e = 1 + 0.5 · 2 · 3.", "S = 2.5 是写入时漏掉了键：S ← S + β k e = 1 + 0.5 · 2 · 3。") },
    { at: [F(4), F(4)], says: T("S = 4 is right; the prediction is kS = 2 · 4, not S.", "S = 4 对了；预测是 kS = 2 · 4，而不是 S。") },
    { at: [F(5), null], says: T("S = 5 takes S itself as the prediction (error 5 − 1 = 4). The old prediction is kS = 2 · 1 = 2, so the error is 3.", "S = 5 是把 S 本身当成了预测（误差 5 − 1 = 4）。旧预测是 kS = 2 · 1 = 2，所以误差是 3。") }],
];
// What the learner typed and the last verdict, per exercise, for as long as the page is open (leaving the step,
// switching language or rotating the phone keeps them).
const TYPED = {};
scene({ id: "exercises", title: T("Exercises", "练习"), oneAtATime: true,
  text: EXERCISES.map((e) => T(e.title.en + " " + e.q.en, e.title.zh + " " + e.q.zh)),
  build(root) {
    const view = h("div", {});
    root.append(view);
    return (sub) => {
      const ex = EXERCISES[sub], e = DATA.exercises[sub], want = e.fractions.map(([n, d]) => F(n, d));
      const keep = TYPED[e.id] || (TYPED[e.id] = { values: ex.labels.map(() => ""), checked: false });
      const inputs = ex.labels.map((l, i) => h("input", { type: "text", inputmode: "decimal", id: "ex-answer-" + i, "aria-label": tr(l), autocomplete: "off", value: keep.values[i],
        oninput: (ev) => { keep.values[i] = ev.target.value; } }));
      const verdict = h("div", { id: "ex-verdict", role: "status" });
      const check = (quiet) => {
        keep.values = inputs.map((inp) => inp.value);
        keep.checked = true;
        const got = inputs.map((inp) => parseAnswer(inp.value));
        if (got.some((x) => x === null)) { verdict.className = "verdict"; verdict.textContent = ui("blank"); verdict.dataset.diagnosis = "blank"; return; }
        const right = got.map((x, i) => matches(x, want[i])), ok = right.every(Boolean);
        const mistake = ok ? null : MISTAKES[sub].find((m) => m.at.every((w, i) => w === null || matches(got[i], w)));
        const short = !ok && !mistake && got.some((x, i) => !right[i] && tooShort(x, want[i]));
        verdict.className = "verdict " + (ok ? "right" : "wrong");
        verdict.dataset.diagnosis = ok ? "right" : mistake ? "mistake-" + MISTAKES[sub].indexOf(mistake) : short ? "short" : "wrong";
        put(verdict, ok ? ui("right") : mistake ? fx(tr(mistake.says)) : short ? ui("short") : ui("wrong"));
        inputs.forEach((inp, i) => inp.classList.toggle("bad", !right[i]));
        if (!quiet) anim(verdict, [{ transform: "scale(0.9)", opacity: 0 }, { transform: "none", opacity: 1 }], { duration: 350 });
      };
      inputs.forEach((inp) => inp.addEventListener("keydown", (ev) => { if (ev.key === "Enter") check(); }));
      put(view, h("div", { class: "answers" }, ex.labels.map((l, i) => h("label", { class: "control" }, tr(l) + " = ", inputs[i])), h("button", { type: "button", id: "ex-check", onclick: () => check() }, ui("check"))), verdict,
        h("details", { id: "ex-solution" }, h("summary", {}, ui("show")), ex.solution(e).map((p) => h("p", {}, fx(tr(p))))),
        h("p", { class: "muted" }, tr(T("Fractions such as 17/6 are welcome; a decimal needs at least 4 significant digits. Write down the assumptions first, then substitute the numbers.",
          "可以写分数，如 17/6；小数至少要 4 位有效数字。先写出假设，再代入数字。"))));
      if (keep.checked) check(true);
    };
  } });

scene({ id: "lab", title: T("Hands-on: three orders of computation, one output", "动手实验：三种计算顺序，应该给出同一个输出"),
  text: [T("Run a checkable reference on your CPU with NumPy; the sizes are small so that every intermediate tensor can be printed. Then try: change the chunk size (--chunk-size N) and confirm that chunk boundaries do not change the meaning; and compare ELU+1 linear attention with a softmax reference: the lab prints how far apart they are, and why that is expected. Timings here say nothing about GPU kernels: this lab checks correctness and cost, not speed.",
    "用 NumPy 在 CPU 上运行一个可检查的参考实现；尺寸很小，便于打印每个中间张量。然后试试：改变块大小（--chunk-size N），确认块边界不改变语义；再把 ELU+1 线性注意力与 softmax 参考比较：lab 会打印二者相差多少，以及为什么这是预期的。这里的耗时不代表 GPU kernel 的性能：这个实验检查的是正确性与成本，而不是速度。")],
  build(root) {
    const d = DATA.lab;
    const pre = h("pre", { id: "lab-commands" }, "python3 -m pip install numpy\npython3 lab.py\npython3 lab.py --seed 7\npython3 lab.py --chunk-size 3");
    // The lab's own output (python3 lab.py, seed 0), captured when this page was built.
    const out = h("pre", { id: "lab-output" }, h("span", { class: "codeline muted" }, "$ python3 lab.py\n"), d.output.map((line) => {
      const m = /^(.*?: )(PASS|FAIL)(.*)$/.exec(line);
      return h("span", { class: "codeline" }, m ? [m[1], h("span", { class: m[2] === "PASS" ? "pass" : "error" }, m[2]), m[3]] : line, "\n");
    }));
    root.append(pre, out, h("p", {}, h("a", { id: "lab-download-2", download: "lab.py", href: "data:text/x-python;charset=utf-8;base64," + DATA.lab_b64 }, ui("lab"))),
      h("p", { class: "muted" }, tr(T("Default chunk sizes of the chunk check: ", "分块检查默认的块大小：")) + d.chunk_sizes.join(", ")));
    return () => out.querySelectorAll(".codeline").forEach((el, i) => anim(el, [{ opacity: 0 }, { opacity: 1 }], { duration: 250, delay: 90 * i }));
  } });

const PLAYGROUND = {};
scene({ id: "playground", title: T("Playground", "试验场"),
  text: [T("Edit the tokens (features φ(k), φ(q), values), the rule, the gates α and the write strengths β; for accumulate and gated also ε and its mode. S, z and y after every token are recomputed by the page's engine, the one the tests compare with linattn's float64 reference.",
    "编辑词元（特征 φ(k)、φ(q)、值）、规则、门控 α、写入强度 β；累加与门控规则还可以调 ε 及其模式。每个词元之后的 S、z 和 y 都由页面的计算引擎重算；测试会把这个引擎与 linattn 的 float64 参考实现对比。")],
  build(root) {
    // The learner's edits live outside the scene, so a rebuild (resize, rotation, language) keeps them.
    const st = PLAYGROUND.st || (PLAYGROUND.st = { rule: "accumulate", dv: 1, eps: 1e-6, eps_mode: "add", normalize: true, toks: [
      { k: [1, 0], v: [2, 1], q: [2, 1], a: 0.5, b: 0.5 }, { k: [0, 1], v: [4, 3], q: [2, 1], a: 0.5, b: 0.5 }, { k: [1, 1], v: [3, 5], q: [2, 1], a: 0.5, b: 0.5 }] });
    const controls = h("div", { class: "controls" }), tbl = h("div", {}), out = h("div", {});
    root.append(controls, tbl, out);
    const num = (get, set, id, step) => h("input", { type: "number", step: step || "any", value: get(), id, oninput: (e) => {
      const x = Number(e.target.value), ok = e.target.value !== "" && Number.isFinite(x);
      e.target.classList.toggle("bad", !ok);  // an empty field keeps the last number, and says so
      if (ok) { set(x); compute(); }
    } });
    const sel = (id, opts, get, set) => h("select", { id, onchange: (e) => { set(e.target.value); drawAll(); } }, opts.map((o) => h("option", { value: o, selected: String(get()) === String(o) }, o)));
    const drawControls = () => {
      const delta = st.rule.endsWith("delta");
      put(controls, h("label", { class: "control" }, tr(T("rule ", "规则 ")), sel("pg-rule", ["accumulate", "gated", "delta", "gated_delta"], () => st.rule, (x) => { st.rule = x; })),
        h("label", { class: "control" }, "dv ", sel("pg-dv", [1, 2], () => st.dv, (x) => { st.dv = Number(x); })),
        delta ? null : h("label", { class: "control" }, "ε ", num(() => st.eps, (x) => { st.eps = Math.max(0, x); }, "pg-eps")),
        delta ? null : h("label", { class: "control" }, tr(T("ε mode ", "ε 模式 ")), sel("pg-mode", ["add", "clamp"], () => st.eps_mode, (x) => { st.eps_mode = x; })),
        delta ? null : h("label", { class: "control" }, h("input", { type: "checkbox", id: "pg-norm", checked: st.normalize, onchange: (e) => { st.normalize = e.target.checked; compute(); } }), tr(T(" divide by z", " 除以 z"))),
        h("button", { type: "button", id: "pg-add", onclick: () => { if (st.toks.length < 5) { st.toks.push({ k: [1, 1], v: [1, 1], q: [2, 1], a: 0.5, b: 0.5 }); drawAll(); } } }, "+ " + ui("token")),
        h("button", { type: "button", id: "pg-remove", onclick: () => { if (st.toks.length > 1) { st.toks.pop(); drawAll(); } } }, "− " + ui("token")));
    };
    const drawTable = () => {
      const gated = st.rule.startsWith("gated"), delta = st.rule.endsWith("delta");
      const head = ["", "φ(k)₁", "φ(k)₂", "v₁"].concat(st.dv === 2 ? ["v₂"] : [], ["φ(q)₁", "φ(q)₂"], gated ? ["α"] : [], delta ? ["β"] : []);
      // On a phone each token's row becomes a short list of labelled fields (the table's kv style).
      const cellsOf = (tr_) => { [...tr_.children].forEach((td, i) => td.setAttribute("data-label", i ? head[i] : "")); return tr_; };
      put(tbl, scroll(h("table", { class: "data inputs kv" }, h("thead", {}, h("tr", {}, head.map((x) => h("th", {}, fx(x))))), st.toks.map((tk, t) => cellsOf(h("tr", {}, h("td", {}, ui("token") + " " + (t + 1)),
        [0, 1].map((i) => h("td", {}, num(() => tk.k[i], (x) => { tk.k[i] = x; }, "pg-k" + t + i))),
        (st.dv === 2 ? [0, 1] : [0]).map((j) => h("td", {}, num(() => tk.v[j], (x) => { tk.v[j] = x; }, "pg-v" + t + j))),
        [0, 1].map((i) => h("td", {}, num(() => tk.q[i], (x) => { tk.q[i] = x; }, "pg-q" + t + i))),
        gated ? h("td", {}, num(() => tk.a, (x) => { tk.a = Math.min(1, Math.max(0, x)); }, "pg-a" + t, "0.05")) : null,
        delta ? h("td", {}, num(() => tk.b, (x) => { tk.b = x; }, "pg-b" + t, "0.05")) : null))))));
    };
    const compute = () => {
      const gated = st.rule.startsWith("gated"), delta = st.rule.endsWith("delta");
      const spec = { rule: st.rule, q: st.toks.map((t) => t.q.slice()), k: st.toks.map((t) => t.k.slice()), v: st.toks.map((t) => t.v.slice(0, st.dv)) };
      if (gated) spec.alpha = st.toks.map((t) => t.a);
      if (delta) spec.beta = st.toks.map((t) => t.b);
      else Object.assign(spec, { eps: st.eps, eps_mode: st.eps_mode, normalize: st.normalize });
      try {
        const res = run(spec);
        put(out, h("div", { class: "row", id: "pg-out" }, res.S.map((S, t) => box(ui("token") + " " + (t + 1), grid(S, { sym: "S" }), res.z ? h("div", {}, fx("z = " + vec(res.z[t]))) : null, h("div", { class: "big" }, "y = " + vec(res.y[t]))))));
      } catch (err) {
        put(out, h("p", { class: "error" }, err.message));
      }
    };
    const drawAll = () => { drawControls(); drawTable(); compute(); };
    drawAll();
    return () => enter(out, 0);
  } });

scene({ id: "references", title: T("References and further reading", "参考与延伸阅读"),
  text: [T("Where each idea on these pages comes from, and what to read next: the KV cache and sparse attention on the softmax side, the hybrids that mix both, and the papers behind each update rule.",
    "本页各个想法的出处，以及接下来可以读什么：softmax 一侧的 KV 缓存与稀疏注意力，混合两者的架构，以及每条更新规则背后的论文。")],
  build(root) {
    const refs = [
      [T("Linear attention (accumulate)", "线性注意力（累加）"), "Katharopoulos et al., Transformers are RNNs: fast autoregressive transformers with linear attention, ICML 2020 (arXiv:2006.16236)"],
      [T("Gates", "门控"), "Sun et al., Retentive Network, 2023 (arXiv:2307.08621); Yang et al., Gated Linear Attention Transformers with hardware-efficient training, ICML 2024 (arXiv:2312.06635)"],
      [T("Delta rule", "Delta 规则"), "Schlag, Irie, Schmidhuber, Linear Transformers are secretly fast weight programmers, ICML 2021 (arXiv:2102.11174); Yang et al., Parallelizing linear transformers with the delta rule over sequence length, NeurIPS 2024 (arXiv:2406.06484)"],
      [T("Gated delta rule", "门控 delta 规则"), "Yang, Kautz, Hatamizadeh, Gated Delta Networks, ICLR 2025 (arXiv:2412.06464)"],
      [T("Hybrids", "混合架构"), "Kimi Linear (Moonshot AI, 2025, arXiv:2510.26692); Qwen3-Next (Qwen team, 2025): gated DeltaNet layers with full-attention layers"],
      [T("KV cache", "KV 缓存"), "Kwon et al., Efficient memory management for LLM serving with PagedAttention, SOSP 2023 (arXiv:2309.06180)"],
      [T("Sparse attention", "稀疏注意力"), "Beltagy et al., Longformer, 2020 (arXiv:2004.05150); Yuan et al., Native Sparse Attention, 2025 (arXiv:2502.11089)"],
      [T("Softmax IO", "softmax 的访存"), "Dao et al., FlashAttention, NeurIPS 2022 (arXiv:2205.14135)"],
    ];
    const list = h("dl", { class: "refs" }, refs.map(([t, r]) => [h("dt", {}, tr(t)), h("dd", {}, r)]));
    root.append(list, h("p", { class: "muted" }, tr(T("In this repository: docs/mechanism.md (the mechanism with the same worked numbers) and docs/explainer.md (this page).", "本仓库中：docs/mechanism.md（同样的算例讲机制）与 docs/explainer.md（本页说明）。"))));
    return () => list.querySelectorAll("dt").forEach((el, i) => enter(el, 60 * i));
  } });
