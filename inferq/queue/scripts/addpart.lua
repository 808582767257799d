--[[
  Record one part of an open upload (the Uploads API), within the upload's bounds, in one step: parts added at the
  same time cannot pass the bounds together, and an upload record that has expired is never written again (it
  would come back without its TTL, and without its tenant).

  KEYS[1] upload record

  ARGV[1] the part's field (part:<part id>)
  ARGV[2] the part's size in bytes
  ARGV[3] most parts one upload holds

  Returns
    {1}             recorded (a resent copy finds its field and answers the same, changing nothing)
    {0, status}     the upload is not pending (returned); nothing changed
    {-1}            NOT_FOUND: no such upload (or it expired)
    {2, parts}      the upload holds the most parts it may; nothing changed
    {3, stored}     the part would take the parts past the upload's bytes (what they hold is returned)
]]
local rcall = redis.call
local uploadKey = KEYS[1]
local field, size, maxParts = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local record = rcall('HGETALL', uploadKey)
if #record == 0 then
  return {CODE_NOT_FOUND}
end
local status, declared, parts, stored, mine = nil, 0, 0, 0, nil
for i = 1, #record, 2 do
  local name, value = record[i], record[i + 1]
  if name == 'status' then
    status = value
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
rcall('HSET', uploadKey, field, size)
return {1}
