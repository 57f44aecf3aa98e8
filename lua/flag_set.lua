-- flag_set.lua: change the virtual-queue.enabled flag and bump its version in one step,
-- so every instance can say which version it applied.
--
-- KEYS[1] virtual-queue:flag   HASH enabled, percent, version, target:TYPE:id
-- ARGV[1] number of field/value pairs to set (n), then n pairs, then fields to delete
-- returns the new version
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
for i = 2 + 2 * n, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
