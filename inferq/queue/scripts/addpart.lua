--[[
  Record one part of an open upload (the Uploads API), within the upload's bounds, in one step: parts added at the
  same time cannot pass the bounds together, and an upload record that has expired is never written again (it
  would come back without its TTL, and without its tenant).

  Each part recorded is charged to the upload's tenant, PART_BYTES in the hour openupload.lua charged the record in
  (G11): while the record lives that hour is not over, so the charge goes back with the record's. Its bytes count
  against INFERQ_TENANT_MAX_FILE_BYTES (inferq/queue/storage.py) until the upload is completed (they become the
  file's), cancelled, or its record expires (the open set holds when): parts racing each other cannot pass the bound
  together.

  KEYS[1] upload record
  KEYS[2] per-tenant bounds (keys.bounds)
  KEYS[3] the tenant's storage counts (keys.storage)
  KEYS[4] the tenant's open uploads (keys.storage_open)

  ARGV[1] the part's field (part:<part id>)
  ARGV[2] the part's size in bytes
  ARGV[3] most parts one upload holds
  ARGV[4] now (ms)
  ARGV[5] most bytes the tenant may store, its files and its open uploads' parts (0: no bound)

  Returns
    {1}             recorded (a resent copy finds its field and answers the same, changing nothing)
    {0, status}     the upload is not pending (returned); nothing changed
    {-1}            NOT_FOUND: no such upload (or it expired)
    {2, parts}      the upload holds the most parts it may; nothing changed
    {3, stored}     the part would take the parts past the upload's bytes (what they hold is returned)
    {4, stored}     the part would take the tenant past INFERQ_TENANT_MAX_FILE_BYTES (what it stores is returned)
]]
local rcall = redis.call
local uploadKey, holds, STORAGE, OPEN = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local PART_BYTES = 96
local field, size, maxParts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, maxBytes = tonumber(ARGV[4]), tonumber(ARGV[5])

--- @include "storageSweep"
--- @include "storageAdmit"

local record = rcall('HGETALL', uploadKey)
if #record == 0 then
  return {CODE_NOT_FOUND}
end
local status, declared, parts, stored, mine, tenant, hour, uploadId = nil, 0, 0, 0, nil, nil, nil, nil
for i = 1, #record, 2 do
  local name, value = record[i], record[i + 1]
  if name == 'id' then
    uploadId = value
  elseif name == 'status' then
    status = value
  elseif name == 'tenant' then
    tenant = value
  elseif name == 'held_hour' then
    hour = value
  elseif name == 'bytes' then
    declared = tonumber(value)
  elseif name == field then
    mine = value
  elseif string.sub(name, 1, 5) == 'part:' then
    parts = parts + 1
    stored = stored + tonumber(value)
  end
end
if mine then
  return {1}
end
if status ~= 'pending' then
  return {0, status or ''}
end
if parts >= maxParts then
  return {2, parts}
end
if stored + size > declared then
  return {3, stored}
end
local ok, _, held = storageAdmit(now, 0, size, 0, maxBytes, nil)
if not ok then
  return {4, held}
end
rcall('HSET', uploadKey, field, size)
if uploadId then
  rcall('HINCRBY', STORAGE, uploadId, size)
  rcall('HINCRBY', STORAGE, '#parts', size)
  rcall('ZADD', OPEN, now + math.max(rcall('PTTL', uploadKey), 0), uploadId)
end
if tenant and hour then
  rcall('HINCRBY', holds, tenant .. '|' .. hour, PART_BYTES)
  rcall('HINCRBY', holds, tenant .. '|kept', PART_BYTES)
end
return {1}
