--[[
  Give back the charge of one upload's parts (inferq/queue/storage.py): it was cancelled, or its parts became a file.
  Nothing when it has none charged (a resent copy, or one given back by storageSweep).
  STORAGE and OPEN (the tenant's storage hash and open set) are named by the script before its includes.
]]
local function storageRelease(uploadId)
  local bytes = tonumber(rcall('HGET', STORAGE, uploadId))
  if bytes then
    rcall('HDEL', STORAGE, uploadId)
    rcall('ZREM', OPEN, uploadId)
    rcall('HINCRBY', STORAGE, '#parts', -bytes)
  end
end
