--[[
  Take one of a tenant's long-poll slots (INFERQ_TENANT_MAX_WAITS): a wait (GET /v1/jobs/{id}?wait=, GET
  /v1/events?wait=, a job's stream, a synchronous completion) holds a gateway execution for its whole length, so
  one tenant may hold only so many at once, whatever its request rate. A slot lapses at its expiry, so one whose
  holder never gave it back (a Lambda sandbox that died or was frozen mid-wait) is free again by then.
  Safe to resend (G9): the slot is the caller's random token; a resent copy of a call that took it finds it and
  answers the same, adding nothing. A resent copy of a refused call may find a slot free by then and take it: that
  is one call's effect (at the resend's time), and its answer says so.

  KEYS[1] the tenant's slots (sorted set: slot token -> when it lapses, ms; expires with its last slot)

  ARGV[1] slot token (random, one per wait)
  ARGV[2] now (ms)
  ARGV[3] when this slot lapses (ms): the wait's end and a margin for the calls around it
  ARGV[4] the tenant's limit (> 0)

  Returns
    {1, 0}                taken
    {0, first_lapse_ms}   refused: every slot is held; the earliest time one lapses, if its wait does not end first
]]
local rcall = redis.call
local slotsKey = KEYS[1]
local token, now, lapses, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if rcall('ZSCORE', slotsKey, token) then
  return {1, 0}
end
rcall('ZREMRANGEBYSCORE', slotsKey, '-inf', now)
if rcall('ZCARD', slotsKey) >= limit then
  local first = rcall('ZRANGE', slotsKey, 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2])}
end
rcall('ZADD', slotsKey, lapses, token)
local last = rcall('ZRANGE', slotsKey, -1, -1, 'WITHSCORES')
rcall('PEXPIREAT', slotsKey, last[2])
return {1, 0}
