--[[
  Count one call of the mock backend, once per call token (test instrumentation; the mock is described in docs/api.md).

  KEYS[1]  inferq:{Q}:mock:calls   hash: job id -> calls
  KEYS[2]  inferq:{Q}:mock:calls:<token>   string: this call was counted (expires after an hour)
  ARGV[1]  job id

  Returns the job's count after this call. Safe to run twice (a resend after a timeout): the second run finds the
  token, changes nothing and answers the same count, so the count says how often the model was really called.
]]
local rcall = redis.call
local callsKey = KEYS[1]
local tokenKey = KEYS[2]
local jobId = ARGV[1]

if rcall('SET', tokenKey, '1', 'NX', 'EX', 3600) then
  return rcall('HINCRBY', callsKey, jobId, 1)
end
return tonumber(rcall('HGET', callsKey, jobId) or '0')
