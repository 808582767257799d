--[[
  Whether a tenant may store `files` more files and `bytes` more bytes (inferq/queue/storage.py): its files' count and
  bytes plus its open uploads' parts (less `except`, an upload whose parts are becoming a file), against
  maxFiles and maxBytes (0: no bound). Answers ok (true or false), the files stored, and the bytes stored (parts
  included, `except`'s left out), all before the addition.
  STORAGE and OPEN (the tenant's storage hash and open set) are named by the script before its includes.
]]
local function storageAdmit(now, files, bytes, maxFiles, maxBytes, except)
  local parts = storageSweep(now)
  local stored, count = unpack(rcall('HMGET', STORAGE, '#bytes', '#files'))
  stored, count = (tonumber(stored) or 0) + parts, tonumber(count) or 0
  if except then
    stored = stored - (tonumber(rcall('HGET', STORAGE, except)) or 0)
  end
  local ok = (maxFiles <= 0 or count + files <= maxFiles) and (maxBytes <= 0 or stored + bytes <= maxBytes)
  return ok, count, stored
end
