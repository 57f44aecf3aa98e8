-- token_release.lua: undo token_claim.lua after a purchase that did not succeed (non-2xx,
-- upstream down), so the buyer can try again with the same token.
--
-- KEYS[1] queue:{T}:token:{user}
-- ARGV[1] the token presented
-- ARGV[2] the value before the claim ('' = there was none)
-- returns 1 if the mark was undone, 0 if the key had changed meanwhile
if redis.call('GET', KEYS[1]) ~= 'used:' .. ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
end
return 1
