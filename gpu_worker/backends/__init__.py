"""Model backends (``INFERQ_BACKEND``): ``mock``, ``openai`` and ``vllm``, behind one small protocol."""

from __future__ import annotations

from typing import Any

from inferq.config.settings import Settings
from inferq.queue.keys import Keys

from .base import Backend, BackendError, EngineLoad, FatalError, RetryableError, check_status

__all__ = ["Backend", "BackendError", "EngineLoad", "FatalError", "RetryableError", "build_backend", "check_status"]


async def build_backend(settings: Settings, redis: Any) -> Backend:
    """The backend ``settings.backend`` names. ``redis`` is only used by the mock (call counting)."""
    if settings.backend == "mock":
        from .mock import MockBackend

        return MockBackend(redis, Keys(settings.queue))
    if settings.backend == "openai":
        from .openai import OpenAIBackend

        return OpenAIBackend(settings.openai_base_url, window=settings.window_limit, api_key=settings.openai_api_key)
    if settings.backend == "vllm":
        from .vllm import VllmBackend  # imports vLLM itself only inside create()

        return await VllmBackend.create(settings)
    raise ValueError(f"unknown backend {settings.backend!r}")
