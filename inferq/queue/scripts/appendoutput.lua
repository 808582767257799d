--[[
  Append a delta of a running job's output (the text of its first choice) to the job's output stream, where
  readers follow it (GET /v1/jobs/{id}/stream, the OpenAI front door's `stream: true`) and where a later attempt
  finds the text to continue from (the output kept across attempts: the deltas in order always spell the final
  text).
  Every entry says where it goes: p (UTF-8 bytes of the output before it), t (its text), k (the tokens of the
  output up to and including it, as the backend counted them). The kept output is the entries in order; its length
  is the last entry's p plus the bytes of its t.
  Owner check: only the holder of the delivery of a running job (the job's live entry and its lease token, set by
  start) may append; a worker whose lease was reclaimed, or whose job was started again, writes nothing.
  Safe to resend (G9): a delta whose bytes the stream already holds (p + #t <= kept) adds nothing and answers as
  the first run did. A delta that does not start where the kept output ends adds nothing either: the answer
  carries the kept length, from which the writer sends again what it has (its reply was lost, or a failover lost
  the last appends).
  The first append of a job sets the record's `out` field: a worker starting a later attempt reads the kept output
  only when it is set.
  Also answers whether cancellation was requested, so a streaming worker learns it with its next append instead
  of its next lease renewal.

  KEYS[1] job record
  KEYS[2] output stream of the job

  ARGV[1] entry id of the delivery
  ARGV[2] lease token of the delivery (from start)
  ARGV[3] position: bytes of output before this delta
  ARGV[4] text of the delta
  ARGV[5] tokens of the output up to and including this delta
  ARGV[6] most bytes the stream may keep (INFERQ_OUTPUT_MAX_BYTES)
  ARGV[7] expiry of the stream (s), set by an attempt's first append (and whenever the append starts the stream):
          the attempt's timeout plus the result TTL, so a stream that nobody closes still goes
  ARGV[8] '1' on an attempt's first append, else '0'

  Returns {code, kept bytes after the call, cancel requested (1) or not (0)}
    0                appended, or already there (a resend)
    -1 NOT_FOUND     no such job
    -4 TERMINAL      the job has ended: nothing written
    -8 STALE_OWNER   the caller does not hold a running delivery of the job: nothing written
    -10 MISPLACED    the delta does not start where the kept output ends: nothing written; send from `kept`
    -11 OUTPUT_FULL  the delta would take the stream past its most bytes: nothing written (readers take the rest
                     from the result when the job ends)
]]
local rcall = redis.call
local jobKey, outKey = KEYS[1], KEYS[2]
local entryId, lease, position, text = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]

local job = rcall('HMGET', jobKey, 'status', 'entry', 'lease', 'cancel')
local status = job[1]
if not status then
  return {CODE_NOT_FOUND, 0, 0}
end
if TERMINAL[status] then
  return {CODE_TERMINAL, 0, 0}
end
local cancel = (job[4] == '1') and 1 or 0
if status ~= 'running' or job[2] ~= entryId or job[3] ~= lease or lease == '' then
  return {CODE_STALE_OWNER, 0, cancel}
end

local kept = 0
local last = rcall('XREVRANGE', outKey, '+', '-', 'COUNT', 1)[1]
if last then
  local fields, at, said = last[2], nil, nil
  for i = 1, #fields, 2 do
    if fields[i] == 'p' then
      at = tonumber(fields[i + 1])
    elseif fields[i] == 't' then
      said = fields[i + 1]
    end
  end
  if at and said then
    kept = at + #said
  end
end

local size = #text
if position + size <= kept then
  return {0, kept, cancel}
end
if position ~= kept then
  return {CODE_MISPLACED, kept, cancel}
end
if kept + size > tonumber(ARGV[6]) then
  return {CODE_OUTPUT_FULL, kept, cancel}
end
rcall('XADD', outKey, '*', 'p', position, 't', text, 'k', ARGV[5])
if position == 0 or ARGV[8] == '1' then
  rcall('EXPIRE', outKey, ARGV[7])
  if position == 0 then
    rcall('HSET', jobKey, 'out', '1')  -- the job has output: a later attempt reads it to continue after it
  end
end
return {0, kept + size, cancel}
