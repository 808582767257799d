"""``python -m gpu_worker``: one worker process, configured by the ``INFERQ_*`` environment.

SIGTERM (ECS stopping the task, draining a Spot instance, the emulator scaling in) or SIGINT: stop pulling, hand
back at once what will not end within ``INFERQ_DRAIN_S`` (its output kept, :mod:`gpu_worker.interruption`), drain
the rest for ``INFERQ_DRAIN_S``, release what is left, exit 0. A second signal skips the rest of the drain. A bad
setting exits 2 naming the variable. With a model registry (``INFERQ_MODELS``) it serves the model ``INFERQ_MODEL``
names, with that entry's settings. A task of the worker that died (a fault that is not Redis's to wait out, a bug)
stops it: it releases its jobs, deregisters and exits 1, so ECS replaces it.

``--burst`` (as arq's): drain the queue, then exit 0: the worker works as usual until nothing is queued, delayed,
pending or held, then stops (docs/operations.md, "Drain a queue and exit").

Boot: with the ``openai`` backend the worker may start beside its model server and import, connect to Redis and
open its clients while the server loads the model; it takes its first job once the server's ``/health`` answers
(anything but a 5xx), polled every 0.2 s (no health-check interval in the way). Its heartbeat, which the scaler
counts as a live worker, starts only then: the readiness signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
import time

import httpx

from inferq.config.registry import Model, served_model
from inferq.config.settings import Settings, SettingsError, load_or_exit
from inferq.queue.protocol import Queue

from . import logs
from .backends import build_backend
from .metrics import WorkerMetrics
from .protection import TaskProtection
from .served import ServedModel
from .worker import Worker, default_worker_id

log = logging.getLogger("gpu_worker")


async def serve(settings: Settings, model: Model | None = None, *, burst: bool = False) -> int:
    queue = Queue.connect(settings)
    try:
        backend = await build_backend(settings, queue.redis)
        if model is not None:  # a registry model: the model server knows it by its served name, not an alias
            backend = ServedModel(backend, model.served_model, frozenset({model.name, *model.aliases}))
    except (RuntimeError, SettingsError) as exc:
        log.error("cannot start the %s backend: %s", settings.backend, exc)
        await queue.close()
        return 1
    metrics = WorkerMetrics(settings.queue, settings.window_limit)
    metrics.serve(settings.metrics_port)
    gpus = int(model.deploy.get("gpus", 1)) if model is not None else 1  # a registry model's deploy.gpus
    worker = Worker(
        settings, queue, backend, metrics=metrics, protection=TaskProtection.from_environment(settings), gpus=gpus,
        burst=burst,
        webhooks=settings.worker_webhooks,  # off in the GPU task: no route to the internet (the scaler delivers)
    )
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()

    def stop() -> None:
        stopped.set()
        worker.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    if settings.backend == "openai":
        await _model_server_ready(settings, queue, stopped)
    gc.freeze()  # what start-up made lives as long as the process: the cyclic collector stops walking it per cycle
    try:
        await worker.run()
    finally:
        await backend.aclose()
        await queue.close()
    return 1 if worker.failure else 0


async def _model_server_ready(settings: Settings, queue: Queue, stopped: asyncio.Event) -> None:
    """Wait for the model server's ``/health`` (a stop request ends the wait), connecting to Redis meanwhile."""
    began = time.monotonic()
    connect = asyncio.create_task(queue.redis.ping())
    async with httpx.AsyncClient(base_url=settings.openai_base_url.rstrip("/"), timeout=2.0) as client:
        while not stopped.is_set():
            with contextlib.suppress(httpx.HTTPError):
                # up: 200 from vLLM; a server with no /health (404) is up too, only a 5xx says still loading
                if (await client.get("/health")).status_code < 500:
                    break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopped.wait(), 0.2)
    with contextlib.suppress(Exception):  # Redis's faults are the worker's to wait out, in its own loops
        await connect
    log.info("model server ready after %.1f s", time.monotonic() - began)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_worker",
        description="One inferq worker, configured by the INFERQ_* environment (docs/configuration.md).")
    parser.add_argument("--burst", action="store_true",
                        help="drain the queue, then exit 0: stop once nothing is queued, delayed, pending or held")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    burst = arguments(argv).burst
    settings = load_or_exit()
    try:
        model = served_model(settings)  # with a registry: the entry INFERQ_MODEL names
    except SettingsError as exc:
        print(f"inferq: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if model is not None:
        settings = model.settings
    if not settings.worker_id:
        settings = settings.replace(worker_id=default_worker_id())
    logs.configure(settings.log_level, settings.worker_id)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(serve(settings, model, burst=burst))
    return uvloop.run(serve(settings, model, burst=burst))


if __name__ == "__main__":
    sys.exit(main())
