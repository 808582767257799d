--[[
  Correct a tenant's file counts from a LIST of its files in S3 (inferq/queue/storage.py: what expired by the
  bucket's lifecycle rule, or was written or deleted by a process that died before counting it), off the request
  path. Applied only to the index's version read before the LIST: a file counted or dropped since (the LIST may
  have missed it) leaves everything as it is, and a later pass tries again. A tenant left with nothing stored and
  no upload open is forgotten (its counts and its place in the schedule).
  Safe to resend (G9): the first copy leaves the index as the LIST saw it (writing no version), so a second finds
  the same version and applies the same diff to it, a no-op; one that forgot the tenant leaves nothing counted and
  nothing listed, which a second finds and answers the same.

  KEYS[1] the tenant's storage counts (keys.storage)
  KEYS[2] the tenant's open uploads (keys.storage_open)
  KEYS[3] the recount schedule (keys.storage_due)

  ARGV[1] tenant
  ARGV[2] the index's version (#v) read before the LIST ('' when it had none)
  ARGV[3] now (ms)
  ARGV[4] the files the LIST found
  ARGV[5] their bytes
  ARGV[6] how many counted files the LIST did not find (n)
  ARGV[7..6+n] their ids
  ARGV[7+n..] id, bytes of each file the LIST found that is not counted (or counted with other bytes)

  Returns
    {1}  applied
    {0}  the index changed since the version read; nothing changed
]]
local rcall = redis.call
local STORAGE, OPEN, DUE = KEYS[1], KEYS[2], KEYS[3]
local tenant, seen, now = ARGV[1], ARGV[2], tonumber(ARGV[3])
local files, bytes, gone = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])

--- @include "storageSweep"

if rcall('EXISTS', STORAGE) == 0 and files == 0 and #ARGV == 6 + gone then
  -- nothing counted and nothing listed: what this recount leaves (or, resent, left) behind
  rcall('ZREM', DUE, tenant)
  return {1}
end
if (rcall('HGET', STORAGE, '#v') or '') ~= seen then
  return {0}
end
for i = 7, 6 + gone, 500 do  -- HDEL in slices: a long list of ids is not one huge command
  rcall('HDEL', STORAGE, unpack(ARGV, i, math.min(6 + gone, i + 499)))
end
for i = 7 + gone, #ARGV, 1000 do
  rcall('HSET', STORAGE, unpack(ARGV, i, math.min(#ARGV, i + 999)))
end
local parts = storageSweep(now)
if files == 0 and parts <= 0 and rcall('ZCARD', OPEN) == 0 then
  rcall('DEL', STORAGE)
  rcall('ZREM', DUE, tenant)
else
  rcall('HSET', STORAGE, '#files', files, '#bytes', bytes)
  rcall('ZADD', DUE, now, tenant)
end
return {1}
