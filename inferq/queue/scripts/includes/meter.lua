--[[
  Usage metering (GET /v1/usage, docs/data-model.md): every job counted once, by the transition that ends it (after
  the checks that make a resent, stale or late copy change nothing), so no resend, failover, reclaim or duplicate
  result counts a job twice or misses one.
  The script defines METER before its includes: {hour = the hour's usage hash (KEYS, named by the client from the
  same now as the script's), hourUntil = when it expires (unix s; '0': metering is off, nothing is read or written)}.
  The hash holds a row per tenant, lane and model: field "<tenant>|<lane>|<model>" (tenant and lane have no '|',
  the model comes last whatever it holds; "" in a registry's queue, which is one model's), value eight integers
  separated by spaces: jobs succeeded, failed, cancelled, expired, prompt tokens, completion tokens, run ms, GPU ms.
  A tenant has at most USAGE_ROWS rows in one hour (counted in field "#<tenant>"): past them its jobs count into
  model USAGE_OTHER, so no tenant can make the hash grow without bound.
  A tally's rows (counts.rows: row -> its eight numbers, as a table or still as the client's string) are written by
  meterFlush: one HGET and one HSET per row whatever the number of jobs, and an EXPIREAT where a row is new. Rows
  come from meterJob (a job counted from its record) or, for a script ending many jobs whose usage its client knows
  (finish), from meterRows (the client's sums), out of which meterUnend takes a job the script did not end.
]]
local METER_STATUS = {succeeded = 1, failed = 2, cancelled = 3, expired = 4}
local METER_ROW = '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$'

local function meterNumbers(packed)
  local a, b, c, d, e, f, g, h = string.match(packed, METER_ROW)
  return {tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(e), tonumber(f), tonumber(g), tonumber(h)}
end

local function meterRow(rows, name)
  local row = rows[name]
  if type(row) == 'string' then
    row = meterNumbers(row)
    rows[name] = row
  elseif not row then
    row = {0, 0, 0, 0, 0, 0, 0, 0}
    rows[name] = row
  end
  return row
end

-- what a job's record says it spent (its attempts' run and GPU ms), as meterJob's spent
local function meterRecord(jobKey, tenant)
  local lane, model, runMs, gpuMs = unpack(rcall('HMGET', jobKey, 'lane', 'model', 'run_ms', 'gpu_ms'))
  return {(tenant or '') .. '|' .. (lane or 'normal') .. '|' .. (model or ''), runMs, gpuMs, 0, 0}
end

-- spent: {row, run ms, GPU ms, prompt tokens, completion tokens}
local function meterJob(counts, status, spent)
  local rows = counts.rows
  if not rows then
    rows = {}
    counts.rows = rows
  end
  local row = meterRow(rows, spent[1])
  local column = METER_STATUS[status]
  row[column] = row[column] + 1
  row[5] = row[5] + (tonumber(spent[4]) or 0)
  row[6] = row[6] + (tonumber(spent[5]) or 0)
  row[7] = row[7] + (tonumber(spent[2]) or 0)
  row[8] = row[8] + (tonumber(spent[3]) or 0)
end

-- The rows ARGV[first..] holds, two values each (the row, its eight sums as the client wrote them), into counts.rows;
-- answers their names by position (1, 2, ...), as the jobs name them.
local function meterRows(counts, first, count)
  local rows, names = {}, {}
  for r = 0, count - 1 do
    local name = ARGV[first + 2 * r]
    rows[name] = ARGV[first + 2 * r + 1]
    names[r + 1] = name
  end
  counts.rows = rows
  return names
end

-- A job of row `name` that the script did not end after all: what it added is taken back.
-- spent: "run_ms gpu_ms prompt_tokens completion_tokens" of the job, as the client added them in.
local function meterUnend(rows, name, status, spent)
  local row = meterRow(rows, name)
  local column = METER_STATUS[status]
  row[column] = row[column] - 1
  local runMs, gpuMs, promptTokens, completionTokens = string.match(spent, '^(%d+) (%d+) (%d+) (%d+)$')
  row[5] = row[5] - tonumber(promptTokens)
  row[6] = row[6] - tonumber(completionTokens)
  row[7] = row[7] - tonumber(runMs)
  row[8] = row[8] - tonumber(gpuMs)
end

local function meterPacked(row)
  if type(row) == 'string' then
    return row
  end
  return string.format('%d %d %d %d %d %d %d %d', unpack(row))
end

local function meterAdd(field, row)
  local old = rcall('HGET', METER.hour, field)
  if not old then
    local tenant, lane = string.match(field, '^([^|]*)|([^|]*)|')
    if rcall('HINCRBY', METER.hour, '#' .. tenant, 1) > USAGE_ROWS then
      local other = tenant .. '|' .. lane .. '|' .. USAGE_OTHER
      if other ~= field then
        return meterAdd(other, row)
      end
    end
    rcall('HSET', METER.hour, field, meterPacked(row))
    rcall('EXPIREAT', METER.hour, METER.hourUntil)
    return
  end
  local o = meterNumbers(old)
  local n = type(row) == 'string' and meterNumbers(row) or row
  rcall('HSET', METER.hour, field, string.format('%d %d %d %d %d %d %d %d', o[1] + n[1], o[2] + n[2], o[3] + n[3],
    o[4] + n[4], o[5] + n[5], o[6] + n[6], o[7] + n[7], o[8] + n[8]))
end

local function meterFlush(rows)
  if not rows then
    return
  end
  for field, row in pairs(rows) do
    -- a client's row holds a job at least; one whose every job was taken back adds nothing
    if type(row) == 'string' or row[1] + row[2] + row[3] + row[4] > 0 then
      meterAdd(field, row)
    end
  end
end
