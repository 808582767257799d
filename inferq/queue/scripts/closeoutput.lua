--[[
  Close the output streams of jobs that have ended: each one's entries are dropped (the final result holds the whole
  text, and readers take what they have not read from it) and one end entry, `end` = the job's status, is added,
  which wakes every reader blocked on the stream; the stream then lingers briefly and goes. A job that has not
  ended (its attempt was retried or given back) keeps its output: the next attempt continues from it. One call
  takes several jobs (a worker's closes of one turn), each as by a call of its own.
  The record's `out` (the job has output) goes with the text (a redriven job starts its output again): a stream is
  closed once, by whoever finds `out` on the ended job.
  Trimmed, not deleted: the stream keeps its last id, so the end entry's id is above every id a reader was given
  and every fence a writer holds (appendoutput.lua: a fenced append after it adds nothing).
  The end entry is also published on the stream's channel (`<entry id>\nend\n<status>`, see appendoutput.lua), which
  wakes the followers of the job.
  Safe to resend (G9): `out` is gone after the first run, and a copy finds nothing to do; the answer is the same.

  KEYS[1] the first job's record
  KEYS[2] the first job's output stream
  KEYS[3..n] two per further job, the same

  ARGV[1] how long the closed stream lingers (ms)

  Returns, per job, 1 when the job has ended (its stream closed, now or by an earlier copy, or it has none), 0 when
  the job goes on or is unknown.
]]
local rcall = redis.call

local replies = {}
for i = 0, #KEYS / 2 - 1 do
  local jobKey, outKey = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local job = rcall('HMGET', jobKey, 'status', 'out')
  local status = job[1]
  if not status or not TERMINAL[status] then
    replies[i + 1] = 0
  else
    if job[2] then
      rcall('HDEL', jobKey, 'out')
      local id = rcall('XADD', outKey, 'MAXLEN', 1, '*', 'end', status)  -- the end entry alone stays
      rcall('SPUBLISH', outKey, id .. '\nend\n' .. status)
      rcall('PEXPIRE', outKey, ARGV[1])
    end
    replies[i + 1] = 1
  end
end
return replies
