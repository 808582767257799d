--[[
  Fair admission (G10) on demand: move jobs waiting for admission into a lane's stream (includes/fairAdmit: lowest
  virtual start tag first). Workers keep what each lane's stream held while its jobs wait (start.lua admits as many
  as it started of the entries that were there, fairRemove what it removes), so the streams stay short and a worker
  blocked on them wakes whenever jobs wait; two callers ask for more:
  - a worker whose read of a lane came back short with entries admission had added (field fair): it admits what
    it still has slots for and reads the lane again, in one round trip, so a lane whose jobs wait is read as full
    as its waiting jobs make it, before any lower lane (lanes keep their order and starvation bound);
  - the maintenance sweeps (the workers' and the scaler's, Consumer.promote): each lane whose jobs wait gets
    FAIR_BUFFER entries in its stream if it holds fewer not yet read, whatever took the entries admitted before (a
    worker that died between its read and its start): no job waits behind an empty stream for longer than a sweep.
  Safe to resend (G9): a sweep brings the streams up to a level, so a copy admits nothing; a worker's admission
  records its call token (field :call of the lane's tags), and a copy that finds it there admits nothing. It
  answers nothing either way (the stream holds what it admitted).

  KEYS[1..9] three per lane, in LANE_KEYS order (keys.fair_lanes): stream, waiting jobs, tags

  ARGV[1] the jobs to admit (a worker's slots still free); 0: a maintenance sweep of every lane
  ARGV[2] call token (random, one per call; "" for a sweep)
  ARGV[3] the lane's name (absent for a sweep)

  Returns nothing
]]
local rcall = redis.call

--- @include "fairLane"
--- @include "undelivered"
--- @include "fairAdmit"

local n = tonumber(ARGV[1])
if n == 0 then
  for i = 1, #LANE_KEYS do
    local lane = fairLane(KEYS[3 * i - 2], 3 * i - 1)
    if rcall('EXISTS', lane.jobs) == 1 and undelivered(lane) < FAIR_BUFFER then
      fairAdmit(lane, FAIR_BUFFER - lane.undelivered)
    end
  end
  return
end
for i, name in ipairs(LANE_KEYS) do
  if name == ARGV[3] then
    local lane = fairLane(KEYS[3 * i - 2], 3 * i - 1)
    if rcall('HGET', lane.tags, ':call') ~= ARGV[2] then  -- else a resent copy
      fairAdmit(lane, n)
      rcall('HSET', lane.tags, ':call', ARGV[2])
    end
  end
end
