--[[
  Fence a job's output stream for the delivery that now holds the job, and read what it keeps: the start of an
  attempt that continues after output an earlier one kept (the record's `out`). One entry, `f` = the delivery's
  lease token, goes after
  what the stream holds; a writer of an earlier delivery, whose fenced appends (appendoutput.lua) need their own
  entry to be the stream's last, can add nothing after it, and its owner-checked ones are refused as before (the
  lease is not its own). What it added before the fence is read here, in the same step, so the kept output this
  delivery continues after is exactly what precedes the fence. Readers pass over the fence (it holds no text).
  Safe to resend (G9): a stream that ends with this delivery's own fence is left as it is, and the answer is the
  same (that fence, and what precedes it).

  KEYS[1] job record
  KEYS[2] output stream of the job

  ARGV[1] entry id of the delivery
  ARGV[2] its lease token (from start)
  ARGV[3] the expiry (s) to give the stream: the attempt's timeout plus the result TTL

  Returns {0, the fence's id, cancel requested (1) or not (0), the stream's entries before the fence}, or
  {code} with code NOT_FOUND, TERMINAL or STALE_OWNER (as appendoutput.lua): nothing written.
]]
local rcall = redis.call
local jobKey, outKey = KEYS[1], KEYS[2]

local job = rcall('HMGET', jobKey, 'status', 'entry', 'lease', 'cancel')
if not job[1] then
  return {CODE_NOT_FOUND}
elseif TERMINAL[job[1]] then
  return {CODE_TERMINAL}
elseif job[1] ~= 'running' or job[2] ~= ARGV[1] or job[3] ~= ARGV[2] or ARGV[2] == '' then
  return {CODE_STALE_OWNER}
end
local last = rcall('XREVRANGE', outKey, '+', '-', 'COUNT', 1)[1]
local entries, id
if last and last[2][1] == 'f' and last[2][2] == ARGV[2] then  -- this delivery's own fence: a resent copy
  id = last[1]
  entries = rcall('XRANGE', outKey, '-', '(' .. id)
else
  entries = rcall('XRANGE', outKey, '-', '+')
  id = rcall('XADD', outKey, '*', 'f', ARGV[2])
end
rcall('EXPIRE', outKey, ARGV[3])
return {0, id, (job[4] == '1') and 1 or 0, entries}
