--[[
  Move a batch from one of the statuses a caller expects to a new one, setting more fields with it, in one step:
  a cancel and the driver's own moves can race, and only one of them may win.

  KEYS[1] batch record

  ARGV[1] the statuses the move starts from, comma-separated
  ARGV[2] the new status
  ARGV[3..] more fields to set, as name/value pairs

  Returns
    {1, status}   moved, or already in the new status (a resend changes nothing and answers the same)
    {0, status}   the batch is in another status (returned); nothing changed
    {-1}          NOT_FOUND
]]
local rcall = redis.call
local batchKey = KEYS[1]
local from, to = ARGV[1], ARGV[2]

local current = rcall('HGET', batchKey, 'status')
if not current then
  return {CODE_NOT_FOUND}
end
if current == to then
  return {1, current}
end
if not string.find(',' .. from .. ',', ',' .. current .. ',', 1, true) then
  return {0, current}
end
rcall('HSET', batchKey, 'status', to, unpack(ARGV, 3))
return {1, to}
