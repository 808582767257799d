--[[
  Record the batch driver's progress through its input file together with the jobs the chunk became, once.
  The jobs were enqueued before this runs, each with the idempotency key <batch id>:<line>, so a driver that
  died before this ran enqueues the same chunk again and gets the same jobs back: no line ever has two jobs.

  KEYS[1] batch record
  KEYS[2] batch lines (line number -> job id)

  ARGV[1] the line the chunk starts at (the progress the caller read)
  ARGV[2] the line after the chunk
  ARGV[3] the byte offset after the chunk
  ARGV[4..] line number / job id pairs

  Returns
    1   advanced, or already advanced this far (a resend changes nothing and answers the same)
    0   another driver moved the batch elsewhere: the caller drops its chunk
]]
local rcall = redis.call
local batchKey, linesKey = KEYS[1], KEYS[2]
local from, to, offset = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local current = tonumber(rcall('HGET', batchKey, 'next_line') or '-1')
if current ~= from then
  if current >= to then
    return 1
  end
  return 0
end
if #ARGV > 3 then
  rcall('HSET', linesKey, unpack(ARGV, 4))
end
rcall('HSET', batchKey, 'next_line', to, 'next_offset', offset)
return 1
