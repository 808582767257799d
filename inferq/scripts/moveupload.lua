--[[
  Move an open upload (the Uploads API) from one status to another, in one step: two completes, or a complete and a
  cancel, race and only one wins; an upload record that has expired is never written again (it would come back
  without its TTL).

  KEYS[1] upload record

  ARGV[1] the status the move starts from
  ARGV[2] the new status

  Returns
    {1, status}   moved, or already in the new status (a resend changes nothing and answers the same)
    {0, status}   the upload is in another status (returned); nothing changed
    {-1}          NOT_FOUND: no such upload (or it expired)
]]
local rcall = redis.call
local uploadKey = KEYS[1]
local from, to = ARGV[1], ARGV[2]

local current = rcall('HGET', uploadKey, 'status')
if not current then
  return {CODE_NOT_FOUND}
end
if current == to then
  return {1, current}
end
if current ~= from then
  return {0, current}
end
rcall('HSET', uploadKey, 'status', to)
return {1, to}
