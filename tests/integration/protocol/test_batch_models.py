"""Batches under a model registry (``inferq.batches.routing``), against real Valkey and moto's S3 in process: each line
goes to its own model's queue in the ``low`` lane, an unknown model fails that line alone with ``model_not_found``
in the error file, a full queue of one model holds the chunk back at that line, and cancelling finds the lines'
jobs in every queue. This test acts as each model's worker."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from functions.storage import FileStore
from inferq.batches.driver import QUEUE_SHARE, BatchDriver
from inferq.batches.records import Batches, BatchStatus
from inferq.batches.routing import UNROUTED
from inferq.config.registry import Registry
from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings
from inferq.queue.jobs import Priority
from inferq.queue.protocol import Queue

from .test_batch_driver import TENANT, new_batch, work_off
from .test_batch_driver import store as store  # the fixture


def line(n: int, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": f"q{n}"}]}
    if model is not None:
        body["model"] = model
    return {"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


@pytest.fixture
def registry(settings: Settings, tmp_path: Path) -> Iterator[Registry]:
    q = settings.queue
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"default": "chat", "models": [
        {"name": "chat", "aliases": ["gpt-4o-mini"], "queue": f"{q}-chat"},
        {"name": "embed", "aliases": ["text-embedding-3-small"], "queue": f"{q}-embed", "max_queue_depth": 5},
    ]}))
    found = load_registry(settings.replace(models=str(path)))
    assert found is not None
    yield found


@pytest.fixture
async def fleets(registry: Registry) -> AsyncIterator[dict[str, Queue]]:
    chat = Queue.connect(registry.models[0].settings)
    queues = {"chat": chat, "embed": Queue(chat.redis, registry.models[1].settings)}
    for queue in queues.values():
        await queue.ensure_groups()
    yield queues
    await chat.close()


def output(store: FileStore, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id
    return [json.loads(x) for x in b"".join(store.chunks(TENANT, file_id)).splitlines()]


async def test_each_line_runs_on_its_own_models_queue_and_an_unknown_model_fails_that_line_alone(
    fleets: dict[str, Queue], registry: Registry, store: FileStore
) -> None:
    chat, embed = fleets["chat"], fleets["embed"]
    models = ["chat", "text-embedding-3-small", None, "gpt-5", "embed", "gpt-4o-mini"]
    batch_id = await new_batch(chat, store, jsonl([line(i, m) for i, m in enumerate(models)]))
    driver = BatchDriver(chat, store, chat.settings, registry)
    await driver.run_once()  # validating -> in_progress (an unknown model is no validation error)
    await driver.run_once()  # the lines become jobs

    lines = await chat.redis.hgetall(chat.keys.batch_lines(batch_id))
    assert lines["3"] == UNROUTED
    assert {lines[n].rsplit("_", 1)[1] for n in ("0", "2", "5")} == {chat.settings.queue}
    assert {lines[n].rsplit("_", 1)[1] for n in ("1", "4")} == {embed.settings.queue}
    assert (await embed.get(lines["1"])).priority is Priority.LOW  # type: ignore[union-attr]
    assert await work_off(chat) == 3 and await work_off(embed) == 2  # each model's worker ran its own lines

    await driver.run_once()  # all ended -> finalizing -> completed
    batch = await Batches(chat).get(batch_id, TENANT)
    assert batch is not None and batch.status is BatchStatus.COMPLETED
    assert (batch.total, batch.completed, batch.failed) == (6, 5, 1)
    good = output(store, batch.output_file_id)
    assert [x["custom_id"] for x in good] == ["c0", "c1", "c2", "c4", "c5"]
    assert good[1]["response"]["body"] == {"echo": "q1"}
    [bad] = output(store, batch.error_file_id)
    assert bad["custom_id"] == "c3" and bad["response"] is None and bad["id"].startswith("batch_req_")
    assert bad["error"]["code"] == "model_not_found" and "'gpt-5'" in bad["error"]["message"]


async def test_a_full_queue_of_one_model_holds_the_chunk_back_at_its_first_line(
    fleets: dict[str, Queue], registry: Registry, store: FileStore
) -> None:
    chat, embed = fleets["chat"], fleets["embed"]  # embed takes 5 unfinished jobs, batch lines half of them
    models = ["embed"] * 8 + ["chat"] * 4
    batch_id = await new_batch(chat, store, jsonl([line(i, m) for i, m in enumerate(models)]))
    driver = BatchDriver(chat, store, chat.settings, registry)
    await driver.run_once()
    await driver.run_once()
    batch = await Batches(chat).get(batch_id)
    assert batch is not None and batch.next_line == int(5 * QUEUE_SHARE), (
        "lines go in file order: the chat lines wait behind embed's")
    while batch.status is not BatchStatus.COMPLETED:
        await work_off(embed)
        await work_off(chat)
        await driver.run_once()
        batch = await Batches(chat).get(batch_id)
        assert batch is not None
    assert (batch.completed, batch.failed) == (12, 0)
    assert (await embed.stats())["enqueued"] == 8 and (await chat.stats())["enqueued"] == 4


async def test_cancelling_a_batch_cancels_its_jobs_in_every_models_queue(
    fleets: dict[str, Queue], registry: Registry, store: FileStore
) -> None:
    chat, embed = fleets["chat"], fleets["embed"]
    models = ["chat", "embed", "nobody", "embed"]
    batch_id = await new_batch(chat, store, jsonl([line(i, m) for i, m in enumerate(models)]))
    driver = BatchDriver(chat, store, chat.settings, registry)
    await driver.run_once()
    await driver.run_once()
    await Batches(chat).cancel(TENANT, batch_id)
    await driver.run_once()  # cancel the queued jobs -> finalizing -> cancelled
    batch = await Batches(chat).get(batch_id)
    assert batch is not None and batch.status is BatchStatus.CANCELLED
    assert (batch.completed, batch.failed) == (0, 4)
    codes = {x["custom_id"]: x["error"]["code"] for x in output(store, batch.error_file_id)}
    assert codes == {"c0": "batch_cancelled", "c1": "batch_cancelled", "c2": "model_not_found",
                     "c3": "batch_cancelled"}
    assert await work_off(chat) == 0 and await work_off(embed) == 0, "no line's job is left to run"
