-- tokens_expire.lua: counts the tokens issued through the queue that expired without a
-- purchase (the admitted buyers who did not show up), once each: the pump calls it every tick
-- it holds the target's lock, again while a call finds its bound's worth (a backlog, after
-- the pump was away, is worked off in bounded calls).
--
-- vq sends this script with lua/prelude.lua in front (now_ms).
--
-- KEYS[1] queue:{T}:unused           ZSET user -> expiry ms of a token issued and not used yet
-- KEYS[2] queue:{T}:waits            HASH target counters (tokens_expired)
-- ARGV[1] max: most tokens this call counts
-- returns the tokens found expired now (the earliest expiries first, at most ARGV[1])
local n = math.min(redis.call('ZCOUNT', KEYS[1], '-inf', now_ms()), tonumber(ARGV[1]))
if n > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
  redis.call('HINCRBY', KEYS[2], 'tokens_expired', n)
end
return n
