--[[
  Begin one delivery of a stream entry (read by XREADGROUP or reclaimed by XAUTOCLAIM).
  Entries of terminal jobs are acknowledged without running the model (G5); a job that has crashed its
  workers more than max deliveries times is dead-lettered; a queued job past its TTL expires.

  KEYS[1] stream
  KEYS[2] stats
  KEYS[3] events
  KEYS[4] dlq
  KEYS[5] job record
  KEYS[6] done (long-poll wakeup)
  KEYS[7] expiry (a started job can no longer expire)

  ARGV[1] entry id
  ARGV[2] consumer (worker id)
  ARGV[3] now (ms)
  ARGV[4] max deliveries
  ARGV[5] result TTL (s)
  ARGV[6] events max length
  ARGV[7] "1" when the entry was reclaimed from another consumer

  Returns
    {0, field, value, ...}  run it: the whole job record
    -1 NOT_FOUND            entry acknowledged
    -4 TERMINAL             {-4, status}: already terminal, entry acknowledged, model not called
    -5 STALE                the entry is not the job's live entry; acknowledged
    -7 ENDED                {-7, status}: ended here (expired, cancelled, dead-lettered); acknowledged
]]
local rcall = redis.call
local streamKey, statsKey, eventsKey, dlqKey, jobKey, doneKey = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local expiryKey = KEYS[7]
local entryId, consumer, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local maxDeliveries, resultTtl, eventsMaxlen, reclaimed = tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]

--- @include "ackEntry"
--- @include "isTerminal"
--- @include "terminate"
--- @include "deadLetter"

local job = rcall('HMGET', jobKey, 'id', 'status', 'entry', 'cancel', 'expires_at', 'started_at')
local jobId, status, entry, cancel, expiresAt, startedAt = job[1], job[2], job[3], job[4], job[5], job[6]

if not jobId then
  ackEntry(streamKey, entryId)
  return {-1}
end
if TERMINAL[status] then
  ackEntry(streamKey, entryId)
  rcall('HINCRBY', statsKey, 'skipped_terminal', 1)
  return {-4, status}
end
if entry ~= entryId then
  ackEntry(streamKey, entryId)
  return {-5}
end
if reclaimed == '1' then
  rcall('HINCRBY', statsKey, 'reclaimed', 1)
end
if cancel == '1' then
  ackEntry(streamKey, entryId)
  terminate(jobKey, doneKey, statsKey, eventsKey, jobId, 'cancelled', now, resultTtl, eventsMaxlen,
    {'error', '{"type":"cancelled","message":"the job was cancelled"}'})
  return {-7, 'cancelled'}
end
if expiresAt and expiresAt ~= '' and (not startedAt or startedAt == '') and now > tonumber(expiresAt) then
  ackEntry(streamKey, entryId)
  rcall('ZREM', expiryKey, jobId)
  terminate(jobKey, doneKey, statsKey, eventsKey, jobId, 'expired', now, resultTtl, eventsMaxlen,
    {'error', '{"type":"expired","message":"no attempt started within ttl_s"}'})
  return {-7, 'expired'}
end

local deliveries = rcall('HINCRBY', jobKey, 'deliveries', 1)
if deliveries > maxDeliveries then
  ackEntry(streamKey, entryId)
  deadLetter(jobKey, doneKey, statsKey, eventsKey, dlqKey, jobId, now, resultTtl, eventsMaxlen, 'max_deliveries',
    '{"type":"max_deliveries","message":"the job was delivered ' .. (deliveries - 1) ..
    ' times without finishing (did it crash its worker?)"}')
  return {-7, 'failed'}
end

rcall('HSET', jobKey, 'status', 'running', 'worker', consumer, 'leased_at', now)
if not startedAt or startedAt == '' then
  rcall('HSET', jobKey, 'started_at', now)
  if expiresAt and expiresAt ~= '' then
    rcall('ZREM', expiryKey, jobId)
  end
end
local record = rcall('HGETALL', jobKey)
table.insert(record, 1, 0)
return record
