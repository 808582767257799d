--[[
  Append deltas of running jobs' output (the text of each one's first choice) to their output streams, where readers
  follow it (GET /v1/jobs/{id}/stream, the OpenAI front door's `stream: true`) and where a later attempt finds the
  text to continue from (the output kept across attempts: the deltas in order always spell the final text). One call
  takes the deltas of several jobs (a worker's flush, all its streaming jobs at once), each as by a call of its own.
  Every entry says where it goes: p (UTF-8 bytes of the job's output before it), t (its text), k (the tokens of the
  output up to and including it, as the backend counted them). The job record's `out` holds the bytes kept (the first
  append sets it: a worker starting a later attempt reads the kept output only when it is there).
  Owner check: only the holder of the delivery of a running job (the job's live entry and its lease token, set by
  start) may append; a worker whose lease was reclaimed, or whose job was started again, writes nothing.
  Safe to resend (G9): a delta whose bytes the stream already holds (p + #t <= kept) adds nothing and answers as
  the first run did. A delta that does not start where the kept output ends adds nothing either: the answer
  carries the kept length, from which the writer sends again what it has (its reply was lost, or a failover lost
  the last appends).
  Each delta written is also published (sharded pub/sub, SPUBLISH) on the channel named as the stream's key, as
  `<entry id>\n<p>\n<k>\n<t>`: a process that follows jobs' output (OutputFeed) takes it from there, one delivery to
  its one subscribed connection, instead of a blocked XREAD woken per delta and sent again. Only what was written is
  published (a resend, a stale owner, a misplaced delta publish nothing), so what a follower is handed is exactly
  what the stream holds.
  Also answers whether cancellation was requested, so a streaming worker learns it with its next append instead
  of its next lease renewal.

  KEYS[1] the first delta's job record
  KEYS[2] the first delta's output stream
  KEYS[3..n] two per further delta, the same

  ARGV[1] most bytes a stream may keep (INFERQ_OUTPUT_MAX_BYTES)
  ARGV[2..] six per delta, in the order of the keys: entry id of the delivery, its lease token (from start), the
            position (bytes of output before this delta), the text, the tokens of the output up to and including
            it, and the expiry (s) to give the stream with an attempt's first append ('' for the others): the
            attempt's timeout plus the result TTL, so a stream nobody closes still goes

  Returns, per delta, {code, kept bytes after the call, cancel requested (1) or not (0)}
    0                appended, or already there (a resend)
    -1 NOT_FOUND     no such job
    -4 TERMINAL      the job has ended: nothing written
    -8 STALE_OWNER   the caller does not hold a running delivery of the job: nothing written
    -10 MISPLACED    the delta does not start where the kept output ends: nothing written; send from `kept`
    -11 OUTPUT_FULL  the delta would take the stream past its most bytes: nothing written (readers take the rest
                     from the result when the job ends)
]]
local rcall = redis.call
local maxBytes = tonumber(ARGV[1])

local replies = {}
for i = 0, #KEYS / 2 - 1 do
  local jobKey, outKey = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local a = 2 + 6 * i
  local entryId, lease, position, text, ttl = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2]), ARGV[a + 3], ARGV[a + 5]
  local job = rcall('HMGET', jobKey, 'status', 'entry', 'lease', 'cancel', 'out')
  local status = job[1]
  local reply
  if not status then
    reply = {CODE_NOT_FOUND, 0, 0}
  elseif TERMINAL[status] then
    reply = {CODE_TERMINAL, 0, 0}
  else
    local cancel = (job[4] == '1') and 1 or 0
    local kept = tonumber(job[5]) or 0
    local size = #text
    if status ~= 'running' or job[2] ~= entryId or job[3] ~= lease or lease == '' then
      reply = {CODE_STALE_OWNER, 0, cancel}
    elseif position + size <= kept then
      reply = {0, kept, cancel}
    elseif position ~= kept then
      reply = {CODE_MISPLACED, kept, cancel}
    elseif kept + size > maxBytes then
      reply = {CODE_OUTPUT_FULL, kept, cancel}
    else
      local id = rcall('XADD', outKey, '*', 'p', position, 't', text, 'k', ARGV[a + 4])
      rcall('SPUBLISH', outKey, id .. '\n' .. ARGV[a + 2] .. '\n' .. ARGV[a + 4] .. '\n' .. text)
      rcall('HSET', jobKey, 'out', kept + size)
      if ttl ~= '' then
        rcall('EXPIRE', outKey, ttl)
      end
      reply = {0, kept + size, cancel}
    end
  end
  replies[i + 1] = reply
end
return replies
