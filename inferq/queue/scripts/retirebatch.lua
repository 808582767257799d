--[[
  Retire an ended batch: the driver has no more work on it (off the active set), its record and its lines expire
  after the result TTL, and what they hold is charged to its tenant (G11, inferq/queue/holds.py) until the tenant's
  index of batches forgets it: the bytes of the record's fields, BATCH_LINE_BYTES per line and HOLD_RECORD_BYTES for
  the rest (the hashes' own overhead, the index entry). Without the charge a tenant creating and cancelling batches
  at its rate limit would leave a record a batch, each kept a day, that no bound counts.
  Safe to resend (G9): the charge is written once (the record's field held), and the rest sets what it set.

  KEYS[1] batch record
  KEYS[2] batch lines (line number -> job id)
  KEYS[3] batches the driver still works on (sorted set)
  KEYS[4] per-tenant bounds (keys.bounds): the charge (includes/holdRecord)

  ARGV[1] batch id
  ARGV[2] the record's and the lines' time to live (s)
  ARGV[3] how long the tenant's index keeps a batch after its creation (s): the charge holds until then

  Returns the bytes charged (a resent copy: the first run's; 0: the record is gone)
]]
local rcall = redis.call
local batchKey, linesKey, activeKey = KEYS[1], KEYS[2], KEYS[3]
local HOLDS = KEYS[4]
local batchId, ttl, indexKeepS = ARGV[1], ARGV[2], tonumber(ARGV[3])
local BATCH_LINE_BYTES = 96

--- @include "holdRecord"

rcall('ZREM', activeKey, batchId)
local record = rcall('HGETALL', batchKey)
if #record == 0 then
  return 0
end
rcall('EXPIRE', batchKey, ttl)
rcall('EXPIRE', linesKey, ttl)
local bytes, tenant, created = HOLD_RECORD_BYTES + BATCH_LINE_BYTES * rcall('HLEN', linesKey), nil, 0
for i = 1, #record, 2 do
  local name, value = record[i], record[i + 1]
  bytes = bytes + #name + #value
  if name == 'tenant' then
    tenant = value
  elseif name == 'created_at' then
    created = tonumber(value) or 0
  end
end
if not tenant then
  return 0
end
if rcall('HSETNX', batchKey, 'held', bytes) == 0 then
  return tonumber(rcall('HGET', batchKey, 'held'))
end
local counts = {}
holdRecord(counts, tenant, bytes, (created + indexKeepS) * 1000)
holdFlush(counts)
return bytes
