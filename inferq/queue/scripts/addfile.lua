--[[
  Count a file its tenant has just stored (inferq/queue/storage.py: the file quotas from counters, never from an S3
  LIST), within INFERQ_TENANT_MAX_FILES and INFERQ_TENANT_MAX_FILE_BYTES in one step: files written at the same time
  cannot pass a bound together (the one refused is removed by its caller). The batch driver's output files pass no
  bounds (0): they count, and are never refused.
  Safe to resend (G9): a file counted already (a resent copy; a recount that listed it first) answers as counted
  and changes nothing.

  KEYS[1] the tenant's storage counts (keys.storage)
  KEYS[2] the tenant's open uploads (keys.storage_open)
  KEYS[3] the recount schedule (keys.storage_due)

  ARGV[1] tenant
  ARGV[2] file id
  ARGV[3] the file's bytes
  ARGV[4] now (ms)
  ARGV[5] most files the tenant may store (0: no bound)
  ARGV[6] most bytes the tenant may store, its open uploads' parts included (0: no bound)
  ARGV[7] call token (random, one per call: the index's new version)

  Returns
    {1}                 counted (or counted already)
    {0, files, stored}  refused at a bound: nothing written; what the tenant stores
]]
local rcall = redis.call
local STORAGE, OPEN, DUE = KEYS[1], KEYS[2], KEYS[3]
local tenant, fileId, bytes, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local maxFiles, maxBytes, token = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]

--- @include "storageSweep"
--- @include "storageAdmit"
--- @include "storageCount"

if rcall('HEXISTS', STORAGE, fileId) == 1 then
  return {1}
end
local ok, files, stored = storageAdmit(now, 1, bytes, maxFiles, maxBytes, nil)
if not ok then
  return {0, files, stored}
end
storageCount(tenant, fileId, bytes, now, token)
return {1}
