"""A batch whose lines name two models, through the official ``openai`` client against ``inferq up`` running the
repository's ``models.example.yaml`` (two fleets, mock backends): each line runs on its own model's fleet, and a
line naming an unknown model fails alone with ``model_not_found`` in the error file."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest

from .conftest import Emulator
from .test_batches import BATCH_ENV, client_for, finish, jsonl, lines_of, request_line

pytestmark = pytest.mark.timeout(600)


def line_for(n: int, model: str) -> dict[str, object]:
    line = request_line(n)
    line["body"]["model"] = model
    return line


def test_a_two_model_batch_runs_each_line_on_its_own_models_fleet(own_stack: Callable[..., Emulator]) -> None:
    stack = own_stack(INFERQ_MODELS="models.example.yaml", **BATCH_ENV)
    client = client_for(stack)
    names = ["chat", "gpt-4o-mini", "embed", "text-embedding-3-small"]  # names and aliases of both models
    lines = [line_for(i, names[i % 4]) for i in range(200)] + [line_for(200, "gpt-5")]
    uploaded = client.files.create(file=("two.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    batch = finish(client, batch.id, timeout=300)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (201, 200, 1)

    output = {line["custom_id"]: line for line in lines_of(client, batch.output_file_id)}
    assert sorted(output) == sorted(f"req-{i}" for i in range(200))
    for i in range(200):
        response = output[f"req-{i}"]["response"]
        model = "chat" if i % 4 < 2 else "embed"
        # the job lived in that model's queue, and the worker that answered sent that model's served name: a
        # worker of the other fleet refuses a model it does not serve
        assert response["request_id"].endswith(f"_{model}"), response
        assert response["body"]["model"] == model and response["body"]["choices"][0]["message"]["content"]
    [error] = lines_of(client, batch.error_file_id)
    assert error["custom_id"] == "req-200" and error["response"] is None
    assert error["error"]["code"] == "model_not_found" and "gpt-5" in error["error"]["message"]
