"""The queue protocol: a job's life in Redis Streams, one atomic Lua script per transition (docs/data-model.md).

- :mod:`.jobs` (the job, its status and its record), :mod:`.keys` (every key name), :mod:`.lanes` (priority lanes);
- :mod:`.producer` (what the gateway runs: accept once per idempotency key, read, cancel) and :mod:`.consumer` (what a
  worker runs: read, reclaim, lease, finish, dead-letter), joined in :mod:`.protocol`'s :class:`Queue`, over
  :mod:`.core` (one queue on one Redis client);
- :mod:`.waiters` (long polls), :mod:`.feed` (the results feed), :mod:`.history` (the console's charts);
- :mod:`.claimcheck` (bodies and results too large for Redis, in S3), :mod:`.engine_body` (what the engine accepts:
  the fields per endpoint) with :mod:`.body_fields` (each field's check), :mod:`.structured` (structured output
  parsed and bounded) and :mod:`.grammar` (the EBNF grammars);
- ``scripts/``: the Lua scripts, each safe to resend (G9).
"""
