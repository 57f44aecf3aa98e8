-- user_hold.lua: counts a target among the queues a user holds a place in, unless they hold
-- `max` already (queue.max_queues_per_user). A target already counted stays counted.
--
-- vq sends this script with lua/prelude.lua in front (Redis' clock, now_ms).
--
-- One key per user, in the user's own slot: a target's scripts cannot reach it, so the count
-- is kept here and checked against the targets only when it reaches its limit: vq asks each
-- target counted long enough ago for its enter to have run whether the user still holds a
-- place there, and drops the ones they left, were admitted from or evicted from.
--
-- KEYS[1] queue:user:{<user>}:queues  ZSET target (e.g. LIMITED_DROP:42) -> ms it was counted
-- ARGV[1] the target
-- ARGV[2] max: queues a user may hold at once
-- ARGV[3] the key's lifetime, seconds
-- returns {} when the target is counted (now or before), else {target, ms since counted, ...}
-- for every target counted
local now = now_ms()
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
  return {}
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  local held = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 2, #held, 2 do
    held[i] = math.max(0, now - tonumber(held[i]))
  end
  return held
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return {}
