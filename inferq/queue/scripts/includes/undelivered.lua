--[[
  The entries of a lane's stream that no worker has read yet: XLEN - pending (every acknowledged entry is deleted,
  so XLEN is exactly lag + pending). XINFO GROUPS tells the group's pending entries in a reply of fixed size (the
  summary form of XPENDING lists every consumer). A stream without its group counts whole. Read once per script
  call (a fairLane table keeps it; the caller adds what it adds).
]]
local function undelivered(lane)
  if lane.undelivered == nil then
    local length = rcall('XLEN', lane.stream)
    local pending = 0
    if length > 0 then
      local ok, groups = pcall(rcall, 'XINFO', 'GROUPS', lane.stream)
      if ok then
        for _, group in ipairs(groups) do
          if group[2] == GROUP then
            for i = 3, #group - 1, 2 do
              if group[i] == 'pending' then
                pending = group[i + 1]
              end
            end
          end
        end
      end
    end
    lane.undelivered = length - pending
  end
  return lane.undelivered
end
