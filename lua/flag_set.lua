-- flag_set.lua: change the virtual-queue.enabled flag and bump its version in one step,
-- so every instance can say which version it applied.
--
-- KEYS[1] virtual-queue:flag   HASH enabled, percent, version, target:TYPE:id
-- ARGV[1] set_count: number of field/value pairs to set (n)
-- ARGV[2] clear_overrides: "1": delete every target:* override in the same step (the rollback),
--                          else "0"
-- ARGV[3] version_floor: lowest acceptable new version: one above the highest version an instance
--         acknowledged, so a flag written again after the hash was lost (FLUSHALL, restart
--         without persistence) never reuses a version an instance already applied
-- ARGV[4..] fields: n field/value pairs to set, then fields to delete
-- returns the new version
local n = tonumber(ARGV[1])
if ARGV[2] == '1' then
  local fields = redis.call('HKEYS', KEYS[1])
  for _, f in ipairs(fields) do
    if string.sub(f, 1, 7) == 'target:' then
      redis.call('HDEL', KEYS[1], f)
    end
  end
end
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[4 + 2 * i], ARGV[5 + 2 * i])
end
for i = 4 + 2 * n, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
local floor = tonumber(ARGV[3])
if version < floor then
  redis.call('HSET', KEYS[1], 'version', floor)
  version = floor
end
return version
