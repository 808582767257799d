"""GET /v1/jobs/{id}/stream: the deltas after a cursor, a wait that answers on the first new output or the end, the rest
from the result once the job ends, and tenant isolation (another tenant's job is 404)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from inferq.queue import output
from inferq.queue.jobs import JobStatus
from inferq.queue.protocol import Delivery, Queue
from tests.support.blocked import blocked_in
from tests.support.waiting import eventually_async

from .support import CHAT, A, B
from .test_submit import assert_envelope

WOKEN_WITHIN_S = 10.0
"""A guard, not a measurement: half the 20 s deadline of the waits that must answer before it."""


def chat_result(text: str) -> dict[str, Any]:
    return {"status_code": 200, "body": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                                         "model": "m", "choices": [{"index": 0, "message": {
                                             "role": "assistant", "content": text}, "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}}


class Worker:
    """What a worker does with one job, step by step: take it, write output, end it."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.delivery: Delivery | None = None
        self.position = 0

    async def take(self) -> Delivery:
        [self.delivery], _ = await self.queue.read("test-worker", 1)
        return self.delivery

    async def say(self, text: str) -> None:
        d = self.delivery
        assert d is not None
        appended = await output.append(self.queue, d.job.id, d.entry_id, d.lease, self.position, text, 1, ttl_s=600)
        assert appended.code == 0
        self.position = appended.kept

    async def end(self, text: str) -> None:
        assert self.delivery is not None
        await self.queue.finish(self.delivery, JobStatus.SUCCEEDED, result=chat_result(text))
        await output.close(self.queue, [self.delivery.job.id])


async def submit(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/jobs", json=CHAT, headers=A)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def _more(count: Any, than: int) -> bool:
    return bool(await count > than)


def text(page: dict[str, Any]) -> str:
    return "".join(d["delta"] for d in page["data"])


async def test_a_job_is_read_in_pieces_while_it_runs_and_whole_once_it_ends(client: httpx.AsyncClient,
                                                                            queue: Queue) -> None:
    job_id = await submit(client)
    first = (await client.get(f"/v1/jobs/{job_id}/stream", headers=A)).json()
    assert first == {"object": "list", "data": [], "cursor": first["cursor"], "done": False, "status": "queued"}
    worker = Worker(queue)
    await worker.take()
    await worker.say("Hello")
    page = (await client.get(f"/v1/jobs/{job_id}/stream", params={"after": first["cursor"]}, headers=A)).json()
    assert page["data"] == [{"index": 0, "delta": "Hello"}] and page["status"] == "running" and not page["done"]
    before = await blocked_in(queue.redis, "xread")
    waiting = asyncio.create_task(client.get(f"/v1/jobs/{job_id}/stream",
                                             params={"after": page["cursor"], "wait": 20}, headers=A))
    await eventually_async(lambda: _more(blocked_in(queue.redis, "xread"), before), what="the stream's read blocked")
    assert not waiting.done()  # nothing new yet: the wait holds the request
    await worker.say(" wor")
    more = (await asyncio.wait_for(waiting, WOKEN_WITHIN_S)).json()
    assert more["data"] == [{"index": 1, "delta": " wor"}]
    ending = asyncio.create_task(client.get(f"/v1/jobs/{job_id}/stream",
                                            params={"after": more["cursor"], "wait": 20}, headers=A))
    await worker.end("Hello world")  # "ld" was never written as a delta: it comes from the result
    last = (await asyncio.wait_for(ending, WOKEN_WITHIN_S)).json()
    assert last["data"] == [{"index": 2, "delta": "ld"}] and last["done"] and last["status"] == "succeeded"
    assert text(page) + text(more) + text(last) == "Hello world"
    whole = (await client.get(f"/v1/jobs/{job_id}/stream", headers=A)).json()
    assert whole["data"] == [{"index": 0, "delta": "Hello world"}] and whole["done"]
    after_end = (await client.get(f"/v1/jobs/{job_id}/stream", params={"after": last["cursor"]}, headers=A)).json()
    assert after_end["data"] == [] and after_end["done"]


async def test_a_reader_marks_a_job_watched_so_its_worker_streams_it(client: httpx.AsyncClient,
                                                                     queue: Queue) -> None:
    job_id = await submit(client)
    assert not (await queue.get(job_id)).watched  # type: ignore[union-attr]
    await client.get(f"/v1/jobs/{job_id}/stream", headers=A)
    assert (await queue.get(job_id)).watched  # type: ignore[union-attr]


async def test_another_tenants_job_and_unknown_ids_are_404(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    assert_envelope(await client.get(f"/v1/jobs/{job_id}/stream", headers=B), 404, "not_found")
    for bad in ("job_aaaaaaaaaaaaaaaaaaaaaaaaaa", "nope"):
        assert_envelope(await client.get(f"/v1/jobs/{bad}/stream", headers=A), 404, "not_found")
    assert_envelope(await client.get(f"/v1/jobs/{job_id}/stream"), 401, "unauthorized")


async def test_a_bad_cursor_or_wait_is_422(client: httpx.AsyncClient) -> None:
    job_id = await submit(client)
    assert_envelope(await client.get(f"/v1/jobs/{job_id}/stream", params={"after": "x"}, headers=A), 422,
                    "invalid_cursor")
    assert_envelope(await client.get(f"/v1/jobs/{job_id}/stream", params={"wait": 21}, headers=A), 422,
                    "invalid_request")


async def test_a_job_that_ends_without_output_ends_the_wait(client: httpx.AsyncClient, queue: Queue) -> None:
    job_id = await submit(client)
    waiting = asyncio.create_task(client.get(f"/v1/jobs/{job_id}/stream", params={"wait": 20}, headers=A))
    await asyncio.sleep(0.2)
    await client.post(f"/v1/jobs/{job_id}/cancel", headers=A)
    # nobody closes a stream for a job cancelled while queued: the reader's next look at the job ends the wait
    page = (await asyncio.wait_for(waiting, WOKEN_WITHIN_S)).json()
    assert page["done"] and page["status"] == "cancelled" and page["data"] == []
