--[[
  Renew the leases a worker holds: reset the idle time of each of its pending entries (XCLAIM to itself,
  JUSTID, which does not count a delivery) so a long inference is never reclaimed while its worker is healthy.
  An entry that another consumer has taken over is left alone and reported lost. Also reports, per job,
  whether cancellation was requested, so the worker can abort the backend call.

  KEYS[1] stream
  KEYS[2..n] job records, one per entry

  ARGV[1] consumer (worker id)
  ARGV[2..n] entry ids, in the order of the job keys

  Returns one code per entry
    0 renewed
    1 renewed, cancellation requested
    2 lost: owned by another consumer, acknowledged, or no longer the job's live entry
    3 the job is already terminal
]]
local rcall = redis.call
local streamKey = KEYS[1]
local consumer = ARGV[1]

--- @include "isTerminal"

local codes = {}
for i = 2, #KEYS do
  local entryId = ARGV[i]
  local code = 2
  local job = rcall('HMGET', KEYS[i], 'status', 'entry', 'cancel')
  if TERMINAL[job[1]] then
    code = 3
  elseif job[2] == entryId then
    local pending = rcall('XPENDING', streamKey, 'workers', entryId, entryId, 1)
    if pending[1] and pending[1][2] == consumer then
      rcall('XCLAIM', streamKey, 'workers', consumer, 0, entryId, 'JUSTID')
      code = (job[3] == '1') and 1 or 0
    end
  end
  codes[i - 1] = code
end
return codes
