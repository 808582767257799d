"""The gateway reads a job without its body (``HMGET`` of ``RECORD_FIELDS_BUT_BODY``): every other field
``Job.from_hash`` reads must be in that list, or a job read by the gateway would silently lack it."""

from __future__ import annotations

from typing import Any

from inferq.queue.jobs import RECORD_FIELDS_BUT_BODY, Job


class Recording(dict[str, str]):
    """A record that notes every field read from it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def test_every_field_the_job_object_reads_but_the_body_is_in_the_gateways_read() -> None:
    full = {"id": "job_1", "tenant": "t", "status": "succeeded", "url": "/v1/chat/completions", "body": "{}",
            "attempts": "2", "deliveries": "3", "created_at": "1", "started_at": "2", "finished_at": "3",
            "result": "{}", "error": "{}", "dead_lettered": "1", "cancel": "1", "metadata": "{}", "timeout_s": "5",
            "ttl_s": "6", "webhook_url": "https://example.com/h", "trace": "00-x", "entry": "1-0", "lane": "high",
            "continuation": "0"}
    record = Recording(full)
    Job.from_hash(record)
    assert record.read - {"body"} <= set(RECORD_FIELDS_BUT_BODY), record.read - set(RECORD_FIELDS_BUT_BODY)
    assert "body" not in RECORD_FIELDS_BUT_BODY
    assert len(set(RECORD_FIELDS_BUT_BODY)) == len(RECORD_FIELDS_BUT_BODY)
