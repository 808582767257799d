--[[
  Open an upload (the Uploads API): its record, kept an hour, is charged to its tenant (G11, inferq/queue/holds.py)
  in the hour it expires in -- a fixed HOLD_RECORD_BYTES and its fields' bytes; addpart.lua charges each part it
  records in the same hour -- so opening uploads at the rate limit fills the tenant's retained-records quota, not the
  cache. A tenant at its quota opens none (includes/holdsAdmit, which gives back the hours that are over first).
  Safe to resend (G9): the gateway names the upload, so a resent copy finds its record and answers the same.

  KEYS[1] the upload's record
  KEYS[2] per-tenant bounds (keys.bounds)

  ARGV[1] tenant
  ARGV[2] now (ms)
  ARGV[3] the record's time to live (s)
  ARGV[4] max bytes the tenant's ended jobs, batches and uploads may hold (0: no limit)
  ARGV[5..] the record's fields, as name/value pairs

  Returns
    {1, bytes}         opened, and charged bytes (a resent copy: the same)
    -12 RETAINED_FULL  {-12, ms until some of the tenant's charge goes}; nothing written
]]
local rcall = redis.call
local uploadKey = KEYS[1]
local HOLDS = KEYS[2]
local tenant, now, ttl, maxKept = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

--- @include "holdsAdmit"
--- @include "holdRecord"

local held = rcall('HGET', uploadKey, 'held')
if held then
  return {1, tonumber(held)}
end
local refusal = holdsAdmit(tenant, now, maxKept, true)
if refusal then
  return refusal
end
local untilMs = now + ttl * 1000
local hour = (untilMs - untilMs % HOLD_BUCKET_MS) / HOLD_BUCKET_MS
local bytes = HOLD_RECORD_BYTES
for i = 5, #ARGV do
  bytes = bytes + #ARGV[i]
end
rcall('HSET', uploadKey, 'held', bytes, 'held_hour', string.format('%d', hour), unpack(ARGV, 5))
rcall('EXPIRE', uploadKey, ttl)
local counts = {}
holdRecord(counts, tenant, bytes, untilMs)
holdFlush(counts)
return {1, bytes}
