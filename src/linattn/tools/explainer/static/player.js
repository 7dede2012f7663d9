// ------------------------------------------------------------------------------------------------ player
// Steps count from 1 everywhere the learner sees them: the counter, the address (#step=N) and go(N).
const STEPS = SCENES.flatMap((sc, si) => sc.text.map((_, sub) => ({ si, sub })));
const SCENE_START = SCENES.map((_, si) => STEPS.findIndex((st) => st.si === si) + 1);
const stage = document.getElementById("stage"), timeline = document.getElementById("timeline");
let current = { step: 0, si: -1, lang: null, update: null, width: 0 };

function clampStep(n) { return Math.min(STEPS.length, Math.max(1, Math.round(Number(n)) || 1)); }
function stepFromHash() {
  const m = /step=(\d+)/.exec(location.hash);
  return m ? clampStep(Number(m[1])) : 1;
}

function render(step, rebuild) {
  step = clampStep(step);
  const { si, sub } = STEPS[step - 1], sc = SCENES[si];
  if (rebuild || si !== current.si || LANG !== current.lang) {
    const visual = h("div", { class: "visual" });
    stage.replaceChildren(h("h2", { id: "scene-heading" }, tr(sc.title)), h("div", { class: "slide" + (sc.wide ? " wide" : "") }, h("div", { class: "narration", id: "narration" }), visual));
    stage.dataset.scene = sc.id;
    current.update = sc.build(visual);
    current.width = visual.clientWidth;
  }
  // The narration so far in this scene: earlier steps stay, dimmed; the current one is new.
  const narration = document.getElementById("narration");
  narration.replaceChildren(...sc.text.slice(sc.oneAtATime ? sub : 0, sub + 1).map((t, i) => h("p", { class: i === sub || sc.oneAtATime ? "now" : "before" }, fx(tr(t)))));
  anim(narration.lastChild, [{ opacity: 0, transform: "translateY(8px)" }, { opacity: 1, transform: "none" }], { duration: 400 });
  current.update(sub);
  current = Object.assign(current, { step, si, lang: LANG });
  const root = document.documentElement;
  root.dataset.step = String(step);
  root.dataset.steps = String(STEPS.length);
  root.dataset.scene = sc.id;
  timeline.value = String(step);
  document.getElementById("counter").textContent = LANG === "zh" ? "第 " + step + " 步 / 共 " + STEPS.length + " 步" : "step " + step + " of " + STEPS.length;
  document.getElementById("scene-count").textContent = (LANG === "zh" ? "场景 " : "scene ") + (si + 1) + " / " + SCENES.length;
  if (location.hash !== "#step=" + step) history.replaceState(null, "", "#step=" + step);
}

function go(step) { render(step); }

function setLang(lang) {
  LANG = lang === "zh" ? "zh" : "en";
  document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";
  document.getElementById("lang-en").setAttribute("aria-pressed", String(LANG === "en"));
  document.getElementById("lang-zh").setAttribute("aria-pressed", String(LANG === "zh"));
  document.getElementById("prev").setAttribute("aria-label", ui("prev"));
  document.getElementById("next").setAttribute("aria-label", ui("next"));
  timeline.setAttribute("aria-label", ui("timeline"));
  document.getElementById("brand-title").textContent = " · " + tr(T("linear attention, step by step", "线性注意力，一步一步"));
  const url = new URL(location.href);
  if (url.searchParams.get("lang") !== LANG) {
    url.searchParams.set("lang", LANG);
    try { history.replaceState(null, "", url.pathname + url.search + url.hash); } catch (e) { /* some file:// setups refuse: the page still works */ }
  }
  if (current.step >= 1) render(current.step);
}

timeline.min = "1";
timeline.max = String(STEPS.length);
// Scene marks: the range input draws a tick at each scene's first step.
document.getElementById("scene-marks").replaceChildren(...SCENE_START.map((n) => h("option", { value: n })));
timeline.addEventListener("input", () => go(Number(timeline.value)));
// The layout follows resize and rotation: CSS moves the boxes, and a scene whose pictures are sized to its column
// is rebuilt at the new width (what the learner typed lives outside the scenes, so nothing is lost).
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    const v = document.querySelector("#stage .visual");
    if (v && Math.abs(v.clientWidth - current.width) > 4) render(current.step, true);
  }, 120);
});
document.getElementById("prev").addEventListener("click", () => go(current.step - 1));
document.getElementById("next").addEventListener("click", () => go(current.step + 1));
document.querySelectorAll("[data-lang]").forEach((b) => b.addEventListener("click", () => setLang(b.dataset.lang)));
window.addEventListener("hashchange", () => { if (stepFromHash() !== current.step) go(stepFromHash()); });
document.addEventListener("keydown", (e) => {
  const tag = (e.target && e.target.tagName) || "";
  // Arrow keys belong to a focused field or slider (the timeline handles them itself through its input event).
  if (e.key === "Escape" && (tag === "INPUT" || tag === "SELECT")) { e.target.blur(); return; }  // back to the arrows
  if (tag === "INPUT" || tag === "SELECT" || tag === "TEXTAREA" || e.altKey || e.ctrlKey || e.metaKey) return;
  if (e.key === "ArrowRight" || e.key === "PageDown") { go(current.step + 1); e.preventDefault(); }
  else if (e.key === "ArrowLeft" || e.key === "PageUp") { go(current.step - 1); e.preventDefault(); }
  else if (e.key === "Home") { go(1); e.preventDefault(); }
  else if (e.key === "End") { go(STEPS.length); e.preventDefault(); }
});

window.linattnExplainer = { run, steps: STEPS.length, scenes: SCENES.map((sc) => sc.id), sceneStarts: SCENE_START, go, setLang, data: DATA };
LANG = new URLSearchParams(location.search).get("lang") === "zh" ? "zh" : (DATA.lang === "zh" ? "zh" : "en");
setLang(LANG);
render(stepFromHash());
