"""``python -m gpu_worker``: one worker process, configured by the ``INFERQ_*`` environment.

SIGTERM (ECS stopping the task, the emulator scaling in) or SIGINT: stop pulling, drain for ``INFERQ_DRAIN_S``,
release the rest, exit 0. A second signal skips the rest of the drain. A bad setting exits 2 naming the variable.
With a model registry (``INFERQ_MODELS``) it serves the model ``INFERQ_MODEL`` names, with that entry's settings.
A task of the worker that died (a fault that is not Redis's to wait out, a bug) stops it: it releases its jobs,
deregisters and exits 1, so ECS replaces it.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from inferq.queue import Queue
from inferq.registry import Model, served_model
from inferq.settings import Settings, SettingsError, load_or_exit

from . import logs
from .backends import build_backend
from .metrics import WorkerMetrics
from .protection import TaskProtection
from .served import ServedModel
from .worker import Worker, default_worker_id

log = logging.getLogger("gpu_worker")


async def serve(settings: Settings, model: Model | None = None) -> int:
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
    worker = Worker(
        settings, queue, backend, metrics=metrics, protection=TaskProtection.from_environment(settings)
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    gc.freeze()  # what start-up made lives as long as the process: the cyclic collector stops walking it per cycle
    try:
        await worker.run()
    finally:
        await backend.aclose()
        await queue.close()
    return 1 if worker.failure else 0


def main() -> int:
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
        return asyncio.run(serve(settings, model))
    return uvloop.run(serve(settings, model))


if __name__ == "__main__":
    sys.exit(main())
