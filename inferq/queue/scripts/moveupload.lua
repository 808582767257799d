--[[
  Move an open upload (the Uploads API) from one status to another, in one step: two completes, or a complete and a
  cancel, race and only one wins; an upload record that has expired is never written again (it would come back
  without its TTL). The move is recorded against the caller's token, so a resent copy answers as the first run did
  while another caller that finds the upload already moved loses (two completes never both assemble). A move to
  `cancelled` gives back the charge of the upload's parts (inferq/queue/storage.py; `completed` is
  completeupload.lua's, which counts the file in the same step).

  KEYS[1] upload record
  KEYS[2] the tenant's storage counts (keys.storage) (optional)
  KEYS[3] the tenant's open uploads (keys.storage_open) (optional)

  ARGV[1] the status the move starts from
  ARGV[2] the new status
  ARGV[3] call token (random, one per request)

  Returns
    {1, status}   moved, or already moved by this token (a resend changes nothing and answers the same)
    {0, status}   the upload is in another status, or another caller moved it (returned); nothing changed
    {-1}          NOT_FOUND: no such upload (or it expired)
]]
local rcall = redis.call
local uploadKey, STORAGE, OPEN = KEYS[1], KEYS[2], KEYS[3]
local from, to, token = ARGV[1], ARGV[2], ARGV[3]

--- @include "storageRelease"

local record = rcall('HMGET', uploadKey, 'status', 'moved_by', 'id')
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
if to == 'cancelled' and STORAGE and record[3] then
  storageRelease(record[3])
end
return {1, to}
