--[[
  Count a file a tenant now stores (inferq/queue/storage.py): its bytes under its id, the totals, the index's version
  (the call's token: a recount from S3 applies only to the version it read, and a resent copy writes the same one),
  and the tenant among those recounted (first: as of now).
  False, changing nothing, when the file is counted already (a resent copy, or a recount that saw it first).
  STORAGE (the tenant's storage hash) and DUE (the recount schedule) are named by the script before its includes.
]]
local function storageCount(tenant, fileId, bytes, now, token)
  if rcall('HSETNX', STORAGE, fileId, bytes) == 0 then
    return false
  end
  rcall('HINCRBY', STORAGE, '#files', 1)
  rcall('HINCRBY', STORAGE, '#bytes', bytes)
  rcall('HSET', STORAGE, '#v', token)
  rcall('ZADD', DUE, 'NX', now, tenant)
  return true
end
