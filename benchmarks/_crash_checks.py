"""The parent's checks of the crash-safety run (``crash_safety.py``), after each kill: settle
the call that was in flight (all there or not at all), then find every acknowledged write
exactly once and nothing half-written; the chain and the checkpoints verify.

The store is opened through the public API; whether its vectors, rows and key table agree is
checked on the store itself (private attributes: no public call exposes them)."""

from __future__ import annotations

from typing import Any

from _crash_child import ADMIN, AGENT, AUDITOR, Model, Study, apply

from msm_mem import MsmMem, MsmMemError, StmState
from msm_mem._governance.key_home import default_home


class CheckFailed(AssertionError):
    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check


def _expect(ok: bool, check: str, detail: str) -> None:
    if not ok:
        raise CheckFailed(check, detail)


def _episodes(mem: MsmMem, patient: str) -> list[Any]:
    return mem.episodes(AGENT, patient)


def _study_claims(mem: MsmMem, patient: str, study: str) -> list[str]:
    """Every version of the claim of the study's one question (the children ask one a study)."""
    keys = {c.key for c in mem.claims(AGENT, patient) if c.key.startswith(f"study:{study}|q:")}
    _expect(len(keys) <= 1, "acknowledged", f"study {study}: claims of {len(keys)} questions")
    return [c.claim_id for key in keys for c in mem.claim_history(AGENT, patient, key)]


def _held(mem: MsmMem, patient: str, study: str) -> list[Any]:
    """The study's answered short-term items the gate held."""
    return [
        i
        for i in mem.stm_items(AGENT, patient)
        if i.state is StmState.ACTIVE and i.payload is not None and i.payload.study_id == study and i.payload.answer
    ]


def _key(mem: MsmMem, patient: str) -> Any:
    # the store's key table: is the data key destroyed? (a shredded key's row keeps a keyed
    # digest of the patient id instead of the id)
    keys = mem._store.keys()
    return keys.get(patient) or keys.get(mem._cipher.tomb_ref(patient) or patient)


def settle(mem: MsmMem, model: Model, op: str, plan: dict[str, Any]) -> bool:
    """Whether the call in flight at the kill committed; it must be all there or not at all
    (CheckFailed ``in-flight`` otherwise). A committed one is added to the model."""
    result: dict[str, Any] = {}
    if op == "ingest":
        if plan["patient"] in model.shredded:
            return False
        stored = {e.study_id for e in _episodes(mem, plan["patient"])} if _readable(mem, plan["patient"]) else set()
        present = [s for s in plan["studies"] if s in stored]
        _expect(len(present) in (0, len(plan["studies"])), "in-flight", f"ingest stored {present} of {plan['studies']}")
        done = bool(present)
    elif op == "ask":
        claims = _study_claims(mem, plan["patient"], plan["study"])
        eps = [e for e in _episodes(mem, plan["patient"]) if e.study_id == plan["study"]]
        _expect(len(claims) <= 1 and len(eps) <= 1, "in-flight", f"ask stored {claims} and {len(eps)} episodes")
        _expect(bool(claims) or not eps, "in-flight", "ask stored an episode without its claim")
        held = _held(mem, plan["patient"], plan["study"])
        _expect(not (held and claims), "in-flight", "a held answer became a claim")
        # a written answer leaves its episode and claim; a held one its short-term item only
        done, result = bool(claims) or bool(held), {"written": bool(eps)}
    elif op == "observe":
        items = [
            i
            for i in mem.stm_items(AGENT, plan["patient"])
            if i.payload is not None and i.payload.study_id == plan["study"]
        ]
        _expect(len(items) <= 1, "in-flight", f"observe stored {len(items)} items")
        done, result = bool(items), {"item": items[0].item_id if items else ""}
    elif op == "consolidate":
        (item,) = [i for i in mem.stm_items(AGENT, plan["patient"]) if i.item_id == plan["item"]]
        eps = [e for e in _episodes(mem, plan["patient"]) if e.study_id == plan["study"]]
        _expect(len(eps) <= 1, "in-flight", f"consolidate stored {len(eps)} episodes")
        if item.state is StmState.ACTIVE:
            _expect(not eps, "in-flight", "consolidate stored an episode and left its item active")
            # held by the gate, or not committed: either way the item may be consolidated again
            return item.payload is not None and item.payload.answer is not None
        _expect(item.payload is None, "in-flight", f"a {item.state.value} item kept its content")
        done, result = True, {"episode": eps[0].episode_id if eps else None}
    elif op == "feedback":
        study = model.studies[plan["study"]]
        claims = _study_claims(mem, plan["patient"], plan["study"])
        # the first is the written ask's or the ingest's; a held ask left none
        new = [c for c in claims if c not in study.claims][1 if study.episode else 0 :]
        _expect(len(new) <= 1, "in-flight", f"feedback stored {len(new)} claims")
        done, result = bool(new), {"claim": new[0] if new else ""}
    elif op == "grant":
        found = [c for c in mem.consents(ADMIN, plan["patient"]) if c.consent_id == plan["consent"]]
        _expect(len(found) <= 1, "in-flight", f"grant stored {len(found)} records")
        done = bool(found)
    elif op == "revoke":
        (record,) = [c for c in mem.consents(ADMIN) if c.consent_id == plan["consent"]]
        done = record.revoked_at is not None
    elif op == "shred":
        key = _key(mem, plan["patient"])
        states = _states(mem, "episodic", plan["patient"])
        done = key is not None and key.shredded
        if done:
            _expect(not states, "in-flight", f"shred destroyed the key and left {sorted(states)} rows naming them")
        else:
            _expect("retracted" not in states, "in-flight", "shred retracted the records but kept the data key")
    else:  # rotate, reopen: nothing to find; the checks below read every record with the keys
        done = True
    if done:
        apply(model, op, plan, result)
    return done


def _states(mem: MsmMem, table: str, patient: str) -> set[str]:
    """The states of every row of ``table`` that names ``patient``, retracted ones included (the
    API lists retracted records no more); an erased patient has none."""
    store: Any = mem._store
    mark = "?" if hasattr(store, "directory") else "%s"
    with store._db() as conn:
        rows = conn.execute(f"SELECT DISTINCT state FROM {table} WHERE patient_id = {mark}", (patient,)).fetchall()
    return {str(r[0]) for r in rows}


def _readable(mem: MsmMem, patient: str) -> bool:
    key = _key(mem, patient)
    return key is None or not key.shredded


def check(mem: MsmMem, model: Model, patients: list[str], *, full: bool = True) -> None:
    """Every acknowledged write of ``patients`` exactly once, nothing half-written, the chain
    and checkpoints intact (CheckFailed naming the first check that failed)."""
    store = mem._store
    by_patient: dict[str, list[tuple[str, Study]]] = {}
    for sid, st in model.studies.items():
        by_patient.setdefault(st.patient, []).append((sid, st))
    for patient in patients:
        if patient in model.shredded:
            key = _key(mem, patient)
            _expect(key is not None and key.shredded, "shredded", f"{patient}'s data key is not destroyed")
            try:
                _episodes(mem, patient)
            except MsmMemError:
                pass
            else:
                raise CheckFailed("shredded", f"{patient}'s episodes are still readable")
            for table in ("episodic", "visual", "claims", "semantic"):
                states = _states(mem, table, patient)
                _expect(not states, "shredded", f"{patient}'s {table} rows still name the patient: {sorted(states)}")
            continue
        episodes = _episodes(mem, patient)
        by_study: dict[str, list[Any]] = {}
        for e in episodes:
            by_study.setdefault(e.study_id, []).append(e)
        stray = sorted(set(by_study) - model.planned)
        _expect(not stray, "nothing-else", f"{patient} holds episodes of studies no call made: {stray[:3]}")
        for sid, st in by_patient.get(patient, []):
            active = [e for e in by_study.get(sid, []) if e.state.value == "active"]
            want = (1,) if st.episode else (0, 1) if st.claims else (0,)
            _expect(len(active) in want, "acknowledged", f"study {sid}: {len(active)} active episodes, want {want}")
            claims = _study_claims(mem, patient, sid)
            first = 1 if st.episode else 0  # a written ask or ingest left a claim; a held ask none
            _expect(len(claims) == first + len(st.claims), "acknowledged", f"study {sid}: claims {len(claims)}")
            _expect(all(claims.count(c) == 1 for c in st.claims), "acknowledged", f"study {sid}: a claim is missing")
            for e in active:
                hits = store.search("episodic", e.z, 8, patient)
                _expect(e.episode_id in [h for h, _ in hits], "search", f"episode of {sid} is not found by search")
        visuals = mem.visuals(AGENT, patient)
        sources: dict[str, int] = {}
        for v in visuals:
            sources[v.source_episode_id] = sources.get(v.source_episode_id, 0) + 1
        originals = {e.episode_id for e in episodes}  # a critic's copy has its visual copy too
        _expect(set(sources) == originals, "vectors", f"{patient}: visuals and episodes disagree")
        _expect(set(sources.values()) <= {1}, "vectors", f"{patient}: an episode has several visuals")
        items = {i.item_id: i for i in mem.stm_items(AGENT, patient)}
        for i in items.values():
            _expect((i.payload is None) == (i.state is not StmState.ACTIVE), "stm", f"{i.state.value} item content")
        for item, (p, _) in model.observed.items():
            if p == patient:
                _expect(item in items, "acknowledged", f"observed item {item} is missing")
        for item, (p, episode) in model.consolidated.items():
            if p == patient:
                _expect(item in items, "acknowledged", f"consolidated item {item} is missing")
                if episode is not None:
                    _expect(items[item].state is not StmState.ACTIVE, "stm", f"consolidated item {item} is active")
                    found = [e for e in episodes if e.episode_id == episode]
                    _expect(len(found) == 1, "acknowledged", f"consolidated episode {episode}: {len(found)}")
    consents = {}
    for c in mem.consents(ADMIN):
        _expect(c.consent_id not in consents, "acknowledged", f"consent {c.consent_id} stored twice")
        _expect(c.patient_id not in model.shredded, "shredded", f"consent {c.consent_id} of a shredded patient")
        consents[c.consent_id] = c
    for cid in model.consents:
        _expect(cid in consents, "acknowledged", f"consent {cid} is missing")
        revoked = consents[cid].revoked_at is not None
        _expect(revoked == (cid in model.revoked), "acknowledged", f"consent {cid} revoked: {revoked}")
    _check_vectors(mem)
    keys = default_home() / mem._store.store_id  # the store's key files (outside its directory)
    left = sorted(p.name for p in keys.iterdir() if p.name.endswith(".tmp") or p.name.startswith("."))
    _expect(not left, "keys", f"temporary key files left: {left}")
    result = mem.verify_audit(AUDITOR, full=full)
    _expect(result.ok, "audit", f"{result.reason} (first bad seq {result.first_bad_seq})")


def _check_vectors(mem: MsmMem) -> None:
    """The vectors of each kind are the rows, in order; on the embedded store the FAISS index
    (loaded from its cache file, caught up from the rows) holds one position per row."""
    store: Any = mem._store
    for kind in ("episodic", "visual"):
        rows = store.count(kind)
        if hasattr(store, "directory"):
            ids = [r[0] for r in store._conn.execute(f"SELECT id FROM {kind} ORDER BY pos")]
            _expect(store._vectors._index[kind].ntotal == rows == len(ids), "vectors", f"{kind}: index and rows differ")
            _expect(store._vectors._ids[kind] == ids, "vectors", f"{kind}: a position names another row")
        else:
            with store._db() as conn:
                n = conn.execute(f"SELECT count(*) FROM {kind} WHERE z IS NOT NULL").fetchone()[0]
            _expect(n == rows, "vectors", f"{kind}: {n} vectors for {rows} rows")
