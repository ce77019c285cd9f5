"""Run the service with uvicorn: one process on the embedded store, ``workers`` processes on a
PostgreSQL store (each opens the store itself)."""

from __future__ import annotations

import os
from dataclasses import replace

from ... import InvalidInput, MsmMem
from .app import configure_logging
from .config import ServeConfig

__all__ = ["run"]


def run(
    config: ServeConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    workers: int = 1,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    log_level: str = "info",
) -> None:
    """Serve until interrupted. More than one worker needs a PostgreSQL store: the embedded
    store's caches belong to one process."""
    import uvicorn

    if workers < 1:
        raise InvalidInput("workers must be at least 1")
    if workers > 1 and config.database_url is None and not (config.store / "store.json").exists():
        raise InvalidInput("several workers need a PostgreSQL store (--database-url or a store made with it)")
    if not MsmMem.exists(config.store):
        raise InvalidInput(f"{config.store} is not a memory store (make one with `msm-mem init`)")
    config = replace(config, log_level=log_level)
    os.environ.update(config.to_env())
    configure_logging(log_level)
    uvicorn.run(
        "msm_mem.interfaces.http.app:create_app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        access_log=False,  # the app's own access log leaves patient ids out
        log_level=log_level,
        ssl_certfile=ssl_certfile,
        ssl_keyfile=ssl_keyfile,
        proxy_headers=True,
        forwarded_allow_ips="127.0.0.1",
    )
