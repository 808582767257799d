--[[
  Close the output stream of a job that has ended: its text entries are dropped (the final result holds the whole
  text, and readers take what they have not read from it) and one end entry, `end` = the job's status, is added,
  which wakes every reader blocked on the stream; the stream then lingers briefly and goes. A job that has not
  ended (its attempt was retried or given back) keeps its output: the next attempt continues from it.
  The record's `out` (the bytes kept) goes with the text (a redriven job starts its output again).
  Trimmed, not deleted: the stream keeps its last id, so the end entry's id is above every id a reader was given.
  The end entry is also published on the stream's channel (`<entry id>\nend\n<status>`, see appendoutput.lua), which
  wakes the followers of the job.
  Safe to resend (G9): a stream that already ends with its end entry is left as it is; the answer is the same.

  KEYS[1] job record
  KEYS[2] output stream of the job

  ARGV[1] how long the closed stream lingers (ms)

  Returns 1 when the job has ended and its stream is closed (now or by an earlier copy), 0 when the job goes on
  or has no stream.
]]
local rcall = redis.call
local jobKey, outKey = KEYS[1], KEYS[2]

local status = rcall('HGET', jobKey, 'status')
if not status or not TERMINAL[status] then
  return 0
end
rcall('HDEL', jobKey, 'out')
local last = rcall('XREVRANGE', outKey, '+', '-', 'COUNT', 1)[1]
if not last then
  return 0
end
if last[2][1] == 'end' then
  return 1
end
rcall('XTRIM', outKey, 'MAXLEN', 0)
local id = rcall('XADD', outKey, '*', 'end', status)
rcall('SPUBLISH', outKey, id .. '\nend\n' .. status)
rcall('PEXPIRE', outKey, ARGV[1])
return 1
