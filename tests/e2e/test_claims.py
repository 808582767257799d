"""The claim check through ``inferq up`` (moto's S3, real worker processes): a large prompt and its large answer go
through S3 and come back as the job object always looked, inline or, too large for one response, by URL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from inferq.client import Client

from .conftest import Emulator, chat

pytestmark = pytest.mark.timeout(600)

MIB = 1024 * 1024


def test_claim_checked_jobs_run_end_to_end(own_stack: Callable[..., Emulator]) -> None:
    stack = own_stack(INFERQ_MAX_BODY_BYTES=str(4 * MIB))
    prompt = "claim " * (2 * MIB // 6)
    done = stack.finish(stack.submit(chat(prompt))["id"], timeout=180)
    assert done["status"] == "succeeded", done
    assert done["result"]["body"]["choices"][0]["message"]["content"] == prompt

    larger = "check " * (3 * MIB // 6)  # its answer is more than one response carries: given by URL
    job_id = stack.submit(chat(larger))["id"]
    done = stack.finish(job_id, timeout=180)
    assert done["status"] == "succeeded", done
    assert set(done["result"]) == {"status_code", "body_url", "body_bytes"} and done["result"]["body_bytes"] > 3 * MIB
    key = (stack.data_dir / "dev-api-key").read_text().strip()
    with Client(stack.url, key) as client:
        assert client.get(job_id).text == larger
