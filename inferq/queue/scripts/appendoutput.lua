--[[
  Append deltas of running jobs' output (the text of each one's first choice) to their output streams, where readers
  follow it (GET /v1/jobs/{id}/stream, the OpenAI front door's `stream: true`) and where a later attempt finds the
  text to continue from (the output kept across attempts: the deltas in order always spell the final text). One call
  takes the deltas of several jobs (a worker's flush, all its streaming jobs at once), each as by a call of its own.
  Every entry says where it goes: p (UTF-8 bytes of the job's output before it), t (its text), k (the tokens of the
  output up to and including it, as the backend counted them).

  Two ways to write, per delta:
  - Owner-checked (an attempt's first write, or the next after a fenced write was refused): only the holder of the
    delivery of a running job (the job's live entry and its lease token, set by start) may append; the delta is
    placed by byte position against what the stream holds (its last text entry), so a resend adds nothing and
    answers as the first run did, and a delta that does not start where the kept output ends adds nothing either:
    the answer carries the kept length, from which the writer sends again what it has (its reply was lost, or a
    failover lost the last appends). The entry's id is answered: the writer's fence for its next write. The job
    record's `out` is set (the bytes kept as of this write): a worker starting a later attempt fences and reads the
    kept output only when it is there. Also answers whether cancellation was requested.
  - Fenced (the writer's fence: the id after its last entry, and the stream's length once this is written): one
    XADD with that id, which Valkey takes only when it is above the stream's last (a later delivery's fence,
    fenceoutput.lua, and the end entry, closeoutput.lua, are above every id an earlier writer holds), then XLEN,
    which says that nothing before it was lost (a failover that lost the last appends): no read of the record. An
    id already taken by the same delta is a copy of this very write (resent): it answers as the first did and
    changes nothing. Anything else adds nothing (an entry added after a loss is deleted again at once) and answers
    FENCED: the writer sends the same delta owner-checked, which says what holds; a gone stream is not made again
    (NOMKSTREAM). A later delivery always fences before it writes, so a writer whose lease went can never add past
    it. The writer checks the most bytes itself (it sends the setting) and learns of a cancellation from its lease
    renewal (at least once a second): a fenced write reads nothing but its stream. It costs Valkey about half an
    owner-checked one (make bench ARGS="--only ST"). So a job ended by someone else than its writer (a reclaim past
    its most deliveries dead-letters it) may take its writer's fenced writes until that writer's next renewal, on a
    stream nobody closes; a job that did not succeed has no final text for them to disagree with.
  Each delta written is also published (sharded pub/sub, SPUBLISH) on the channel named as the stream's key, as
  `<entry id>\n<p>\n<k>\n<t>`: a process that follows jobs' output (OutputFeed) takes it from there, one delivery to
  its one subscribed connection, instead of a blocked XREAD woken per delta and sent again. Only what was written is
  published, so what a follower is handed is exactly what the stream holds.

  KEYS[1] the first delta's output stream when it is fenced, else its job record
  KEYS[2..n] the rest, per delta in order: owner-checked, its job record and its output stream; fenced, its output
            stream

  ARGV[1] most bytes a stream may keep (INFERQ_OUTPUT_MAX_BYTES)
  ARGV[2..] per delta, in the order of the keys, its way then its values:
            'c' (owner-checked), the entry id of the delivery, its lease token (from start), the position (bytes of
            output before this delta), the text, the tokens of the output up to and including it, and the expiry
            (s) to give the stream ('' for none: the attempt's timeout plus the result TTL, so a stream nobody
            closes still goes);
            'f' (fenced), the id to add with, the stream's length once it is added, the position, the text, the
            tokens

  Returns 0 when every delta was fenced and written (the cheapest answer), else one reply per delta, in order:
  a fenced one 0 (written) or -15 FENCED (nothing written; send it owner-checked); an owner-checked one
  {code, kept bytes after the call, cancel requested (1) or not (0), id of the entry written ('' when none), and
  with an id the stream's length}:
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

-- the bytes the stream keeps (where its last text entry ends: fences and an end entry hold no text), and that
-- entry's id
local function keptIn(outKey)
  for _, entry in ipairs(rcall('XREVRANGE', outKey, '+', '-', 'COUNT', 8)) do
    local fields = entry[2]
    if fields[1] == 'p' then
      return tonumber(fields[2]) + #fields[4], entry[1]
    end
  end
  local kept, last = 0, ''
  for _, entry in ipairs(rcall('XRANGE', outKey, '-', '+')) do  -- more than a few fences: rare
    local fields = entry[2]
    if fields[1] == 'p' then
      kept, last = tonumber(fields[2]) + #fields[4], entry[1]
    end
  end
  return kept, last
end

local function publish(outKey, id, position, tokens, text)
  rcall('SPUBLISH', outKey, id .. '\n' .. position .. '\n' .. tokens .. '\n' .. text)
end

local function fenced(outKey, fence, length, position, text, tokens)
  local written, id = pcall(rcall, 'XADD', outKey, 'NOMKSTREAM', fence, 'p', position, 't', text, 'k', tokens)
  if written and id then
    if rcall('XLEN', outKey) == tonumber(length) then
      publish(outKey, id, position, tokens, text)
      return 0
    end
    rcall('XDEL', outKey, id)  -- entries before it were lost (a failover): not after a gap
    return CODE_FENCED
  end
  if written then
    return CODE_FENCED  -- no stream any more
  end
  local mine = rcall('XRANGE', outKey, fence, fence)[1]
  if mine and mine[2][2] == position and mine[2][4] == text then
    return 0  -- a copy of a write that was made (resent): already there
  end
  return CODE_FENCED
end

local function checked(jobKey, outKey, entryId, lease, position, text, tokens, ttl)
  local job = rcall('HMGET', jobKey, 'status', 'entry', 'lease', 'cancel', 'out')
  local status = job[1]
  if not status then
    return {CODE_NOT_FOUND, 0, 0, ''}
  elseif TERMINAL[status] then
    return {CODE_TERMINAL, 0, 0, ''}
  end
  local cancel = (job[4] == '1') and 1 or 0
  if status ~= 'running' or job[2] ~= entryId or job[3] ~= lease or lease == '' then
    return {CODE_STALE_OWNER, 0, cancel, ''}
  end
  local kept, last = 0, ''
  if job[5] then
    kept, last = keptIn(outKey)
  end
  local size = #text
  position = tonumber(position)
  if position + size <= kept then
    if position + size == kept then  -- a resend answers as the first run
      return {0, kept, cancel, last, rcall('XLEN', outKey)}
    end
    return {0, kept, cancel, ''}
  elseif position ~= kept then
    return {CODE_MISPLACED, kept, cancel, ''}
  elseif kept + size > maxBytes then
    return {CODE_OUTPUT_FULL, kept, cancel, ''}
  end
  local id, length
  if job[5] then
    id = rcall('XADD', outKey, '*', 'p', position, 't', text, 'k', tokens)
    length = rcall('XLEN', outKey)
  else  -- the job's first output: whatever the stream still holds (an end entry before a redrive) goes
    id, length = rcall('XADD', outKey, 'MAXLEN', 1, '*', 'p', position, 't', text, 'k', tokens), 1
  end
  publish(outKey, id, position, tokens, text)
  rcall('HSET', jobKey, 'out', kept + size)
  if ttl ~= '' then
    rcall('EXPIRE', outKey, ttl)
  end
  return {0, kept + size, cancel, id, length}
end

local replies, all = {}, true
local k, a = 1, 2
while a <= #ARGV do
  local reply
  if ARGV[a] == 'f' then
    reply = fenced(KEYS[k], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5])
    k, a = k + 1, a + 6
  else
    reply = checked(KEYS[k], KEYS[k + 1], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
                    ARGV[a + 6])
    k, a = k + 2, a + 7
  end
  all = all and reply == 0
  replies[#replies + 1] = reply
end
if all then
  return 0
end
return replies
