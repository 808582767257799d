--[[
  The checks that open every write ending a delivery (finish, retry, release), in this order:
    the job exists                  else the entry is acknowledged: {CODE_NOT_FOUND}
    the call is not a resend (G9)   else the reply the first run recorded
    the job is not terminal yet     else the entry is acknowledged: {CODE_TERMINAL, status}; with countLate a late
                                    result, counted (duplicate_results) and recorded for a resend
    the caller holds the delivery   (the job's live entry and lease) else {CODE_STALE_OWNER}, counted
                                    (stale_writes), recorded, nothing else changed
  job: the reply of HMGET jobKey 'id', 'status', 'entry', 'lease', 'settled', 'refused' (more fields may follow).
  Returns the reply to give, or nil when the caller may write. Needs the ackEntry and replay includes before it.
]]
local function settleGuard(streamKey, statsKey, jobKey, entryId, lease, call, job, countLate)
  local jobId, status, entry = job[1], job[2], job[3]
  if not jobId then
    ackEntry(streamKey, entryId)
    return {CODE_NOT_FOUND}
  end
  local again = replayed(jobKey, 'settled', job[5], call) or replayed(jobKey, 'refused', job[6], call)
  if again then
    return again
  end
  if TERMINAL[status] then
    ackEntry(streamKey, entryId)
    if not countLate then
      return {CODE_TERMINAL, status}
    end
    rcall('HINCRBY', statsKey, 'duplicate_results', 1)
    return remember(jobKey, 'refused', call, {CODE_TERMINAL, status})
  end
  if entry ~= entryId or job[4] ~= lease or lease == '' then
    rcall('HINCRBY', statsKey, 'stale_writes', 1)
    return remember(jobKey, 'refused', call, {CODE_STALE_OWNER})
  end
  return nil
end
