"""The audit tier: an append-only, hash-chained log of every read, write, transition and consent
decision, signed checkpoints of its head kept outside the database, and its export as FHIR.

One module per concept; each imports only modules above it in this list::

    jcs                RFC 8785 canonical JSON and the strict JSON reader (bytes that are hashed or signed)
    event              an audit event (AuditSpec, AuditEvent) and its canonical payload, defined once
    scan               the canonical payload as one compiled pattern (the fast path of full verification)
    verify             the hash-only and full walks over stored rows, and VerifyResult
    parallel           full verification with worker processes that hold no key
    chain              ChainBuilder: the stored rows of new events, linked to the head
    checkpoint         a signed checkpoint of the chain head, the JSONL checkpoint log, checks against it
    checkpoint_signer  the Ed25519 key that signs checkpoints
    checkpoint_files   where checkpoints live: the log, the signed head file, the witness
    coverage           whether the stored chain is the one the signed checkpoints describe
    row_check          whether the governed rows are the ones the signed row digests describe
    chains             the verification of a store of several chains (one per patient lane)
    log                AuditLog: pseudonyms, appending with a signed head at every commit, verification
    group_commit       the audit-only events of concurrent reads in one transaction
    fhir_resource      one event as a FHIR R5 AuditEvent resource (IHE BALP)
    fhir               the chain exported as FHIR NDJSON, and re-verified from the file alone

Nothing is re-exported here: import from the module that defines a name.
"""
