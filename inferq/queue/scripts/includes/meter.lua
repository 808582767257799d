--[[
  Usage metering (GET /v1/usage, docs/data-model.md): every job counted once, by the transition that ends it (after
  the checks that make a resent, stale or late copy change nothing), so no resend, failover, reclaim or duplicate
  result counts a job twice or misses one.
  The script defines METER before its includes: {hour = the hour's usage hash, month = the month's totals hash,
  hourUntil = when the hour's hash expires (unix s; '0': metering is off, nothing is read or written), monthUntil =
  when the month's does} -- both keys come in through KEYS, named by the client from the same now as the script's.
  Hour hash: field "<tenant>|<lane>|<model>" (a row; tenant and lane have no '|', the model comes last whatever it
  holds; "" in a registry's queue, which is one model's), value eight integers separated by spaces: jobs
  succeeded, failed, cancelled, expired, prompt tokens, completion tokens, run ms, GPU ms. A tenant has at most
  USAGE_ROWS rows in one hour (counted in field "#<tenant>"): past them its jobs count into model USAGE_OTHER, so no
  tenant can make the hash grow without bound.
  Month hash: fields "<tenant>|tokens" and "<tenant>|gpu_ms" (what budgets are checked against).
  meterJob adds an ended job to a tally (terminate's). A script ending many jobs whose usage its client knows
  (finish) takes their rows added up by the client instead (meterRows), and takes back what a job it did not end
  would have added (meterUnend). meterFlush writes a tally's rows: one HGET and one HSET per row, two HINCRBY per
  tenant, whatever the number of jobs, and an EXPIREAT where a row or a total is new.
]]
local METER_STATUS = {succeeded = 1, failed = 2, cancelled = 3, expired = 4}

-- what a job's record says it spent (its earlier attempts' run and GPU ms), as terminate's spent
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
  local row = rows[spent[1]]
  if not row then
    row = {0, 0, 0, 0, 0, 0, 0, 0}
    rows[spent[1]] = row
  end
  local column = METER_STATUS[status]
  row[column] = row[column] + 1
  row[5] = row[5] + (tonumber(spent[4]) or 0)
  row[6] = row[6] + (tonumber(spent[5]) or 0)
  row[7] = row[7] + (tonumber(spent[2]) or 0)
  row[8] = row[8] + (tonumber(spent[3]) or 0)
end

-- The rows ARGV[first..] holds, nine values each (row, the four status counts, prompt tokens, completion tokens,
-- run ms, GPU ms), into counts.rows; answers them by their position (1, 2, ...), as the jobs name them.
local function meterRows(counts, first, count)
  local rows, byPosition = {}, {}
  for r = 0, count - 1 do
    local b = first + 9 * r
    local row = {tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]),
      tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8])}
    rows[ARGV[b]] = row
    byPosition[r + 1] = row
  end
  counts.rows = rows
  return byPosition
end

-- A job of a row that the script did not end after all: what it added to the row is taken back.
-- spent: "run_ms gpu_ms prompt_tokens completion_tokens" of the job, as the client added them in.
local function meterUnend(row, status, spent)
  local column = METER_STATUS[status]
  row[column] = row[column] - 1
  local runMs, gpuMs, promptTokens, completionTokens = string.match(spent, '^(%d+) (%d+) (%d+) (%d+)$')
  row[5] = row[5] - tonumber(promptTokens)
  row[6] = row[6] - tonumber(completionTokens)
  row[7] = row[7] - tonumber(runMs)
  row[8] = row[8] - tonumber(gpuMs)
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
    rcall('EXPIREAT', METER.hour, METER.hourUntil)
    old = '0 0 0 0 0 0 0 0'
  end
  local sum, i = {}, 1
  for n in string.gmatch(old, '%d+') do
    sum[i] = string.format('%d', tonumber(n) + row[i])
    i = i + 1
  end
  rcall('HSET', METER.hour, field, table.concat(sum, ' '))
end

local function meterFlush(rows)
  if not rows then
    return
  end
  local months = {}
  for field, row in pairs(rows) do
    if row[1] + row[2] + row[3] + row[4] > 0 then  -- a row whose every job was taken back adds nothing
      meterAdd(field, row)
    end
    local tenant = string.match(field, '^([^|]*)|')
    local month = months[tenant] or {0, 0}
    month[1] = month[1] + row[5] + row[6]
    month[2] = month[2] + row[8]
    months[tenant] = month
  end
  for tenant, month in pairs(months) do
    for i, name in ipairs({'|tokens', '|gpu_ms'}) do
      if month[i] > 0 and rcall('HINCRBY', METER.month, tenant .. name, string.format('%d', month[i])) == month[i] then
        rcall('EXPIREAT', METER.month, METER.monthUntil)  -- a new total: the hash may be new too
      end
    end
  end
end
