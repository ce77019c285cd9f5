"""Run the service with uvicorn: ``workers`` processes, each opening the store itself (the
embedded store follows what other processes commit; PostgreSQL serialises writers itself).

Numeric libraries get one thread per process: a request's image work is small, concurrency
comes from the requests and the workers, and a BLAS pool of its own in each worker only
makes the workers wait for each other's threads on a busy machine. ``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set beforehand are kept."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from ... import InvalidInput, MsmMem
from ..backbone import probe
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
    """Serve until interrupted, with ``workers`` processes on either store. The backbone is
    built and its model server probed first: a bad option or an unreachable server stops the
    start with the error."""
    import uvicorn

    if workers < 1:
        raise InvalidInput("workers must be at least 1")
    if not MsmMem.exists(config.store):
        raise InvalidInput(f"{config.store} is not a memory store (make one with `msm-mem init`)")
    config = replace(config, log_level=log_level)
    configure_logging(log_level)
    answered = probe(config.backbone.build())
    if answered:
        logging.getLogger(__name__).info("backbone %s: its model server answers (%s)", config.backbone.name, answered)
    os.environ.update(config.to_env())
    _one_numeric_thread()
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


_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_numeric_thread() -> None:
    """One BLAS/OpenMP thread in this process and in the workers it starts (see the module)."""
    chosen = [name for name in _THREAD_VARIABLES if name in os.environ]
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, "1")  # worker processes read these when they import numpy
    if chosen:
        return
    try:  # this process imported numpy already: limit its pool directly
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(1)
