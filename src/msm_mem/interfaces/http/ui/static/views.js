/* The timeline, evidence-trail and audit views. Every fetch is a governed API call. */
"use strict";

(() => {
  const { h, fill, api, badge, when, relative, short, download } = MSM;
  const P = (pid) => `/v1/patients/${encodeURIComponent(pid)}`;

  function section(title, ...children) {
    const id = `sec-${title.toLowerCase().replace(/[^a-z]+/g, "-")}`;
    return h("section", { class: "card", "aria-labelledby": id }, h("h2", { id }, title), ...children);
  }

  function table(caption, headers, rows) {
    return h("div", { class: "table-wrap" },
      h("table", {},
        h("caption", { class: "sr-only" }, caption),
        h("thead", {}, h("tr", {}, headers.map((x) => h("th", { scope: "col" }, x)))),
        h("tbody", {}, rows)));
  }

  /* ---------------------------------------------------------------- timeline */

  function claimChain(history) {
    return h("ol", { class: "chain", "aria-label": "Claim versions, oldest first" },
      history.map((c) => h("li", { class: c.state },
        h("div", { class: "chain-head" }, badge(c.state), badge(c.evidence_tier, "etier"),
          h("span", { class: "muted" }, when(c.created_at))),
        h("p", {}, c.content),
        h("p", { class: "muted small" }, `${short(c.claim_id, 16)}`,
          c.supersedes ? ` supersedes ${short(c.supersedes, 16)}` : " (first version)"))));
  }

  MSM.views.timeline = async (body, pid) => {
    const [episodes, claims, semantic, stm, thumbs] = await Promise.all([
      api(`${P(pid)}/episodes?limit=500`),
      api(`${P(pid)}/claims?limit=500`),
      api(`${P(pid)}/semantic/history?limit=500`),
      api(`${P(pid)}/stm?limit=500`),
      api(`${P(pid)}/thumbnails?size=128`),
    ]);
    const thumbBy = Object.fromEntries(thumbs.items.map((t) => [t.study_id, t]));
    const studies = {};
    for (const e of episodes.items) {
      if (!e.study_id) continue;
      (studies[e.study_id] = studies[e.study_id] || []).push(e);
    }
    const keys = claims.items.map((c) => c.key).filter((k) => k.startsWith("study:")).slice(0, 60);
    const histories = Object.fromEntries(await Promise.all(keys.map(async (k) =>
      [k, (await api(`${P(pid)}/claims/history?key=${encodeURIComponent(k)}&limit=50`)).items])));
    // a claim key is study:<study>|q:<question key>: one chain per question about a study (a key
    // without "|q:" is a study's claim of an earlier version); its question is that of the
    // episode its newest version names
    const studyOf = (k) => { const r = k.slice(6); const i = r.lastIndexOf("|q:"); return i >= 0 ? r.slice(0, i) : r; };
    const episodeBy = Object.fromEntries(episodes.items.map((e) => [e.episode_id, e]));
    const questionOf = (chain) => {
      for (const c of chain.slice().reverse()) {
        try { const e = episodeBy[JSON.parse(c.source).episode]; if (e) return e.question; } catch (_) { /* not JSON */ }
      }
      return "";
    };
    const chainsOf = {};
    for (const [k, chain] of Object.entries(histories)) (chainsOf[studyOf(k)] = chainsOf[studyOf(k)] || []).push(chain);
    const order = Object.keys(studies).sort((a, b) =>
      Math.min(...studies[a].map((e) => e.timestamp)) - Math.min(...studies[b].map((e) => e.timestamp)));

    const cards = order.map((sid) => {
      const eps = studies[sid].slice().sort((a, b) => a.created_at - b.created_at);
      const latest = eps[eps.length - 1];
      const t = thumbBy[sid];
      const img = t && t.png_base64
        ? h("img", { src: `data:image/png;base64,${t.png_base64}`, alt: `Image of study ${sid}`, width: 128, height: 128 })
        : h("div", { class: "noimg", role: "img", "aria-label": `No image for study ${sid}` }, t ? t.problem : "no image");
      const chains = chainsOf[sid] || [];
      return h("article", { class: "study", "aria-labelledby": `study-${sid}` },
        h("div", { class: "thumb" }, img),
        h("div", { class: "study-body" },
          h("h3", { id: `study-${sid}` }, `Study ${sid}`, h("span", { class: "muted" }, ` · ${when(latest.timestamp)}`)),
          h("p", { class: "q" }, latest.question),
          h("p", {}, h("strong", {}, "Answer: "), latest.answer || "—"),
          h("p", { class: "meta" }, badge(latest.state), badge(latest.evidence_tier, "etier"),
            `confidence ${latest.confidence.toFixed(2)} · ${eps.length} episode version${eps.length > 1 ? "s" : ""}`,
            // decay_at is decided at each read as the sweep decides it: the patient's last activity
            // in the store plus the retention x confidence x tier weight (a new study moves it)
            latest.decay_at ? ` · decays ${when(latest.decay_at)} unless the patient has new activity` : ""),
          ...chains.map((chain) => {
            const q = questionOf(chain);
            return h("details", { open: chain.length > 1 },
              h("summary", {}, `Claim${q ? ` on “${q}”` : ""} and its supersession chain (${chain.length})`),
              claimChain(chain));
          })));
    });

    const semRows = semantic.items.slice().reverse().map((s) => {
      const last = s.impressions[s.impressions.length - 1];
      return h("tr", {}, h("td", {}, `v${s.version}`), h("td", {}, badge(s.state)), h("td", {}, badge(s.evidence_tier, "etier")),
        h("td", {}, when(s.created_at)), h("td", {}, last ? last.text : "—"), h("td", { class: "mono" }, short(s.supersedes, 14) || "—"));
    });
    const stmRows = stm.items.slice().sort((a, b) => b.created_at - a.created_at).map((i) =>
      h("tr", {}, h("td", { class: "mono" }, short(i.item_id, 16)), h("td", {}, badge(i.state)),
        h("td", {}, i.payload ? i.payload.question : i.state === "consolidated" ? "(moved to long-term memory)" : "(content cleared)"),
        h("td", {}, when(i.created_at)),
        h("td", {}, i.state === "active" ? `${when(i.expires_at)} (${relative(i.expires_at)})` : when(i.expires_at))));

    fill(body, 
      h("p", { class: "lede" }, `${order.length} studies · ${semantic.total} semantic versions · ${claims.total} active claims · ${stm.total} short-term items`),
      section("Studies", order.length ? h("div", { class: "studies" }, cards) : h("p", {}, "No studies yet.")),
      section("Semantic state versions", semRows.length
        ? table("Semantic state versions, newest first", ["Version", "State", "Tier", "Created", "Latest impression", "Supersedes"], semRows)
        : h("p", {}, "No semantic state yet.")),
      section("Short-term memory", stmRows.length
        ? table("Short-term items with their expiry", ["Item", "State", "Working set", "Written", "Expires"], stmRows)
        : h("p", {}, "No short-term items.")));
  };

  /* ---------------------------------------------------------------- evidence */

  function bar(value, label) {
    const pct = Math.max(0, Math.min(1, value)) * 100;
    return h("span", { class: "factor", title: label },
      h("span", { class: "factor-bar", "aria-hidden": "true" }, h("span", { style: null, "data-w": pct.toFixed(0) })),
      h("span", {}, value.toFixed(3)));
  }

  function renderAnswer(out, a) {
    const used = new Set(a.cited);
    const rows = a.evidence.map((e, i) => h("tr", { class: used.has(e.id) ? "used" : "" },
      h("td", {}, String(i + 1)),
      h("td", { class: "mono" }, short(e.id, 18)),
      h("td", {}, e.kind),
      h("td", {}, e.score.toFixed(3)),
      h("td", {}, e.cosine.toFixed(3)),
      h("td", {}, bar(e.confidence, "confidence")),
      h("td", {}, bar(e.freshness, "freshness")),
      h("td", {}, bar(e.tier_weight, "evidence tier weight"), h("span", { class: "muted small" }, ` ${e.evidence_tier}`)),
      h("td", {}, used.has(e.id) ? h("span", { class: "used-mark" }, "✓ used") : h("span", { class: "muted" }, "—"))));
    const steps = a.steps.map((s) => h("li", {},
      h("strong", {}, s.memory), ` (${s.scope})`,
      s.refused ? " — switched off" : ` — ${s.ids.length} retrieved, ${s.new_ids.length} new`));
    fill(out, 
      h("section", { class: "card answer", "aria-labelledby": "answer-title" },
        h("h2", { id: "answer-title" }, "Answer"),
        h("p", { class: "answer-text" }, a.answer),
        h("p", { class: "meta" }, `backbone ${a.backbone} · source ${a.source || "—"}`,
          a.gate ? ` · write-back: ${a.gate.written ? "consolidated" : "held"} (${a.gate.reasons.join(", ")})` : " · not written back")),
      section("Retrieved memories",
        h("p", { class: "note" }, "Ranked by score = cosine × composite_k, where composite_k = confidence × freshness × evidence-tier weight. Rows marked ✓ are the memories the answer rests on."),
        table("Evidence trail", ["#", "Memory", "Kind", "Score", "Cosine", "Confidence", "Freshness", "Tier weight", "Used"], rows)),
      section("Retrieval steps", h("ol", { class: "steps" }, steps)));
    for (const el of out.querySelectorAll("[data-w]")) el.style.width = `${el.dataset.w}%`;
  }

  MSM.views.evidence = async (body, pid) => {
    const episodes = await api(`${P(pid)}/episodes?limit=500`);
    const studies = [...new Set(episodes.items.filter((e) => e.media_path && e.study_id).map((e) => e.study_id))];
    const out = h("div", { class: "answer-out", "aria-live": "polite" });
    const form = h("form", { class: "card ask", "aria-label": "Ask with memory" },
      h("div", { class: "field" }, h("label", { for: "ask-study" }, "Image of study"),
        h("select", { id: "ask-study", name: "study" }, studies.map((s) => h("option", { value: s }, s)))),
      h("div", { class: "field grow" }, h("label", { for: "ask-question" }, "Question"),
        h("input", { id: "ask-question", name: "question", value: "What is the impression?", required: true, maxlength: 2000 })),
      h("div", { class: "field check" }, h("input", { id: "ask-writeback", type: "checkbox", name: "write_back" }),
        h("label", { for: "ask-writeback" }, "Write the answer back into memory")),
      h("button", { type: "submit", class: "primary" }, "Ask"));
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const data = new URLSearchParams();
      data.set("image_study", form.querySelector("#ask-study").value);
      data.set("question", form.querySelector("#ask-question").value);
      data.set("write_back", form.querySelector("#ask-writeback").checked ? "true" : "false");
      fill(out, h("p", { class: "card" }, "Asking…"));
      try {
        const a = await api(`${P(pid)}/ask`, { method: "POST", body: data });
        renderAnswer(out, a);
        MSM.announce("Answer ready");
      } catch (err) {
        fill(out, MSM.errorBox(err));
      }
    });
    fill(body, 
      studies.length ? form : h("p", { class: "card" }, "This patient has no stored study image to ask about."), out);
  };

  /* ---------------------------------------------------------------- audit */

  MSM.views.audit = async (body) => {
    const [verify, trail] = await Promise.all([api("/v1/audit/verify"), api("/v1/audit/events?tail=true&limit=60")]);
    const status = verify.ok
      ? h("div", { class: "verdict ok" }, h("strong", {}, "Chain verified"),
        h("span", {}, `${verify.count} events · head ${short(verify.head_hash, 16)}`))
      : h("div", { class: "verdict broken", role: "alert" }, h("strong", {}, "Chain broken"),
        h("span", {}, `first broken link: event #${verify.first_bad_seq}`), h("span", { class: "small" }, verify.reason));
    const cps = trail.checkpoints.slice(-8).reverse().map((c) => h("tr", {},
      h("td", {}, String(c.size)), h("td", {}, when(c.time)), h("td", { class: "mono" }, short(c.head_hash, 18)),
      h("td", { class: "mono" }, short(c.signature, 18))));
    const evs = trail.events.slice().reverse().map((e) => h("tr", { class: e.seq === verify.first_bad_seq ? "bad" : e.outcome === "denied" ? "denied" : "" },
      h("td", {}, String(e.seq)), h("td", {}, when(e.time)), h("td", {}, `${e.actor} (${e.role})`),
      h("td", {}, e.action), h("td", {}, `${e.source_tier} → ${e.target_tier}`), h("td", {}, badge(e.outcome)),
      h("td", { class: "mono" }, e.patient || "—"), h("td", {}, String(e.record_ids.length)),
      h("td", { class: "mono" }, `${short(e.prev_hash, 8)} → ${short(e.event_hash, 8)}`)));
    const exportBtn = h("button", { type: "button", class: "primary", onclick: async () => {
      try { await download("/v1/audit/fhir", "msm-mem-audit-events.ndjson"); } catch (err) { body.prepend(MSM.errorBox(err)); }
    } }, "Download FHIR AuditEvent export");
    fill(body, 
      section("Verification", status, h("p", { class: "note" },
        "The hash chain is walked event by event and checked against the signed checkpoints. Events carry ids and pseudonyms only."),
      exportBtn),
      trail.unreadable_seq ? h("p", { class: "card problem", role: "alert" }, `Event #${trail.unreadable_seq} cannot be read: the list stops before it.`) : null,
      section("Signed checkpoints", cps.length
        ? table("Latest signed checkpoints", ["Size", "Signed", "Head hash", "Signature"], cps) : h("p", {}, "No checkpoint yet.")),
      section(`Latest events (of ${trail.head_seq})`,
        table("Latest audit events, newest first", ["Seq", "Time", "Actor", "Action", "Tiers", "Outcome", "Patient pseudonym", "Ids", "Link"], evs)));
  };
})();
