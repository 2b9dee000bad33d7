// The per-unit losses of PPO clip, dual clip (Algorithm 1) and RPG-Style Clip (Algorithm 2)
// against the ratio w, written as rpg_ref/core/losses.py computes them (dual_clip,
// rpg_style_clip, the rpg-* and rpg-reinforce-* formulas), for one unit with pi_ref = pi_old and
// ell = -log pi_theta = 1. tests/test_site.py compares these numbers with rpg_ref.core.losses.
// No dependencies: the page draws SVG itself.
"use strict";

(function () {
  const ELL = 1.0;  // ell = -log pi_theta(x) at every point, as in the paper's figures
  const N = 240;    // points per curve

  // d(w): the loss's KL estimate with pi_ref = pi_old (rho = w, u = 1), rpg_ref/core/divergences.py
  const k3 = (t) => Math.expm1(t) - t;                 // rpg_ref.core.kl.k3
  const KL = {
    fkl: { d: (w) => -Math.log(w), dd: (w) => -1 / w, cKL: (w, b) => b },
    rkl: { d: (w) => w * Math.log(w), dd: (w) => Math.log(w) + 1,
           cKL: (w, b) => -b * w * (Math.log(w) + 1) },
    ufkl: { d: (w) => k3(Math.log(w)), dd: (w) => 1 - 1 / w, cKL: (w, b) => -b * (w - 1) },
    urkl: { d: (w) => w * k3(-Math.log(w)), dd: (w) => Math.log(w),
            cKL: (w, b) => -b * w * Math.log(w) },
  };

  // Algorithm 1's dual clip of -w Ahat (losses.dual_clip). Ahat(w) and dAhat/dw are given; the
  // returned grad is d loss / d log pi_theta = w d loss / dw (w = pi_theta / pi_old).
  function dualClip(w, Ahat, dAhat, lo, hi, c) {
    const plain = -w * Ahat;
    const wc = Math.min(Math.max(w, lo), hi);
    const clipped = -wc * Ahat;
    let loss = plain;
    let dLdw = -Ahat - w * dAhat;
    if (clipped > plain) {                       // max(-w Ahat, -clip(w) Ahat): w is outside
      loss = clipped;
      dLdw = -wc * dAhat;
    }
    if (c !== null && Ahat < 0 && -c * Ahat < loss) {   // min(., -c Ahat) for Ahat < 0
      loss = -c * Ahat;
      dLdw = -c * dAhat;
    }
    return { loss: loss, grad: w * dLdw };
  }

  // Algorithm 2, RPG-Style Clip (losses.rpg_style_clip): L = SG(w A + C_KL) ell on the unclipped
  // segments, so the gradient -(w A + C_KL) reaches theta through log pi_theta; w is a constant.
  function rpgStyleClip(w, A, cKL, lo, hi, c) {
    const weight = w * A + cKL;
    const pos = weight * ELL >= 0;                       // psi = A' ell >= 0
    const high = pos && w >= hi;
    const low = !pos && w <= lo;
    const dual = c !== null && !pos && w >= c;
    if (high || low || dual) {
      const wFlat = dual ? c : Math.min(Math.max(w, lo), hi);
      return { loss: (A * wFlat + cKL) * ELL, grad: 0 };
    }
    return { loss: weight * ELL, grad: -weight };
  }

  const CURVES = {
    ppo: {
      label: "PPO clip (no KL, no dual bound)",
      at: (w, A, p, lo, hi) => dualClip(w, A, 0, lo, hi, null),
    },
    alg1: {
      label: "Algorithm 1: dual clip of -w Â",
      at: (w, A, p, lo, hi, c) => {
        const kl = KL[p.kl];
        const Ahat = A - p.beta * kl.d(w) / w;         // A_hat = A - beta d / w
        const dAhat = -p.beta * (kl.dd(w) * w - kl.d(w)) / (w * w);
        return dualClip(w, Ahat, dAhat, lo, hi, c);
      },
    },
    alg2: {
      label: "Algorithm 2: RPG-Style Clip",
      at: (w, A, p, lo, hi, c) => rpgStyleClip(w, A, KL[p.kl].cKL(w, p.beta), lo, hi, c),
    },
  };
  const LOSS_NAMES = {  // the registered losses each curve is, for the reader and the test
    ppo: () => "dapo", alg1: (p) => "rpg-" + p.kl, alg2: (p) => "rpg-reinforce-" + p.kl,
  };
  const ADVANTAGES = [1, -1];

  function wRange(p) {
    return [0.2, Math.max(3.0, (p.c === null ? 0 : p.c) + 0.5)];
  }

  // Every curve at N points: {w, params, curves: {ppo|alg1|alg2: {name, "1"|"-1": {loss, grad}}}}
  function curves(p) {
    const lo = 1.0 - p.eps_low, hi = 1.0 + p.eps_high;
    const c = p.c === null || p.c === Infinity ? null : p.c;
    const [a, b] = wRange(p);
    const w = [];
    for (let i = 0; i < N; i++) w.push(a + (b - a) * (i + 0.5) / N);   // midpoints
    const out = { w: w, params: Object.assign({}, p), curves: {} };
    for (const key of Object.keys(CURVES)) {
      const cur = { name: LOSS_NAMES[key](p) };
      for (const A of ADVANTAGES) {
        const pts = w.map((wi) => CURVES[key].at(wi, A, p, lo, hi, c));
        cur[String(A)] = { loss: pts.map((q) => q.loss), grad: pts.map((q) => q.grad) };
      }
      out.curves[key] = cur;
    }
    return out;
  }

  // ---------------------------------------------------------------- drawing (SVG)
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = { ppo: "#2ca02c", alg1: "#1f77b4", alg2: "#d62728" };
  const W = 420, H = 260, M = { l: 48, r: 10, t: 26, b: 34 };

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (parent) parent.appendChild(e);
    return e;
  }

  function niceTicks(lo, hi, n) {
    const step0 = (hi - lo) / n;
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0);
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + 1e-12; t += step) ticks.push(t);
    return ticks;
  }

  function drawPanel(svg, data, A, what, title) {
    svg.replaceChildren();
    const w = data.w, p = data.params;
    let ys = [];
    for (const key of Object.keys(CURVES)) ys = ys.concat(data.curves[key][String(A)][what]);
    let ymin = Math.min(...ys), ymax = Math.max(...ys);
    if (ymax - ymin < 1e-9) { ymin -= 1; ymax += 1; }
    const pad = 0.06 * (ymax - ymin);
    ymin -= pad; ymax += pad;
    const [x0, x1] = wRange(p);
    const X = (x) => M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r);
    const Y = (y) => H - M.b - (y - ymin) / (ymax - ymin) * (H - M.t - M.b);
    el("rect", { x: 0, y: 0, width: W, height: H, fill: "white" }, svg);
    for (const t of niceTicks(x0, x1, 6)) {
      el("line", { x1: X(t), x2: X(t), y1: M.t, y2: H - M.b, stroke: "#eee" }, svg);
      el("text", { x: X(t), y: H - M.b + 14, "font-size": 10, "text-anchor": "middle" }, svg)
        .textContent = +t.toFixed(2);
    }
    for (const t of niceTicks(ymin, ymax, 5)) {
      el("line", { x1: M.l, x2: W - M.r, y1: Y(t), y2: Y(t), stroke: "#eee" }, svg);
      el("text", { x: M.l - 4, y: Y(t) + 3, "font-size": 10, "text-anchor": "end" }, svg)
        .textContent = +t.toFixed(3);
    }
    if (ymin < 0 && ymax > 0) {
      el("line", { x1: M.l, x2: W - M.r, y1: Y(0), y2: Y(0), stroke: "#999" }, svg);
    }
    const marks = [[1 - p.eps_low, "1−ε_low"], [1 + p.eps_high, "1+ε_high"]];
    if (p.c !== null) marks.push([p.c, "c"]);
    for (const [x, label] of marks) {
      if (x < x0 || x > x1) continue;
      el("line", { x1: X(x), x2: X(x), y1: M.t, y2: H - M.b, stroke: "#bbb",
                   "stroke-dasharray": "2,2" }, svg);
      el("text", { x: X(x) + 2, y: M.t + 9, "font-size": 9, fill: "#555" }, svg)
        .textContent = label;
    }
    for (const key of Object.keys(CURVES)) {
      const cur = data.curves[key][String(A)];
      // one path for the points with a gradient (solid), one for the flat ones (dashed)
      for (const flat of [false, true]) {
        let d = "", prev = false;
        for (let i = 0; i < w.length; i++) {
          const on = (cur.grad[i] === 0) === flat;
          if (on) d += (prev ? "L" : "M") + X(w[i]).toFixed(2) + "," + Y(cur[what][i]).toFixed(2);
          prev = on;
        }
        if (d) {
          el("path", { d: d, fill: "none", stroke: COLORS[key], "stroke-width": 2,
                       "stroke-dasharray": flat ? "5,4" : "none", "data-curve": key,
                       "data-flat": flat }, svg);
        }
      }
    }
    el("text", { x: M.l, y: 14, "font-size": 12, "font-weight": "bold" }, svg).textContent = title;
    el("text", { x: (M.l + W - M.r) / 2, y: H - 4, "font-size": 11, "text-anchor": "middle" }, svg)
      .textContent = "w = π_θ / π_old";
  }

  // ---------------------------------------------------------------- the page's controls
  function params(root) {
    const num = (name) => parseFloat(root.querySelector(`[name=${name}]`).value);
    const dual = root.querySelector("[name=dual]").checked;
    return { eps_low: num("eps_low"), eps_high: num("eps_high"), c: dual ? num("c") : null,
             beta: num("beta"), kl: root.querySelector("[name=kl]").value };
  }

  function render(root) {
    const p = params(root);
    const data = curves(p);
    for (const out of root.querySelectorAll("output[data-for]")) {
      out.textContent = root.querySelector(`[name=${out.dataset.for}]`).value;
    }
    for (const svg of root.querySelectorAll("svg[data-panel]")) {
      const [what, sign] = svg.dataset.panel.split(":");
      const A = parseInt(sign, 10);
      const head = what === "loss" ? "per-unit loss" : "d loss / d log π_θ";
      drawPanel(svg, data, A, what, `${head}, A = ${A > 0 ? "+1" : "−1"}`);
    }
    for (const key of Object.keys(CURVES)) {
      const span = root.querySelector(`[data-name=${key}]`);
      if (span) span.textContent = data.curves[key].name;
    }
    root.dataset.renders = String(parseInt(root.dataset.renders || "0", 10) + 1);
    return data;
  }

  function init() {
    const root = document.getElementById("clip-shapes");
    if (!root) return;
    for (const svg of root.querySelectorAll("svg[data-panel]")) {
      svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    }
    root.addEventListener("input", () => render(root));
    root.addEventListener("change", () => render(root));
    render(root);
  }

  // For the browser test and the curious reader: rpgClipShapes.curves({eps_low, eps_high, c,
  // beta, kl}) and rpgClipShapes.current() (what the page draws now).
  window.rpgClipShapes = {
    curves: curves,
    params: () => params(document.getElementById("clip-shapes")),
    current: () => curves(params(document.getElementById("clip-shapes"))),
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
