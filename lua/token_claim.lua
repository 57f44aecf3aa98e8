-- token_claim.lua: one-time use. Marks the token used before the purchase is forwarded, so a
-- second purchase with it is refused even while the first is in flight; the gate releases the
-- mark (token_release.lua) when the purchase does not succeed.
--
-- Every token a user bought with is remembered until it expires, whichever tokens they hold
-- besides (a user may hold several valid ones: fail-open tokens from an outage, a queue token):
-- alternating them must not make any of them usable twice.
--
-- KEYS[1] queue:{T}:token:{user}   STRING token, or its used mark (`used_mark` in prelude.lua)
--                                  for the last one claimed
-- KEYS[2] queue:{T}:used:{user}    ZSET token -> expiry (ms, Redis' clock) of each used token;
--                                  pruned of expired members here, expires with its last one
-- ARGV[1] the token presented
-- ARGV[2] seconds until the token expires (its mark lives as long)
-- returns {1, previous value of KEYS[1] or ''} when claimed, {0} when already used
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local used = used_mark(ARGV[1])
local v = redis.call('GET', KEYS[1])
if v == used or redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {0}
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl * 1000, ARGV[1])
local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[2], tonumber(last[2]))
redis.call('SET', KEYS[1], used, 'EX', ttl)
return {1, v or ''}
