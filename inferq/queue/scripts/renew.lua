--[[
  Renew the leases a worker holds: reset the idle time of each of its pending entries (XCLAIM to itself,
  JUSTID, which does not count a delivery) so a long inference is never reclaimed while its worker is healthy.
  A delivery is held while the job's live entry and lease token are the ones start gave it (a field compare,
  no XPENDING); an entry another consumer has taken over, or that was started again, is left alone and
  reported lost. Also reports, per job, whether cancellation was requested, so the worker can abort the
  backend call, and whether someone watches its output (record field `watch`, inferq/queue/output.py), so the worker
  writes it as it is made. Safe to resend: a second run answers the same and only resets the idle times again.

  KEYS[1] stream of the entries: one lane per call
  KEYS[2..n] job records, one per entry

  ARGV[1] consumer (worker id)
  ARGV[2..n] entry ids, in the order of the job keys
  ARGV[n+1..2n-1] lease tokens (from start), in the same order

  Returns one code per entry
    0 renewed
    1 renewed, cancellation requested
    2 lost: owned by another consumer, acknowledged, or no longer the job's live entry
    3 the job is already terminal
    4 renewed, and the job is watched (its output is read as it is made)
]]
local rcall = redis.call
local streamKey = KEYS[1]
local consumer = ARGV[1]
local count = #KEYS - 1


local codes = {}
for i = 1, count do
  local entryId, lease = ARGV[1 + i], ARGV[1 + count + i]
  local code = 2
  local job = rcall('HMGET', KEYS[1 + i], 'status', 'entry', 'cancel', 'lease', 'watch')
  if TERMINAL[job[1]] then
    code = 3
  elseif job[2] == entryId and job[4] == lease and lease ~= '' then
    rcall('XCLAIM', streamKey, GROUP, consumer, 0, entryId, 'JUSTID')
    if job[3] == '1' then
      code = 1
    elseif job[5] == '1' then
      code = 4
    else
      code = 0
    end
  end
  codes[i] = code
end
return codes
