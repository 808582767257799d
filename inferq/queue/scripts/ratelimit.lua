--[[
  Take one request from a tenant's rate limit (INFERQ_RATE_LIMIT_PER_S, INFERQ_RATE_LIMIT_BURST), shared by every
  gateway instance. GCRA (the generic cell rate algorithm): the bucket is one number, the theoretical arrival time
  of the next request (microseconds, server clock; written with %.0f, exact below 2^53); a request is allowed when
  that time is at most `tolerance` ahead of now, and moves it one `interval` on. The server's clock is used, so gateways with drifting clocks agree.
  Safe to resend (G9): the answer is kept under the call's own key for a few seconds; a resent copy answers the
  same and takes nothing more.

  KEYS[1] bucket (string: theoretical arrival time, us; expires when the bucket is full again)
  KEYS[2] call (string: this call's answer, kept `ARGV[3]` ms)

  ARGV[1] interval (us per request: 1000000 / rate, an integer)
  ARGV[2] tolerance (us: interval * burst, an integer)
  ARGV[3] how long a call's answer is kept (ms)

  Returns
    {1, 0}               allowed
    {0, retry_after_ms}  refused: the next request is allowed in retry_after_ms
]]
local rcall = redis.call
local bucketKey, callKey = KEYS[1], KEYS[2]
local interval, tolerance, keepMs = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

local kept = rcall('GET', callKey)
if kept then
  local allowed, wait = string.match(kept, '^(%d+) (%d+)$')
  return {tonumber(allowed), tonumber(wait)}
end

local time = rcall('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local tat = tonumber(rcall('GET', bucketKey) or '0')
if tat < now then
  tat = now
end
local nextTat = tat + interval
local answer
if nextTat - now > tolerance then
  answer = {0, math.ceil((nextTat - now - tolerance) / 1000)}
else
  rcall('SET', bucketKey, string.format('%.0f', nextTat), 'PX', math.max(1, math.ceil((nextTat - now) / 1000)))
  answer = {1, 0}
end
rcall('SET', callKey, answer[1] .. ' ' .. answer[2], 'PX', keepMs)
return answer
