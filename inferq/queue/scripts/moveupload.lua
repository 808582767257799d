--[[
  Move an open upload (the Uploads API) from one status to another, in one step: two completes, or a complete and a
  cancel, race and only one wins; an upload record that has expired is never written again (it would come back
  without its TTL). The move is recorded against the caller's token, so a resent copy answers as the first run did
  while another caller that finds the upload already moved loses (two completes never both assemble).

  KEYS[1] upload record

  ARGV[1] the status the move starts from
  ARGV[2] the new status
  ARGV[3] call token (random, one per request)

  Returns
    {1, status}   moved, or already moved by this token (a resend changes nothing and answers the same)
    {0, status}   the upload is in another status, or another caller moved it (returned); nothing changed
    {-1}          NOT_FOUND: no such upload (or it expired)
]]
local rcall = redis.call
local uploadKey = KEYS[1]
local from, to, token = ARGV[1], ARGV[2], ARGV[3]

local record = rcall('HMGET', uploadKey, 'status', 'moved_by')
local current, movedBy = record[1], record[2]
if not current then
  return {CODE_NOT_FOUND}
end
if current == to and movedBy == token then
  return {1, current}
end
if current ~= from then
  return {0, current}
end
rcall('HSET', uploadKey, 'status', to, 'moved_by', token)
return {1, to}
