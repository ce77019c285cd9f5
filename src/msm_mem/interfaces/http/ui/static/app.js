/* msm-mem memory explorer: sign-in, API calls, routing, shared helpers.
   The bearer token lives in a closure of this script only (no storage, no cookie), so no
   other site can make the browser send it: there is no ambient credential to forge (CSRF). */
"use strict";

const MSM = (() => {
  let token = null;
  let me = null;
  const views = {};

  /* element builder: h("p", {class: "x"}, "text", child) - text is always a text node */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (v === true) el.setAttribute(k, "");
      else el.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  /* replace an element's children, skipping empty ones */
  function fill(el, ...children) {
    el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
    return el;
  }

  class ApiError extends Error {
    constructor(status, problem) {
      super(problem.detail || problem.title || `HTTP ${status}`);
      this.status = status;
      this.problem = problem;
    }
  }

  async function request(path, options = {}) {
    const headers = Object.assign({ Authorization: `Bearer ${token}` }, options.headers || {});
    const resp = await fetch(path, Object.assign({}, options, { headers, credentials: "omit", cache: "no-store" }));
    if (!resp.ok) {
      let problem = {};
      try { problem = await resp.json(); } catch (_) { /* not JSON */ }
      throw new ApiError(resp.status, problem);
    }
    return resp;
  }

  async function api(path, options) {
    return (await request(path, options)).json();
  }

  /* a download of an authenticated resource: fetched as a blob, saved under `name` */
  async function download(path, name) {
    const blob = await (await request(path)).blob();
    const url = URL.createObjectURL(blob);
    const a = h("a", { href: url, download: name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
    announce(`Downloaded ${name}`);
    return blob;
  }

  function announce(text) {
    const s = document.getElementById("status");
    s.textContent = "";
    setTimeout(() => { s.textContent = text; }, 30);
  }

  function when(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const d = new Date(seconds * 1000);
    return d.toISOString().replace("T", " ").slice(0, 16) + " UTC";
  }

  function relative(seconds) {
    const diff = seconds - Date.now() / 1000;
    const abs = Math.abs(diff);
    const unit = abs >= 172800 ? [86400, "d"] : abs >= 7200 ? [3600, "h"] : [60, "min"];
    const n = Math.round(abs / unit[0]);
    return diff >= 0 ? `in ${n} ${unit[1]}` : `${n} ${unit[1]} ago`;
  }

  function short(id, n = 14) {
    return id && id.length > n ? id.slice(0, n) + "…" : id || "";
  }

  function badge(text, kind) {
    return h("span", { class: `badge ${kind || text}` }, text);
  }

  function errorBox(err) {
    const refused = err.status === 403;
    return h("div", { class: "card problem", role: "alert" },
      h("h2", {}, refused ? "Refused" : err.status === 404 ? "Not found" : "Something went wrong"),
      h("p", {}, err.message),
      refused ? h("p", { class: "note" }, "The refusal was recorded in the audit tier.") : null);
  }

  /* which views a role sees, in order */
  const ROLE_VIEWS = {
    clinician: ["timeline", "evidence", "walkthroughs"],
    agent: ["timeline", "evidence", "walkthroughs"],
    critic: ["timeline", "walkthroughs"],
    system: ["timeline"],
    auditor: ["walkthroughs", "audit"],
    admin: ["walkthroughs", "audit"],
  };
  const LABELS = { timeline: "Timeline", evidence: "Evidence trail", walkthroughs: "Walkthroughs", audit: "Audit" };

  function isAuditRole() { return me && (me.role === "auditor" || me.role === "admin"); }
  function needsPatient(view) { return view !== "audit" && !(view === "walkthroughs" && isAuditRole()); }

  function scopePatients() { return me.patients.filter((p) => p !== "*"); }
  function anyPatient() { return me.patients.includes("*"); }

  /* the patient picker of a view: the credential's patients, or free text for "*" */
  function patientPicker(view, current) {
    const go = (pid) => { if (pid) location.hash = `#/${view}/${encodeURIComponent(pid)}`; };
    const form = h("form", { class: "picker", "aria-label": "Choose a patient", onsubmit: (ev) => {
      ev.preventDefault();
      go(form.querySelector("[name=patient]").value.trim());
    } });
    const id = `patient-${view}`;
    form.append(h("label", { for: id }, "Patient"));
    if (anyPatient()) {
      form.append(h("input", { id, name: "patient", value: current || "", required: true, spellcheck: "false" }));
    } else {
      const sel = h("select", { id, name: "patient", onchange: () => go(sel.value) },
        scopePatients().map((p) => h("option", { value: p, selected: p === current }, p)));
      if (current && !scopePatients().includes(current)) {
        sel.prepend(h("option", { value: current, selected: true }, current));
      }
      form.append(sel);
    }
    form.append(h("button", { type: "submit" }, "Open"));
    return form;
  }

  function route() {
    if (!me) return;
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    const allowed = ROLE_VIEWS[me.role] || [];
    let view = allowed.includes(parts[0]) ? parts[0] : allowed[0];
    let patient = parts[1] || "";
    if (!patient && needsPatient(view)) patient = scopePatients()[0] || "";
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.view === view) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const root = document.getElementById("view");
    root.replaceChildren();
    MSM.stopAll && MSM.stopAll();
    const head = h("div", { class: "view-head" }, h("h1", { id: "view-title" }, LABELS[view]));
    if (needsPatient(view)) head.append(patientPicker(view, patient));
    root.append(head);
    const body = h("div", { class: "view-body", "aria-busy": "true" });
    root.append(body);
    document.title = `${LABELS[view]} · msm-mem explorer`;
    if (needsPatient(view) && !patient) {
      body.append(h("p", { class: "card" }, "Choose a patient."));
      body.removeAttribute("aria-busy");
      return;
    }
    Promise.resolve(views[view](body, patient)).catch((err) => {
      body.replaceChildren(errorBox(err));
    }).finally(() => body.removeAttribute("aria-busy"));
  }

  function signedIn(who) {
    me = who;
    document.getElementById("login").hidden = true;
    document.getElementById("view").hidden = false;
    const nav = document.getElementById("nav");
    nav.replaceChildren(...(ROLE_VIEWS[who.role] || []).map((v) =>
      h("a", { href: `#/${v}`, "data-view": v }, LABELS[v])));
    nav.hidden = false;
    document.getElementById("who").hidden = false;
    document.getElementById("who-text").textContent = `${who.id} · ${who.role}`;
    route();
    document.getElementById("main").focus();
  }

  function signOut() {
    token = null;
    me = null;
    MSM.stopAll && MSM.stopAll();
    document.getElementById("view").replaceChildren();
    document.getElementById("view").hidden = true;
    document.getElementById("nav").hidden = true;
    document.getElementById("who").hidden = true;
    document.getElementById("login").hidden = false;
    document.getElementById("token").value = "";
    document.getElementById("token").focus();
    history.replaceState(null, "", "/ui");
  }

  function start() {
    const form = document.getElementById("login-form");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const input = document.getElementById("token");
      const error = document.getElementById("login-error");
      error.textContent = "";
      token = input.value.trim();
      input.value = "";
      try {
        signedIn(await api("/v1/whoami"));
      } catch (err) {
        token = null;
        error.textContent = err.status === 401 ? "That key was not accepted (unknown, revoked or expired)." : err.message;
        input.focus();
      }
    });
    document.getElementById("signout").addEventListener("click", signOut);
    window.addEventListener("hashchange", route);
  }

  document.addEventListener("DOMContentLoaded", start);
  return { h, fill, api, request, download, announce, when, relative, short, badge, errorBox, views, me: () => me,
    isAuditRole, patientPicker };
})();
