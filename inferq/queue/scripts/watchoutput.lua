--[[
  Mark a job as watched: someone reads its output while it runs (GET /v1/jobs/{id}/stream), so the worker that runs
  it writes its output as it is made (a job nobody watches writes none while it runs: its result has it all). The
  worker learns it from the record when it starts the job, or from its next lease renewal.
  A job submitted through the OpenAI front door with `stream: true` is watched from its enqueue (field `watch`).
  Safe to resend: a watched job stays watched; the answer is the same.

  KEYS[1] job record

  ARGV[1] tenant of the reader

  Returns 1 when the job is watched (now or before), 0 when it is unknown, another tenant's or has ended.
]]
local rcall = redis.call
local jobKey = KEYS[1]

local job = rcall('HMGET', jobKey, 'status', 'tenant', 'watch')
if not job[1] or job[2] ~= ARGV[1] or TERMINAL[job[1]] then
  return 0
end
if job[3] ~= '1' then
  rcall('HSET', jobKey, 'watch', '1')
end
return 1
