/* The two tier walkthroughs: frames from /v1/walkthroughs/{name} (built from this store's audit
   events), a player with Previous/Next, Play and a speed menu, step dots, keyboard control
   (left/right/space while the panel has focus) and the server-rendered animated GIF. */
"use strict";

(() => {
  const { h, fill, api, download, short, when } = MSM;
  const SPEEDS = [3.5, 4, 4.5, 5, 5.5, 6];
  const PARTS = [["agent", "Agent"], ["stm", "Short-term memory"], ["ltm", "Long-term memory"], ["audit", "Audit tier"]];
  const players = [];

  MSM.stopAll = () => { for (const p of players.splice(0)) p.stop(); };

  function player(w, query) {
    let index = 0;
    let timer = null;
    const n = w.frames.length;
    const label = `walk-${w.name}`;
    const stage = h("div", { class: "stage", "aria-hidden": "true" },
      PARTS.map(([k, name]) => h("div", { class: `tier ${k}`, "data-part": k }, h("span", {}, name))));
    const stepLine = h("p", { class: "step-line" });
    const caption = h("p", { class: "caption" });
    const events = h("ul", { class: "events", "aria-label": "Audit events of this step" });
    const live = h("div", { class: "sr-only", "aria-live": "polite" });
    const dots = h("div", { class: "dots", role: "group", "aria-label": "Steps" },
      w.frames.map((f, i) => h("button", { type: "button", class: "dot", "aria-label": `Go to step ${i + 1}: ${f.title}`,
        onclick: () => { stop(); show(i); } })));
    const prev = h("button", { type: "button", "aria-label": "Previous step", onclick: () => { stop(); show(index - 1); } }, "◀ Prev");
    const next = h("button", { type: "button", "aria-label": "Next step", onclick: () => { stop(); show(index + 1); } }, "Next ▶");
    const play = h("button", { type: "button", class: "primary play", "aria-pressed": "false", "aria-label": "Play",
      onclick: () => (timer ? stop() : start()) }, "▶ Play");
    const speedId = `${label}-speed`;
    const speed = h("select", { id: speedId, onchange: () => { if (timer) { stop(); start(); } } },
      SPEEDS.map((s) => h("option", { value: s, selected: s === 3.5 }, `${s} s / frame`)));
    const gif = h("button", { type: "button", class: "ghost", onclick: async () => {
      const q = new URLSearchParams(query);
      q.set("seconds", speed.value);
      try { await download(`/v1/walkthroughs/${w.name}/gif?${q}`, `msm-mem-walkthrough-${w.name}.gif`); }
      catch (err) { panel.append(MSM.errorBox(err)); }
    } }, "Download animated GIF");

    function show(i) {
      index = (i + n) % n;
      const f = w.frames[index];
      for (const el of stage.children) el.classList.toggle("lit", f.active.includes(el.dataset.part));
      fill(stepLine, h("strong", {}, `Step ${f.step} of ${f.of}`), ` — ${f.title}`,
        f.missing ? h("span", { class: "badge missing" }, "no event yet") : null);
      caption.textContent = f.caption;
      fill(events, ...f.events.slice(0, 8).map((e) => h("li", {},
        h("span", { class: "seq" }, `#${e.seq}`), h("span", { class: "act" }, e.action),
        h("span", {}, `${e.source_tier} → ${e.target_tier}`), h("span", { class: "muted" }, `${e.role} ${e.actor}`),
        h("span", { class: "mono muted" }, e.record_ids.slice(0, 2).map((x) => short(x, 12)).join(", ") +
          (e.record_ids.length > 2 ? ` +${e.record_ids.length - 2}` : "")),
        h("span", { class: "mono muted hash" }, short(e.event_hash, 10)))));
      if (!f.events.length) events.append(h("li", { class: "muted" }, "No audit event for this step."));
      [...dots.children].forEach((d, j) => {
        d.classList.toggle("on", j === index);
        if (j === index) d.setAttribute("aria-current", "step"); else d.removeAttribute("aria-current");
      });
      panel.dataset.step = String(index + 1);
      live.textContent = `Step ${f.step} of ${f.of}: ${f.title}. ${f.caption}`;
    }
    function start() {
      timer = setInterval(() => show(index + 1), Number(speed.value) * 1000);
      play.textContent = "❚❚ Pause";
      play.setAttribute("aria-pressed", "true");
      play.setAttribute("aria-label", "Pause");
      panel.dataset.playing = "true";
    }
    function stop() {
      if (timer) clearInterval(timer);
      timer = null;
      play.textContent = "▶ Play";
      play.setAttribute("aria-pressed", "false");
      play.setAttribute("aria-label", "Play");
      panel.dataset.playing = "false";
    }
    const panel = h("section", { class: "card walkthrough", tabindex: "0", id: label, "aria-labelledby": `${label}-title`,
      "aria-describedby": `${label}-keys`, "data-name": w.name },
      h("h2", { id: `${label}-title` }, w.title),
      h("p", { id: `${label}-keys`, class: "note" }, w.complete
        ? "Replayed from this store's audit events. Use ◀ / ▶ or the dots; ← / → / Space while this panel has focus."
        : "Replayed from this store's audit events; some steps have no event yet. ← / → / Space while this panel has focus."),
      stage, stepLine, caption, events,
      h("div", { class: "controls" }, prev, play, next,
        h("label", { for: speedId, class: "speed" }, "Speed"), speed, gif),
      dots, live);
    panel.addEventListener("keydown", (ev) => {
      if (ev.target !== panel && ev.target.tagName === "SELECT") return;
      if (ev.key === "ArrowRight") { stop(); show(index + 1); ev.preventDefault(); }
      else if (ev.key === "ArrowLeft") { stop(); show(index - 1); ev.preventDefault(); }
      else if (ev.key === " " && (ev.target === panel)) { timer ? stop() : start(); ev.preventDefault(); }
    });
    show(0);
    players.push({ stop });
    return panel;
  }

  MSM.views.walkthroughs = async (body, pid) => {
    const query = MSM.isAuditRole() ? {} : { patient_id: pid };
    const q = new URLSearchParams(query).toString();
    const [a, b] = await Promise.all([
      api(`/v1/walkthroughs/question${q ? "?" + q : ""}`),
      api(`/v1/walkthroughs/movement${q ? "?" + q : ""}`),
    ]);
    fill(body, 
      h("p", { class: "lede" }, "Three tiers: short-term memory (the working set of one turn, on a TTL), long-term memory (what the system learned: claims with source and confidence, superseded, never rewritten, decaying as they age) and the audit tier (the hash-chained trail of every access). Both walkthroughs replay real events of this store",
        MSM.isAuditRole() ? "." : ` for patient ${pid}.`),
      player(a, query), player(b, query),
      h("p", { class: "note" }, `Built ${when(Date.now() / 1000)}.`));
  };
})();
