--[[
  Complete an upload whose parts were assembled into a file (the Uploads API; inferq/queue/storage.py): in one step
  the file is counted within INFERQ_TENANT_MAX_FILES and INFERQ_TENANT_MAX_FILE_BYTES (its parts' charge is its
  bytes: not counted twice), the parts' charge is given back, and the upload moves from `completing` to
  `completed` for the request that moved it to `completing` (its token). Refused at a bound, nothing changes: the
  caller removes the file and moves the upload back to `pending`.
  Safe to resend (G9): a file counted already answers as completed and changes nothing.

  KEYS[1] the upload's record
  KEYS[2] the tenant's storage counts (keys.storage)
  KEYS[3] the tenant's open uploads (keys.storage_open)
  KEYS[4] the recount schedule (keys.storage_due)

  ARGV[1] tenant
  ARGV[2] the file's id
  ARGV[3] the file's bytes
  ARGV[4] now (ms)
  ARGV[5] most files the tenant may store (0: no bound)
  ARGV[6] most bytes the tenant may store (0: no bound)
  ARGV[7] the token the upload was moved to `completing` with (one per request: also the index's new version)

  Returns
    {1}                 completed (or completed already by this call)
    {0, files, stored}  refused at a bound; nothing changed
    {2, status}         the upload is not `completing` for this token; nothing changed
    {-1}                NOT_FOUND: no such upload (it expired)
]]
local rcall = redis.call
local uploadKey, STORAGE, OPEN, DUE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tenant, fileId, bytes, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local maxFiles, maxBytes, token = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]

--- @include "storageSweep"
--- @include "storageAdmit"
--- @include "storageCount"
--- @include "storageRelease"

if rcall('HEXISTS', STORAGE, fileId) == 1 then
  return {1}
end
local status, movedBy, uploadId = unpack(rcall('HMGET', uploadKey, 'status', 'moved_by', 'id'))
if not status then
  return {CODE_NOT_FOUND}
end
if status ~= 'completing' or movedBy ~= token then
  return {2, status}
end
local ok, files, stored = storageAdmit(now, 1, bytes, maxFiles, maxBytes, uploadId)
if not ok then
  return {0, files, stored}
end
storageRelease(uploadId)
storageCount(tenant, fileId, bytes, now, token)
rcall('HSET', uploadKey, 'status', 'completed')
return {1}
