"""OpenAI's streamed answer (``stream: true``), made from a job's output: Server-Sent Events of
``chat.completion.chunk`` (or ``text_completion``) chunks, ``data: {...}`` each, then ``data: [DONE]``.

The deltas of the first choice come from the job's output stream as the worker writes them
(:class:`inferq.queue.output.OutputReader`); the end comes from the result: the rest of the first choice's text
(the reader's), the other choices whole, tool calls, each choice's ``finish_reason``, and the usage chunk when the
request asked for it (``stream_options.include_usage``). A job that fails once the answer has begun ends it with
an ``error`` event, which the official client raises as an ``APIError``.
"""

from __future__ import annotations

from typing import Any

from inferq import fastjson
from inferq.queue.jobs import Job, JobStatus

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
"""A comment line: keeps proxies and clients from timing out a quiet stream; clients ignore it."""


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + fastjson.dumps(payload) + b"\n\n"


class Chunks:
    """The chunks of one streamed answer."""

    def __init__(self, url: str, job_id: str, created: float, model: Any) -> None:
        self.chat = url == "/v1/chat/completions"
        self.head = {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{job_id}",
                     "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": int(created), "model": model if isinstance(model, str) else "unknown"}

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> bytes:
        return event({**self.head, "choices": choices, **more})

    def _choice(self, index: int, text: str | None = None, *, role: bool = False, finish: Any = None,
                **delta: Any) -> dict[str, Any]:
        if self.chat:
            body: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                body["content"] = text
            body.update(delta)
            return {"index": index, "delta": body, "logprobs": None, "finish_reason": finish}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}

    def start(self) -> bytes:
        """The first chunk: the assistant's role (chat), no text yet."""
        return self._chunk([self._choice(0, "", role=True)]) if self.chat else b""

    def text(self, delta: str) -> bytes:
        return self._chunk([self._choice(0, delta)])

    def end(self, job: Job, body: Any, include_usage: bool) -> bytes:
        """What follows the first choice's text once the job has succeeded: the other choices, tool calls, each
        choice's ``finish_reason``, the usage chunk (asked for), ``[DONE]``."""
        out = []
        choices = body.get("choices") if isinstance(body, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index") or 0)
            found = choice.get("message")
            message: dict[str, Any] = found if isinstance(found, dict) else {}
            if index != 0:
                text = message.get("content") if self.chat else choice.get("text")
                out.append(self._chunk([self._choice(index, text if isinstance(text, str) else "",
                                                     role=self.chat)]))
            calls = message.get("tool_calls") if self.chat else None
            if isinstance(calls, list) and calls:
                indexed = [{"index": i, **call} for i, call in enumerate(calls) if isinstance(call, dict)]
                out.append(self._chunk([self._choice(index, None, tool_calls=indexed)]))
            out.append(self._chunk([self._choice(index, None if self.chat else "",
                                                 finish=choice.get("finish_reason"))]))
        if include_usage:
            usage = body.get("usage") if isinstance(body, dict) else None
            out.append(self._chunk([], usage=usage))
        return b"".join(out) + DONE

    def failed(self, job: Job) -> bytes:
        """A job that ended otherwise once the answer had begun: an ``error`` event, then ``[DONE]``."""
        return event(job_error(job)) + DONE


def job_error(job: Job) -> dict[str, Any]:
    """A job's error as the error envelope (what the official client reads as OpenAI's error: ``type`` and
    ``message``), with the job's id beside it."""
    error = job.error or {}
    type_ = str(error.get("type") or job.status.value)
    if job.status is JobStatus.CANCELLED:
        type_ = "cancelled"
    message = str(error.get("message") or f"the job ended {job.status.value}")
    return {"error": {"type": type_, "message": message}, "job_id": job.id}
