--[[
  Give back a long-poll slot that takewait.lua handed out, as the wait ends (however it ends).
  Safe to resend (G9): a slot given back, or lapsed, is not there to remove twice, and the answer does not say
  which it was.

  KEYS[1] the tenant's slots (sorted set: slot token -> when it lapses, ms)

  ARGV[1] slot token

  Returns 1: the slot is free
]]
local rcall = redis.call
local slotsKey, token = KEYS[1], ARGV[1]

rcall('ZREM', slotsKey, token)
return 1
