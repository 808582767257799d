--[[
  Let the webhook senders skip the terminal events of jobs without a webhook, unread. Every terminal transition adds
  an event, and a sender would read each one through the group (a delivery, its pending entry, its acknowledgement)
  to find that most carry no webhook. terminate counts the events of jobs with a webhook (stats field
  webhook_events). A sender that read the group to its end last time passes the count it saw then: unchanged, no
  event since carries a webhook, so the group's position moves to the stream's last entry, and the sender reads
  nothing. Changed (or no count given), nothing moves and the sender reads as usual. The check and the move are one
  step, so an event with a webhook is never skipped.
  Safe to resend (G9): a copy finds the same count and moves the position to the same place (or past events that
  came since, which carry no webhook either, by the same count).

  KEYS[1] events
  KEYS[2] stats

  ARGV[1] the webhook_events count the caller saw when it last read the group to its end ("" for none)

  Returns {skipped, count}: skipped 1 when the position moved (nothing to read), 0 when the caller must read;
  count, the webhook_events count now.
]]
local rcall = redis.call
local eventsKey, statsKey = KEYS[1], KEYS[2]
local count = rcall('HGET', statsKey, 'webhook_events') or '0'
if ARGV[1] ~= count then
  return {0, count}
end
local moved = redis.pcall('XGROUP', 'SETID', eventsKey, WEBHOOK_GROUP, '$')
if type(moved) == 'table' and moved.err then
  return {0, count}  -- no stream or group yet: nothing to skip
end
return {1, count}
