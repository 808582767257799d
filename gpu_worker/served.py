"""The model name a registry worker sends its model server (``backend.served_model``, docs/models.md).

Clients may name a model by an alias (``gpt-4o-mini`` for ``chat``); the model server knows it by one name only
(vLLM's ``--served-model-name``), so the worker puts that name in ``body.model`` before each call. Everything else
about the backend (its name, its load signals, closing it) is the wrapped backend's own.

A job naming a model this fleet does not serve (a line of a batch, which runs on the default model's queue, naming
another model) fails at once rather than running on the wrong model.
"""

from __future__ import annotations

from typing import Any

from inferq.queue.jobs import Job

from .backends.base import Backend, FatalError, Output


class ServedModel:
    def __init__(self, backend: Backend, served_model: str, names: frozenset[str] = frozenset()) -> None:
        self.backend = backend
        self.served_model = served_model
        self.names = names | {served_model}
        """What a job may call this model: its name, aliases and served name (or nothing)."""
        self.name = backend.name

    async def complete(
        self, url: str, body: dict[str, Any], *, timeout_s: float, traceparent: str, job: Job,
        output: Output | None = None,
    ) -> tuple[int, Any]:
        requested = body.get("model")
        if requested is not None and requested not in self.names:
            raise FatalError(f"the model {str(requested)[:128]!r} is not served by this fleet ({self.served_model})",
                             status_code=404)
        if requested != self.served_model:
            body = {**body, "model": self.served_model}
        return await self.backend.complete(url, body, timeout_s=timeout_s, traceparent=traceparent, job=job,
                                           output=output)

    async def aclose(self) -> None:
        await self.backend.aclose()

    def __getattr__(self, attribute: str) -> Any:  # ``load`` (the adaptive window's signals), when it has one
        return getattr(self.backend, attribute)
