-- token_claim.lua: best-effort one-time use. Marks the token used before the purchase is
-- forwarded, so a second purchase with it is refused even while the first is in flight; the
-- gate releases the mark (token_release.lua) when the purchase does not succeed.
--
-- KEYS[1] queue:{T}:token:{user}   STRING token, or "used:<token>" once used
-- ARGV[1] the token presented
-- ARGV[2] seconds until the token expires (the mark lives as long)
-- returns {1, previous value or ''} when claimed, {0} when already used
local used = 'used:' .. ARGV[1]
local v = redis.call('GET', KEYS[1])
if v == used then
  return {0}
end
redis.call('SET', KEYS[1], used, 'EX', tonumber(ARGV[2]))
return {1, v or ''}
