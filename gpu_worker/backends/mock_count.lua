--[[
  Count calls of the mock backend (test instrumentation; the mock is described in docs/api.md). The calls a worker
  made in one turn of its event loop are counted by one run, under one token for them all: the script's fixed cost
  and the token's key are paid once per batch, not once per call.

  KEYS[1]  inferq:{Q}:mock:calls   hash: job id -> calls
  KEYS[2]  inferq:{Q}:mock:calls:<token>   string per batch: this batch was counted (expires after an hour)
  ARGV[1..]  the job id of each call of the batch

  Returns each call's job count after it. Safe to run twice (a resend after a timeout): the client resends a batch
  whole, with its token, and the second run finds the token, changes nothing and answers the counts as they stand,
  so a count says how often the model was really called.
]]
local rcall = redis.call
local callsKey = KEYS[1]
local counts = {}

if rcall('SET', KEYS[2], '1', 'NX', 'EX', 3600) then
  for i = 1, #ARGV do
    counts[i] = rcall('HINCRBY', callsKey, ARGV[i], 1)
  end
else
  local seen = rcall('HMGET', callsKey, unpack(ARGV))
  for i = 1, #ARGV do
    counts[i] = tonumber(seen[i] or '0')
  end
end
return counts
