--[[
  Move retries whose backoff is over from the delayed set to where each job's lane takes it from
  (includes/fairPlace, G10): its lane's stream, or behind its tenant's jobs waiting for admission when jobs wait.
  The caller reads candidates with ZRANGEBYSCORE and passes their job keys; each is checked again here, so two
  workers promoting at once cannot add one job twice.
  Safe to resend (G9): each job promoted records the call token (field promoted_by); a resent copy counts the
  jobs it finds promoted under its token again, and adds nothing.

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags
  KEYS[10] delayed
  KEYS[11..n] job records

  ARGV[1] now (ms)
  ARGV[2] call token (random, one per call)
  ARGV[3] "1": fair share (else each job goes straight into its lane's stream)
  ARGV[4..n] job ids, in the order of the job keys (ARGV[i] is the id of KEYS[i + 7])

  Returns the number of jobs promoted.
]]
local rcall = redis.call
local delayedKey = KEYS[10]
local now, call, fair = tonumber(ARGV[1]), ARGV[2], ARGV[3] == '1'

--- @include "fairLane"
--- @include "undelivered"
--- @include "fairPlace"
--- @include "fairCost"

local lanes = {}
for i, name in ipairs(LANE_KEYS) do
  lanes[name] = fairLane(KEYS[3 * i - 2], 3 * i - 1)
end

local promoted = 0
for i = 11, #KEYS do
  local jobId = ARGV[i - 7]
  local due = rcall('ZSCORE', delayedKey, jobId)
  if due and tonumber(due) <= now then
    rcall('ZREM', delayedKey, jobId)
    local job = rcall('HMGET', KEYS[i], 'status', 'attempts', 'entry', 'lane', 'tenant', 'work', 'weight')
    if job[1] == 'queued' and (not job[3] or job[3] == '') then
      local entry = fairPlace(lanes[job[4]] or lanes[LANE_KEYS[1]], jobId, job[5], job[2], fairCost(job[6], job[7]),
        false, fair)
      rcall('HSET', KEYS[i], 'entry', entry, 'promoted_by', call)
      promoted = promoted + 1
    end
  elseif not due and call ~= '' and rcall('HGET', KEYS[i], 'promoted_by') == call then
    promoted = promoted + 1
  end
end
for _, lane in pairs(lanes) do
  fairFlush(lane)
end
return promoted
