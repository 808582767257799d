"""Job ids, key names, the job object, backoff and the script loader: the pieces every process shares."""

from __future__ import annotations

import base64
import json
import random

import pytest

from inferq.queue import jobs
from inferq.queue.jobs import Job, JobRequest, JobStatus, canonical_json, new_job_id, request_digest
from inferq.queue.keys import Keys
from inferq.redis.scripting import SCRIPTS_DIR, _expand, load
from inferq.retry import backoff_ms


def test_job_ids_carry_128_random_bits() -> None:
    ids = {new_job_id() for _ in range(2000)}
    assert len(ids) == 2000
    sample = next(iter(ids))
    assert sample.startswith("job_")
    raw = base64.b32decode(sample[4:].upper() + "======")
    assert len(raw) * 8 >= 122


def test_a_job_id_is_its_bytes_in_lower_case_base32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids made ten bits at a time are the characters ``base64.b32encode`` gives the same bytes."""
    for _ in range(2000):
        raw = random.randbytes(16)
        monkeypatch.setattr(jobs.secrets, "token_bytes", lambda n, raw=raw: raw)
        assert new_job_id() == "job_" + base64.b32encode(raw).decode().rstrip("=").lower()
    for raw in (bytes(16), b"\xff" * 16):
        monkeypatch.setattr(jobs.secrets, "token_bytes", lambda n, raw=raw: raw)
        assert new_job_id() == "job_" + base64.b32encode(raw).decode().rstrip("=").lower()


def test_canonical_json_is_json_dumps_sorted_and_compact() -> None:
    value = {"b": [1, 2.5, None, True], "a": {"z": "é", "y": "\u2028"}, "c": ""}
    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_key_names_are_exactly_the_contract() -> None:
    k = Keys("default")
    assert k.stream == "inferq:{default}:stream"
    assert k.job("job_x") == "inferq:{default}:job:job_x"
    assert k.idem("acme", "d1") == "inferq:{default}:idem:acme:d1"
    names = (k.dlq, k.delayed, k.events, k.stats, k.workers, k.scale)
    assert names == tuple(f"inferq:{{default}}:{n}" for n in ("dlq", "delayed", "events", "stats", "workers", "scale"))
    assert k.mock_calls == "inferq:{default}:mock:calls"


def test_request_digest_ignores_key_order_but_not_content() -> None:
    a = JobRequest(body={"model": "m", "max_tokens": 3})
    b = JobRequest(body={"max_tokens": 3, "model": "m"})
    c = JobRequest(body={"model": "m", "max_tokens": 4})
    assert a.digest() == b.digest() != c.digest()
    assert request_digest({"x": 1}) != request_digest({"x": "1"})


def test_status_knows_which_states_are_terminal() -> None:
    assert {s.value for s in JobStatus if s.terminal} == {"succeeded", "failed", "cancelled", "expired"}
    assert JobStatus("queued") == "queued"


def test_job_record_round_trips_to_the_api_object() -> None:
    job = Job.from_hash({"id": "job_a", "tenant": "t", "status": "succeeded", "url": "/v1/completions",
                         "body": '{"prompt":"x"}', "attempts": "2", "deliveries": "1", "created_at": "1764400000123",
                         "started_at": "1764400000200", "finished_at": "1764400001000",
                         "result": '{"status_code":200,"body":{}}', "metadata": '{"k":"v"}', "dead_lettered": "0"})
    api = job.to_api()
    assert api["created_at"] == 1764400000.123 and api["attempts"] == 2 and api["status"] == "succeeded"
    assert api["result"] == {"status_code": 200, "body": {}} and api["error"] is None


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        cap = min(60_000, 1000 * 2 ** (attempt - 1))
        samples = [backoff_ms(attempt, 1000, 60_000, rng) for _ in range(200)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > cap * 0.8 and min(samples) < cap * 0.2  # spread over the whole window
    assert backoff_ms(3, 0, 1000) == 0


def test_includes_are_expanded_once_and_headers_declare_keys() -> None:
    start = load("start").source
    assert "--- @include" not in start and start.count("local function terminate(") == 1
    for path in SCRIPTS_DIR.glob("*.lua"):
        text = path.read_text()
        assert "local rcall = redis.call" in text, path.name
        assert "Returns" in text.split("]]", 1)[0], path.name
        assert "..':'" not in _expand(text)  # keys come in through KEYS, never built in Lua
