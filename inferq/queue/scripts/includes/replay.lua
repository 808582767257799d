--[[
  Safe to resend (G9). A call carries a token generated once per call by the client; the first run records
  "token|reply" in a field of the job record, and a run that finds its own token there answers the recorded
  reply and changes nothing.
  The replay still rewrites the field with the same value: that write is propagated, so it moves this
  connection's replication offset past the first run's write, and a WAIT after a resent call covers the first
  run's write even when the first run went out on a connection that died.
]]
local function replayed(jobKey, field, memo, token)
  if not memo or token == '' then
    return nil
  end
  local sep = string.find(memo, '|', 1, true)
  if not sep or string.sub(memo, 1, sep - 1) ~= token then
    return nil
  end
  rcall('HSET', jobKey, field, memo)
  return cjson.decode(string.sub(memo, sep + 1))
end

local function memo(token, reply)
  return token .. '|' .. cjson.encode(reply)
end

local function remember(jobKey, field, token, reply)
  rcall('HSET', jobKey, field, memo(token, reply))
  return reply
end
