--[[
  Stop counting a file its tenant deleted (inferq/queue/storage.py), after S3's delete: a crash between the two
  leaves the file counted (the tenant refused early, never late) until the tenant deletes it again or a recount
  from S3 corrects it. The index's version becomes the call's token whether or not the file was counted (when the
  tenant has counts), so a recount that listed the file before its delete never counts it again.
  Safe to resend (G9): a file no longer counted is not taken off twice, and the version written is the same.

  KEYS[1] the tenant's storage counts (keys.storage)

  ARGV[1] file id
  ARGV[2] call token (random, one per call: the index's new version)

  Returns
    1  done
]]
local rcall = redis.call
local STORAGE = KEYS[1]
local fileId, token = ARGV[1], ARGV[2]

local bytes = tonumber(rcall('HGET', STORAGE, fileId))
if bytes then
  rcall('HDEL', STORAGE, fileId)
  rcall('HINCRBY', STORAGE, '#files', -1)
  rcall('HINCRBY', STORAGE, '#bytes', -bytes)
end
if bytes or rcall('EXISTS', STORAGE) == 1 then  -- a tenant that stores nothing gets no counts for a 404
  rcall('HSET', STORAGE, '#v', token)
end
return 1
