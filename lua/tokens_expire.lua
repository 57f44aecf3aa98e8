-- tokens_expire.lua: counts the tokens issued through the queue that expired without a
-- purchase (the admitted buyers who did not show up), once each: the pump calls it every tick
-- it holds the target's lock.
--
-- vq sends this script with lua/prelude.lua in front (now_ms).
--
-- KEYS[1] queue:{T}:unused           ZSET user -> expiry ms of a token issued and not used yet
-- KEYS[2] queue:{T}:waits            HASH target counters (tokens_expired)
-- returns the tokens found expired now
local n = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms())
if n > 0 then
  redis.call('HINCRBY', KEYS[2], 'tokens_expired', n)
end
return n
