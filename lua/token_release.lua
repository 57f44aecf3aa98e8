-- token_release.lua: undo token_claim.lua after a purchase that did not succeed (non-2xx,
-- upstream down), so the buyer can try again with the same token. Only this token is given
-- back: the other tokens the user bought with stay used.
--
-- KEYS[1] queue:{T}:token:{user}
-- KEYS[2] queue:{T}:used:{user}   ZSET of used tokens (token_claim.lua)
-- ARGV[1] the token presented
-- ARGV[2] the value of KEYS[1] before the claim ('' = there was none)
-- returns 1 if the token was marked used and is not any more, 0 otherwise
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('GET', KEYS[1]) == used_mark(ARGV[1]) then
  if ARGV[2] == '' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  end
  removed = 1
end
return removed
