--[[
  A tenant's webhook signing secret: made on first use, rotated with the one it replaces kept valid for a while.
  One hash per tenant (inferq:tenant:{<tenant>}:webhook-secret, not a queue's key: one secret signs the tenant's
  webhooks from every queue), fields secret, created_at, previous, previous_expires_at.
  The caller makes the new secret (random, whsec_ form) and passes the time, so a resent copy has the same
  arguments.
  Safe to resend (G9): "ensure" changes nothing once a secret exists; "rotate" changes nothing when the given secret
  is already the current or the previous one (the first copy ran), and answers the same.

  KEYS[1] the tenant's secret hash

  ARGV[1] "ensure" (make one when there is none) or "rotate" (replace the current one)
  ARGV[2] a new secret
  ARGV[3] now, Unix seconds
  ARGV[4] rotate: how long the replaced secret stays valid, seconds (0: not at all)

  Returns {secret, created_at, previous or "", previous_expires_at or ""}.
]]
local rcall = redis.call
local key = KEYS[1]
local mode, new, now, keep = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4] or '0')
local current = rcall('HGET', key, 'secret')
if not current then
  rcall('HSET', key, 'secret', new, 'created_at', now)
elseif mode == 'rotate' and current ~= new and rcall('HGET', key, 'previous') ~= new then
  rcall('HDEL', key, 'previous', 'previous_expires_at')
  if keep > 0 then
    rcall('HSET', key, 'previous', current, 'previous_expires_at', tostring(tonumber(now) + keep))
  end
  rcall('HSET', key, 'secret', new, 'created_at', now)
end
local state = rcall('HMGET', key, 'secret', 'created_at', 'previous', 'previous_expires_at')
return {state[1], state[2], state[3] or '', state[4] or ''}
