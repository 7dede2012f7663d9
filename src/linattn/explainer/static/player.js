// ------------------------------------------------------------------------------------------------ player
const STEPS = SCENES.flatMap((sc, si) => sc.text.map((_, sub) => ({ si, sub })));
const stage = document.getElementById("stage"), timeline = document.getElementById("timeline");
let current = { step: -1, si: -1, lang: null, update: null };

function stepFromHash() {
  const m = /step=(\d+)/.exec(location.hash);
  return m ? Math.min(STEPS.length - 1, Math.max(0, Number(m[1]))) : 0;
}

function render(step) {
  step = Math.min(STEPS.length - 1, Math.max(0, step));
  const { si, sub } = STEPS[step], sc = SCENES[si];
  if (si !== current.si || LANG !== current.lang) {
    const visual = h("div", { class: "visual" });
    stage.replaceChildren(h("h2", {}, tr(sc.title)), h("div", { class: "narration", id: "narration" }), visual);
    stage.dataset.scene = sc.id;
    document.getElementById("scene-title").textContent = "· " + tr(sc.title);
    current.update = sc.build(visual);
  }
  document.getElementById("narration").textContent = tr(sc.text[sub]);
  current.update(sub);
  current = Object.assign(current, { step, si, lang: LANG });
  const root = document.documentElement;
  root.dataset.step = String(step);
  root.dataset.steps = String(STEPS.length);
  root.dataset.scene = sc.id;
  timeline.value = String(step);
  document.getElementById("counter").textContent = LANG === "zh" ? "第 " + (step + 1) + " 步 / 共 " + STEPS.length + " 步" : "step " + (step + 1) + " of " + STEPS.length;
  if (stepFromHash() !== step || !/step=/.test(location.hash)) history.replaceState(null, "", "#step=" + step);
}

function go(step) { render(step); }

function setLang(lang) {
  LANG = lang === "zh" ? "zh" : "en";
  document.documentElement.lang = LANG === "zh" ? "zh-CN" : "en";
  document.getElementById("lang-en").setAttribute("aria-pressed", String(LANG === "en"));
  document.getElementById("lang-zh").setAttribute("aria-pressed", String(LANG === "zh"));
  const url = new URL(location.href);
  if (url.protocol !== "file:" || url.searchParams.get("lang") !== LANG) {
    url.searchParams.set("lang", LANG);
    try { history.replaceState(null, "", url.pathname + url.search + url.hash); } catch (e) { /* some file:// setups refuse: the page still works */ }
  }
  if (current.step >= 0) render(current.step);
}

timeline.max = String(STEPS.length - 1);
timeline.addEventListener("input", () => go(Number(timeline.value)));
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
  else if (e.key === "Home") { go(0); e.preventDefault(); }
  else if (e.key === "End") { go(STEPS.length - 1); e.preventDefault(); }
});

window.linattnExplainer = { run, steps: STEPS.length, scenes: SCENES.map((sc) => sc.id), go, setLang, data: DATA };
LANG = new URLSearchParams(location.search).get("lang") === "zh" ? "zh" : (DATA.lang === "zh" ? "zh" : "en");
setLang(LANG);
render(stepFromHash());
