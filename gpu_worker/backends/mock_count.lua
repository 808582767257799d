--[[
  Count calls of the mock backend, each once per call token (test instrumentation; the mock is described in
  docs/api.md). The calls a worker made in one turn of its event loop are counted by one run: the script's fixed
  cost is paid once for all of them.

  KEYS[1]     inferq:{Q}:mock:calls   hash: job id -> calls
  KEYS[2..n]  inferq:{Q}:mock:calls:<token>   string per call: this call was counted (expires after an hour)
  ARGV[1..]   the job id of each call, in the order of KEYS[2..n]

  Returns each call's job count after it. Safe to run twice (a resend after a timeout): the second run finds the
  tokens, changes nothing and answers the same counts, so a count says how often the model was really called.
]]
local rcall = redis.call
local callsKey = KEYS[1]
local counts = {}

for i = 1, #ARGV do
  if rcall('SET', KEYS[i + 1], '1', 'NX', 'EX', 3600) then
    counts[i] = rcall('HINCRBY', callsKey, ARGV[i], 1)
  else
    counts[i] = tonumber(rcall('HGET', callsKey, ARGV[i]) or '0')
  end
end
return counts
