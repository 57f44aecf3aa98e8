-- token_release.lua: undo token_claim.lua after a purchase that did not succeed (non-2xx,
-- upstream down), so the buyer can try again with the same token: the use goes back to the
-- token's count and the user's, and a token marked used is not any more. Only this token is
-- given back: the other tokens the user bought with stay used.
--
-- KEYS[1] queue:{T}:token:{user}
-- KEYS[2] queue:{T}:used:{user}   ZSET of used-up tokens (token_claim.lua)
-- KEYS[3] queue:{T}:uses:{user}   HASH token -> purchases claimed with it (ARGV[3] > 1 only)
-- KEYS[4] queue:{T}:bought        HASH user -> purchases claimed in the sale (ARGV[4] > 0 only)
-- ARGV[1] token: the token presented
-- ARGV[2] previous: the value of KEYS[1] before the claim ('' = there was none)
-- ARGV[3] per_admission: purchases per admission the claim counted with
-- ARGV[4] per_user: purchases per user the claim counted with
-- ARGV[5] user: the user id
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
-- A count is never taken below zero (its key expired or was cleared since the claim).
if num(ARGV[3]) > 1 and tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[3], ARGV[1], -1)
end
if num(ARGV[4]) > 0 and tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[4], ARGV[5], -1)
end
return removed
