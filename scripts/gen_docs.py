"""Writes the parts of ``docs/`` that the code defines, so they cannot drift from it:

- ``docs/openapi.json``: the OpenAPI document of the gateway app (``functions.gateway.api.create_app``), exactly
  what ``GET /openapi.json`` serves;
- ``docs/configuration.md``: every ``INFERQ_*`` variable, from the fields of ``inferq.config.settings.Settings`` (name,
  default, what the parser accepts) and the one-line meanings in :data:`SETTING_DOCS` below.

    .venv/bin/python scripts/gen_docs.py            # rewrite both files
    .venv/bin/python scripts/gen_docs.py --check    # exit 1 when either is stale (tests/unit/test_docs.py)

A new field of ``Settings`` needs a meaning: in :data:`SETTING_DOCS`, or as ``doc`` in the field's metadata
(which wins). Without one the generator stops and names the field.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
OPENAPI_PATH = DOCS / "openapi.json"
CONFIGURATION_PATH = DOCS / "configuration.md"
COMMAND = ".venv/bin/python scripts/gen_docs.py"

SETTING_DOCS: dict[str, str] = {
    # Redis
    "redis_url": "The Redis/Valkey server. `rediss://` for TLS; `?cluster=true` selects cluster mode (ElastiCache "
    "Serverless). Carries no credentials in AWS: see `INFERQ_REDIS_AUTH_SECRET`.",
    "redis_timeout_s": "Socket timeout of every Redis call, in seconds. The gateway also bounds each call by this "
    "plus 1 s of wall clock, so a frozen server is a prompt 503, never a hang (G8).",
    "redis_auth_secret": "Secrets Manager id of the cache's AUTH token (JSON `{\"username\", \"token\"}` or a bare "
    "string), read when the process first connects.",
    "redis_auth": "The cache credentials themselves: the JSON of an auth secret (`{\"username\", \"token\"}`) or "
    "a bare token. The stack has ECS inject it into the worker container alone, so the task role (which the vLLM "
    "container shares) needs no access to the secret; fixed for the process's life (a rotation reaches tasks "
    "started after it). `INFERQ_REDIS_AUTH_SECRET`, where set, is used instead.",
    "redis_max_connections": "Connection pool size per process. Under Lambda a long-poll waiter "
    "(`GET /v1/jobs/{id}?wait=`) holds one connection while it waits; a long-lived gateway shares one per queue "
    "among all its waiters.",
    "redis_wait_replicas": "After a write that answers a client (a 202, a terminal state), `WAIT` for this many "
    "replicas to acknowledge it, so a primary failover cannot lose it. 0: do not wait.",
    "queue": "The queue's name: the `{Q}` hash tag of every Redis key (`inferq:{Q}:...`).",
    # API keys
    "api_keys": "Development API keys, in plain text. Production keys live in Secrets Manager "
    "(`INFERQ_API_KEYS_SECRET`). The gateway refuses to start with neither; `inferq up` creates a development key.",
    "api_keys_secret": "Secrets Manager id of the API keys: JSON `{\"<sha256 hex of key>\": \"<tenant>\"}`.",
    "api_keys_cache_s": "How long the gateway caches what it read from `INFERQ_API_KEYS_SECRET`: a key added or "
    "revoked there takes effect within this time.",
    # jobs and the protocol
    "fair_share": "Fair share inside each lane (G10, docs/guarantees.md): tenants with jobs waiting are served in "
    "turn, in proportion to their weights (`INFERQ_TENANT_WEIGHTS`), counted in work (estimated tokens). "
    "`false`: first come, first served inside a lane (jobs already waiting for their turn are still "
    "admitted, in it). Set the same in every process (gateway, scaler, workers).",
    "tenant_weights": "Each tenant's weight in fair share (`tenant:weight,...`): with jobs waiting in a lane, tenants "
    "get its workers' takes in proportion to their weights, counted in work. Unset, or a tenant not listed: "
    "1. Read where jobs are accepted (the gateway, and the scaler's batch driver): a job keeps the weight "
    "it was accepted with.",
    "claim_idle_ms": "A delivered entry idle (lease not renewed) this long is reclaimed by another worker: the time "
    "it takes to notice a dead worker (G4).",
    "max_attempts": "Attempts per job (the first included) before a retryable failure fails it and dead-letters it.",
    "max_deliveries": "Deliveries that never finished (the worker died mid-job) before the job is failed and "
    "dead-lettered: a job that crashes its worker cannot crash the fleet for ever.",
    "job_timeout_s": "Default processing time of one attempt (a job's `timeout_s` overrides it); past it the worker "
    "abandons the attempt and retries.",
    "max_queue_depth": "Unfinished jobs (queued, delayed or running) past which submits get 429 with `Retry-After` "
    "(G6). 0: no limit.",
    "tenant_max_depth": "Unfinished jobs of one tenant past which that tenant's submits get 429, beside the global "
    "`INFERQ_MAX_QUEUE_DEPTH`. 0: no per-tenant limit.",
    "max_body_bytes": "Largest request body the gateway reads; above it 413, before any parsing.",
    "output_flush_ms": "A worker writes a watched job's output to Redis at most once per this many milliseconds (the "
    "first piece at once, for the time to first token): the deltas made meanwhile go in one write, every "
    "job's at once. The interval doubles after each write, up to `INFERQ_OUTPUT_FLUSH_MAX_MS`: a short "
    "answer comes in several pieces, a long one costs few writes. Each write, with its delivery to a "
    "following gateway, costs Valkey about a tenth of a whole unstreamed job (docs/benchmarks.md, ST). "
    "Lower it for smoother streams at that price. 0: every delta at once.",
    "output_flush_max_ms": "The longest interval between a worker's writes of a watched job's output: the interval "
    "starts at `INFERQ_OUTPUT_FLUSH_MS` and doubles after each write up to this. At the defaults a 10-second answer "
    "makes 6 writes (at 0, 0.5, 1.5, 3.5, 6 and 8.5 s) and costs Valkey under twice an unstreamed job "
    "(docs/benchmarks.md, ST); a fixed 500 ms (this set to 500) makes 21 and costs about 3.3 times. At or "
    "below `INFERQ_OUTPUT_FLUSH_MS` (0 included): the interval stays `INFERQ_OUTPUT_FLUSH_MS`.",
    "output_flush_tokens": "A worker writes a running job's output early, before its interval is over, once this "
    "many tokens are waiting. 0: by time only.",
    "result_ttl_s": "How long a terminal job's record (its result) is kept; also how long an idempotency key is "
    "kept from the submit, and how far back the dead-letter stream reaches.",
    "inline_max_bytes": "Largest request or result kept inline in the job record; larger payloads go to S3 "
    "(`INFERQ_FILES_BUCKET`) by claim check.",
    "events_maxlen": "Approximate length cap of the terminal-events stream `inferq:{Q}:events` (webhook deliveries "
    "read it).",
    "retry_base_ms": "Base of the retry backoff: the delay before attempt n+1 is uniform in "
    "[0, min(`INFERQ_RETRY_MAX_MS`, base * 2^(n-1))] (full jitter). 0: retry at once.",
    "retry_max_ms": "Cap of the retry backoff.",
    # worker
    "window": "Jobs one worker runs at once at the model server; it reads only as many entries as it has free slots "
    "(a job whose call is over frees its slot while its outcome is written, within twice the window held in all). "
    "`auto`: the worker "
    "sizes the window from the model server's own load, read every 0.5 s: the mean numbers of requests waiting "
    "inside the server and running between two reads (from vLLM's `vllm:e2e_request_latency_seconds` and "
    "`vllm:request_inference_time_seconds` counters; its `num_requests_waiting`/`running` gauges where it has no "
    "such counters) and the KV-cache usage. It grows while fewer than a small buffer wait and the KV cache has "
    "room, and shrinks when requests stand in a queue there (gpu_worker/window.py). The buffer is 15% of the "
    "running batch or, where more, the worker's requests on their way to the engine and back (the `openai` "
    "backend times each request, send to answer, against the server's own latency), 1 to 4.",
    "window_max": "Upper bound of the window when `INFERQ_WINDOW=auto` sizes it from the backend. With `auto` it is "
    "also the connections the `openai` backend keeps, vLLM's `max_num_seqs` with the `vllm` backend, and the "
    "scaler's jobs per worker unless `INFERQ_SCALE_TARGET_PER_WORKER` is set.",
    "drain_s": "On SIGTERM (a scale-in, a deployment, ECS draining a Spot instance on its two-minute notice), how "
    "long a worker lets in-flight jobs finish before it releases the rest to the queue. A job that will not end within "
    "it (by the rate it makes tokens and its `max_tokens`, or what the backend knows it will make) is handed back at "
    "once, its output kept for the next attempt to continue (docs/api.md, Continuation); none spends an attempt.",
    "backend": "What runs a job: `mock` (deterministic echo with failure controls), `openai` (an OpenAI-compatible "
    "server such as `vllm serve`), `vllm` (vLLM's engine in-process; GPU images only).",
    "openai_base_url": "The model server of the `openai` backend.",
    "openai_api_key": "Bearer token for the model server of the `openai` backend, when it wants one.",
    "vllm_model": "The model the `vllm` backend loads (required with that backend).",
    "metrics_port": "Port of the worker's Prometheus metrics. 0: not served.",
    "worker_id": "The worker's consumer name in the `workers` group (default: host name, process id and a random "
    "suffix). Must be unique per live worker.",
    "models": "Path of the model registry (YAML or JSON): one queue per model, selected by `body.model`. Unset: one "
    "queue.",
    "model": "The registry entry a worker serves (required when the registry names more than one model).",
    "files_bucket": "S3 bucket of the Files, Uploads and Batches APIs and of large payloads (unset: those APIs "
    "answer 503). `inferq up` creates `inferq-files` in its moto S3.",
    "max_upload_bytes": "Largest file in one `POST /v1/files`, and largest part of an upload (one request through "
    "API Gateway and Lambda, which carry 6 MB at most, base64 included).",
    "max_file_bytes": "Largest file the Uploads API assembles (`bytes` of `POST /v1/uploads`).",
    "batch_completion_windows": "Comma-separated `completion_window` values `POST /v1/batches` accepts (`24h` is "
    "OpenAI's; `90s`, `30m` style values let tests and operators expire batches sooner).",
    "batch_max_lines": "Most requests in one batch input file (more: the batch fails validation).",
    "tenant_max_files": "Files one tenant may keep stored (uploads, and the output and error files of its batches); "
    "at the bound `POST /v1/files`, `POST /v1/uploads` and `POST /v1/uploads/{id}/complete` answer 429 "
    "`quota_exceeded` until it deletes some. Checked from per-tenant counts in the cache (no S3 LIST), before a "
    "file is written and again, in one step with its count, once it is (a file that took the tenant past the bound "
    "is removed and refused), so uploads racing each other cannot pass it together. 0: no limit.",
    "tenant_max_file_bytes": "Bytes one tenant may keep stored: its files plus the parts of its open uploads (a "
    "part counts from the moment it is added). A file, a part, an upload opened or completed past the bound is "
    "429 `quota_exceeded`, checked before and with the write as for `INFERQ_TENANT_MAX_FILES` (a part's bytes count "
    "until its upload is completed, cancelled or expires). 0: no limit.",
    "edge_origin_secret": "The authorizer's: Secrets Manager id of the origin secret a stack with an edge "
    "(`EdgeProtection: waf`) generates (JSON `{\"current\"}`, `\"previous\"` too during a rotation). When set, a "
    "request without the `X-Inferq-Origin-Verify` header CloudFront adds, holding one of those values, is refused "
    "(403) before its key is looked at: the API's own `execute-api` address answers nobody who skipped the web ACL. "
    "Unset: no origin check.",
    "webhook_hosts": "Comma-separated hosts webhook URLs may name: exact names (`hooks.example.com`) or `*.zone` "
    "(any name under the zone). A URL to another host is 422 at submit (`webhook_host`) and refused at send. The "
    "stack sets its `WebhookHosts`, which its DNS Firewall (`DnsFirewall on`) also lets the VPC resolve. Holds "
    "with `INFERQ_WEBHOOK_ALLOW_PRIVATE` too. Empty: any public host.",
    "file_recount_s": "The scaler recounts each tenant's files from a LIST of the bucket at most this often (seconds), "
    "off the request path, correcting the counts the file quotas read for what no request saw: files the bucket's "
    "lifecycle rule expired (`FileRetentionDays`), a process that died between S3's write or delete and the count, "
    "counts lost with the cache. Also how often it looks for tenants with files and no counts.",
    "tenant_max_batches": "Batches of one tenant not yet ended (validating, in progress, finalizing, cancelling); at "
    "the bound `POST /v1/batches` answers 429 `quota_exceeded` with `Retry-After`. Checked before each create, so "
    "creates racing each other can pass it together. 0: no limit.",
    # scaler
    "scale_min": "Workers the scaler keeps when idle.",
    "scale_max": "Most workers the scaler asks for.",
    "scale_target_per_worker": "Jobs (lagging + pending + delayed) one worker should carry: desired = "
    "ceil(backlog / this). Unset: `INFERQ_WINDOW` (with `auto`: `INFERQ_WINDOW_MAX`).",
    "scale_down_cooldown_s": "Calm time (demand asking for fewer workers without a break) before the scaler scales "
    "down; between two scale-downs the count only rises.",
    "scale_to_zero_after_s": "Idle time (nothing lagging, pending, delayed or in flight) before the last worker "
    "goes. With the boot forecast (`INFERQ_SCALE_BOOT_S` > 0) it is the longest such wait: a worker that no job is "
    "expected to need within a boot time goes as soon as it is idle.",
    "scale_boot_s": "How long a new GPU worker takes from the scaler's request to its first job (instance, image, "
    "model load). The scaler's boot-aware scale-in keeps a worker only when the arrival forecast (the queue's "
    "`enqueued` counter, averaged over about this long) expects work for it within a boot time, and sizes what "
    "it keeps by the workers' measured run time. 0: no forecast (`inferq up` sets 0).",
    "scale_gather_s": "A few jobs (fewer than one worker's target) arriving at an empty fleet wait up to this long, "
    "by the oldest one's age, for company before a worker is started: one boot then serves them all (the latency "
    "budget spent where it is cheap). 0 (the default): the first job gets a worker at once, as wake-on-enqueue "
    "promises; docs/benchmarks.md shows what 30 s saves.",
    "scale_tokens_per_s": "Work-based sizing: output tokens per second one worker is assumed to produce (its "
    "window full) until the workers have measured their own (output tokens per backend second, published with "
    "each heartbeat). Set, the scaler sizes the fleet by work: the backlog's expected tokens (each job's "
    "`max_tokens`, `backlog_tokens` in the stats hash) over the fleet's throughput are the seconds of work "
    "waiting, and it asks for no more workers than finish them within a boot time (`INFERQ_SCALE_BOOT_S`), nor "
    "more than the job counts ask for. 0 (the default): the job counts alone size the fleet "
    "(`ceil(backlog / INFERQ_SCALE_TARGET_PER_WORKER)`), and no job carries the `tokens` field: the queue does no "
    "work for the counter. Set it for every process that enqueues too (the gateway, the scaler's batch driver: the "
    "template does); docs/benchmarks.md compares the two.",
    "scale_spot_fallback_s": "With a Spot fleet (infra/gpu.yaml's `SpotCapacity`): how long a task of the service may "
    "wait for a Spot instance (`PROVISIONING`) before the scaler starts an on-demand stand-in for it on the "
    "fallback service, named the service's name + `-on-demand`. Once Spot is short, tasks asked for within the "
    "next 30 minutes get a stand-in at once; stand-ins go as Spot tasks start or the queue needs fewer workers. "
    "0 (the default outside the stack, which sets 180): no fallback service; Spot tasks wait for capacity.",
    "scale_drain": "Whether the scaler asks the workers beyond the fleet's need to take no new jobs and drain (the "
    "drain target, `target` in the scale hash), so scale-in takes effect under load. `false` where nothing turns "
    "the desired count into workers, as in `emulator/compose.yaml`'s fixed workers.",
    "emulator_boot_s": "`inferq up` only: how long the emulator's ECS agent keeps a new task starting (counted as "
    "pending) before its worker process starts, to emulate a GPU instance's boot.",
    "emulator_interrupt_every_s": "`inferq up` only: Spot interruptions as a chaos setting: each worker the "
    "emulator's ECS agent starts is interrupted as EC2 Spot interrupts an instance (drained: SIGTERM, no longer "
    "counted as running, its replacement started at once) after a random time with this mean, in seconds. 0 (the "
    "default): only `inferq interrupt` does it.",
    "scaler_interval_s": "The emulator's period between scaler calls (`inferq up` sets 2). In AWS the schedule fires "
    "every minute and one invocation evaluates every 5 s until near its end.",
    "scaler_function": "The scaler Lambda the gateway invokes asynchronously to wake the fleet from zero (AWS).",
    "scaler_wake_url": "The URL the gateway POSTs to wake the scaler (the emulator's; `inferq up` sets it).",
    "ecs_cluster": "The ECS cluster of the GPU service (required by the scaler).",
    "ecs_service": "The ECS service the scaler sizes (required by the scaler).",
    # webhooks
    "webhook_secret": "The deployment's own webhook signing key, for single-tenant setups: when set, every delivery "
    "carries a signature with it beside the one with the tenant's own secret (docs/api.md, \"Webhooks\"). Give it to "
    "no tenant of a shared deployment.",
    "webhook_max_age_s": "How long after the terminal state a failing webhook delivery is retried before it is "
    "given up.",
    "webhook_allow_private": "Allow `webhook_url`s that name loopback, private, link-local, unique-local, multicast "
    "or unspecified addresses or `localhost` (refused with 422 otherwise). For development: `inferq up` sets it.",
    "webhook_ports": "The ports a `webhook_url` may name (an https URL without one is port 443); any other is 422 at "
    "submit. `INFERQ_WEBHOOK_ALLOW_PRIVATE=true` lifts the rule with the address guard's.",
    "webhook_blocked_networks": "CIDR blocks a webhook may not reach besides the guard's own table (loopback, "
    "private, link-local, carrier-grade NAT, ...): the stack sets its VPC's, which may lie outside RFC 1918.",
    "webhook_secrets_key": "What seals the tenants' webhook secrets in Redis: a KMS key ARN or `alias/<name>` (AWS: "
    "envelope encryption, data keys cached), or `file:<path>` of a local 32-byte key made on first use (`inferq up` "
    "sets one in `--data-dir`). Unset: stored as they are (docs/api.md, \"Webhooks\").",
    "worker_webhooks": "Whether workers deliver webhooks beside the scaler. The GPU task sets `false`: its engine "
    "shares its network, which has no route to the internet (the scaler delivers).",
    # logs
    "log_level": "Log level of every process.",
    "log_payloads": "Log request and response bodies at DEBUG in the worker. Off: prompts and outputs are never "
    "logged.",
}
"""Meaning of every setting, by field name. Also holds the names DESIGN's configuration contract adds that
``Settings`` does not have yet (:data:`PLANNED`): once such a field is added, its row appears in the table."""

PLANNED = (
    "tenant_max_depth",
    "redis_wait_replicas",
    "webhook_allow_private",
    "inline_max_bytes",
    "models",
    "model",
    "window_max",
)
"""Contract names with no ``Settings`` field yet: listed as not yet implemented until the field exists."""

OTHER_VARIABLES: dict[str, str] = {
    "INFERQ_URL": "`inferq submit` and `inferq status`: the gateway's base URL (default: what `inferq up` left in "
    "`--data-dir`, else `http://127.0.0.1:8080`).",
    "INFERQ_API_KEY": "`inferq submit` and `inferq status`: the API key (default: the development key `inferq up` "
    "left in `--data-dir`).",
    "INFERQ_MOCK_WORKERS": "`emulator/compose.yaml`: how many mock-backend worker containers to run (default 2).",
    "INFERQ_EXTRAS": "Build argument of `gpu_worker/Dockerfile`: the package extras installed (default `worker`).",
}
"""``INFERQ_*`` names read by something other than ``Settings``."""


def _accepts(parse: Callable[..., Any]) -> str:
    """What a field's parser accepts, in words (its bounds read from the closure of ``_int``/``_float``)."""
    qualname = getattr(parse, "__qualname__", "")
    code, closure = getattr(parse, "__code__", None), getattr(parse, "__closure__", None) or ()
    free = dict(zip(code.co_freevars, [c.cell_contents for c in closure], strict=True)) if code else {}
    if qualname.startswith("_int."):
        lo, hi = free.get("lo"), free.get("hi")
        if lo is not None and hi is not None:
            return f"integer {lo} to {hi}"
        return f"integer ≥ {lo}" if lo is not None else (f"integer ≤ {hi}" if hi is not None else "integer")
    if qualname.startswith("_float."):
        lo = free.get("lo")
        return f"number ≥ {lo:g}" if lo is not None else "number"
    named = {
        "_bool": "`true` or `false` (also 1/0, yes/no, on/off)",
        "_str": "text",
        "_optional_str": "text (empty: unset)",
        "_queue": "1 to 128 characters, no braces or whitespace",
        "_redis_url": "`redis://`, `rediss://` or `unix://` URL with a host",
        "_http_url": "`http://` or `https://` URL",
        "_api_keys": "`tenant:key,tenant:key`",
        "_backend": "`mock`, `openai`, `vllm`",
        "_log_level": "`DEBUG`, `INFO`, `WARNING`, `ERROR`, `CRITICAL`",
    }
    if qualname in named:
        return named[qualname]
    doc = (parse.__doc__ or "").strip().splitlines()
    if doc:
        return doc[0].rstrip(".")
    raise ValueError(f"parser {qualname!r} of inferq/config/parsers.py: give it a docstring (its first line is shown "
                     f"in docs/configuration.md) or add it to _accepts in scripts/gen_docs.py")


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def missing_docs() -> list[str]:
    """Fields of ``Settings`` without a meaning."""
    from inferq.config.settings import Settings

    return [f.name for f in dataclasses.fields(Settings) if not (f.metadata.get("doc") or SETTING_DOCS.get(f.name))]


def unknown_docs() -> list[str]:
    """Meanings in :data:`SETTING_DOCS` for names that are neither a ``Settings`` field nor :data:`PLANNED`."""
    from inferq.config.settings import Settings

    names = {f.name for f in dataclasses.fields(Settings)} | set(PLANNED)
    return sorted(set(SETTING_DOCS) - names)


def configuration_md() -> str:
    from inferq.config.settings import Settings

    missing = missing_docs()
    if missing:
        raise ValueError(
            "no meaning for setting(s) " + ", ".join(Settings.variable(n) for n in missing)
            + ": add a line to SETTING_DOCS in scripts/gen_docs.py (or doc= metadata on the field), then run "
            + COMMAND
        )
    fields = dataclasses.fields(Settings)
    rows = []
    for f in fields:
        meaning = f.metadata.get("doc") or SETTING_DOCS[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        rows.append(
            f"| `{Settings.variable(f.name)}` | {_cell(_default(default))} | {_cell(_accepts(f.metadata['parse']))} "
            f"| {_cell(meaning)} |"
        )
    present = {f.name for f in fields}
    planned = [
        f"- `{Settings.variable(name)}`: {SETTING_DOCS[name]}" for name in PLANNED if name not in present
    ]
    others = [f"- `{name}`: {text}" for name, text in OTHER_VARIABLES.items()]
    parts = [
        "<!-- Generated by scripts/gen_docs.py from inferq/config/settings.py: edit those, then run "
        f"`{COMMAND}`. -->",
        "# Configuration",
        "",
        "Every process (gateway, scaler, worker, `inferq up`) reads one settings object, "
        "`inferq.config.settings.Settings`, from the environment once at start: field `x` is the variable "
        "`INFERQ_X`. A value the parser does not "
        "accept stops the process at start with a one-line message naming the variable (exit status 2; a Lambda "
        "fails its init). Checks across variables (for example `INFERQ_SCALE_MIN` ≤ `INFERQ_SCALE_MAX`) are in "
        "`Settings.__post_init__` and name their variable too. Which process reads which variable in AWS, and from "
        "where, is in [DEPLOY.md](../DEPLOY.md), section *Secrets, and what the functions read*.",
        "",
        "| variable | default | accepts | meaning |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    if planned:
        parts += [
            "## Named by the design, not yet implemented",
            "",
            "These names are reserved for features that are not built yet; setting them has no effect today.",
            "",
            *planned,
        ]
        if "window_max" not in present:
            parts.append("- `INFERQ_WINDOW=auto` (a window sized from the backend): today `INFERQ_WINDOW` takes "
                         "only an integer.")
        parts.append("")
    parts += [
        "## Other variables",
        "",
        "Read by a tool rather than by `Settings`:",
        "",
        *others,
        "",
    ]
    return "\n".join(parts)


def openapi_json() -> str:
    from functions.gateway.api import create_app
    from inferq.config.settings import Settings

    # Defaults, not the environment: the document must not depend on who generates it. A key is given because a
    # gateway without keys refuses to start; no client is opened.
    app = create_app(Settings(), keys={"docs-generator": "docs"})
    return json.dumps(app.openapi(), indent=2, ensure_ascii=False) + "\n"


GENERATED: dict[Path, Callable[[], str]] = {OPENAPI_PATH: openapi_json, CONFIGURATION_PATH: configuration_md}


def stale() -> list[Path]:
    """Generated files whose content differs from what the code generates now."""
    return [path for path, make in GENERATED.items() if not path.exists() or path.read_text() != make()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        old = stale()
        for path in old:
            print(f"{path.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
        return 1 if old else 0
    DOCS.mkdir(exist_ok=True)
    for path, make in GENERATED.items():
        path.write_text(make())
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
