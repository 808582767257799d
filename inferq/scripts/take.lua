--[[
  A worker's non-blocking read of new entries across the lanes, in one round trip: the reads its lane share plans
  (inferq.lanes: the takes owed to the shared lanes first, then every lane in priority order), each XREADGROUP
  asking only for the slots still free, as the worker would make them one by one. Nothing is started here: the
  worker starts what it took (start.lua) with the job records' keys, which only the entries name.
  Safe to resend (G9): the caller says, per lane, the last entry it knows it was delivered there; entries this
  consumer holds beyond those (read by a copy whose answer never arrived) are answered again instead of new ones,
  so a resent copy answers the same and takes nothing more, and a read whose answer was lost is recovered by the
  next one instead of waiting to be reclaimed.

  KEYS[1] stream of the normal lane
  KEYS[2] stream of the high lane
  KEYS[3] stream of the low lane

  ARGV[1] consumer (worker id)
  ARGV[2] count: the free slots
  ARGV[3..5] per lane, in KEYS order: the last entry id the caller was delivered from it ("0-0" for none yet)
  ARGV[6..] the plan, two per read: the lane's position in KEYS, and how many it may take (0: every slot still
            free; a lane already found short by an earlier read of the plan is then skipped)

  Returns a flat list, three per entry, grouped by lane in KEYS order and by entry id within a lane: the lane's
  position in KEYS, the entry id, the job id ("" when the entry's content is gone: it was deleted after it was
  added). Entries answered again may number more than count (a lost blocking read took up to count per lane): the
  caller starts count of them, and the next call answers the rest again.
]]
local rcall = redis.call
local consumer, count = ARGV[1], tonumber(ARGV[2])

local function jobOf(fields)
  if fields then
    for f = 1, #fields, 2 do
      if fields[f] == 'job' then
        return fields[f + 1]
      end
    end
  end
  return ''
end

local function entriesOf(reply, lane, out)
  if not reply then
    return 0
  end
  local entries = reply[1][2]
  for _, entry in ipairs(entries) do
    out[#out + 1] = lane
    out[#out + 1] = entry[1]
    out[#out + 1] = jobOf(entry[2])
  end
  return #entries
end

-- held beyond what the caller knows: a copy of this call ran, or an answer was lost; answer those again, found by
-- XPENDING, which changes nothing (a history read through XREADGROUP would count a delivery)
local held = {}
for lane = 1, #KEYS do
  local pending = rcall('XPENDING', KEYS[lane], GROUP, '(' .. ARGV[2 + lane], '+', count, consumer)
  for _, p in ipairs(pending) do
    local found = rcall('XRANGE', KEYS[lane], p[1], p[1])
    held[#held + 1] = lane
    held[#held + 1] = p[1]
    held[#held + 1] = found[1] and jobOf(found[1][2]) or ''
  end
end
if #held > 0 then
  return held
end

local byLane, short = {{}, {}, {}}, {}
local taken = 0
for step = 6, #ARGV - 1, 2 do
  local free = count - taken
  if free <= 0 then
    break
  end
  local lane, wanted = tonumber(ARGV[step]), tonumber(ARGV[step + 1])
  if not (wanted == 0 and short[lane]) then
    local ask = wanted == 0 and free or math.min(wanted, free)
    local got = entriesOf(rcall('XREADGROUP', 'GROUP', GROUP, consumer, 'COUNT', ask, 'STREAMS', KEYS[lane], '>'),
      lane, byLane[lane])
    if got < ask then
      short[lane] = true
    end
    taken = taken + got
  end
end
local out = {}
for lane = 1, #KEYS do
  for _, value in ipairs(byLane[lane]) do
    out[#out + 1] = value
  end
end
return out
