-- evict.lua: remove users who stopped polling, a bounded number per call so Redis never
-- blocks on a huge queue (the pump calls it in slices of `pump::EVICT_SLICE`, as often as a
-- tick allows).
--
-- KEYS[1] queue:{T}:waiting     ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat   ZSET last poll ms -> user
-- KEYS[3] queue:{T}:evicted     STRING count of evictions (churn)
-- KEYS[4] queue:{T}:departed    ZSET seq -> seq of users who left or were evicted (leave.lua)
-- KEYS[5] queue:{T}:prequeue    ZSET pre-queued users (optional): stale ones leave it too; in
--                               the frozen pre-queue they only lose their heartbeat, and
--                               sale_place.lua records their seq as departed
-- KEYS[6] queue:{T}:record      HASH the sale's record (optional, with ARGV[4]): evicted
-- ARGV[1] timeout_ms: heartbeat timeout ms
-- ARGV[2] max: max users to evict in this call
-- ARGV[3] key_ttl_s: key ttl seconds
-- ARGV[4] record_ttl_s: record ttl seconds
-- returns the number of users evicted
local now = now_ms()
local cutoff = now - tonumber(ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff, 'LIMIT', 0, tonumber(ARGV[2]))
if #stale == 0 then
  return 0
end
-- In parts, so no unpack passes Lua's limit on values (about 8000) whatever the bound is.
for from = 1, #stale, 1000 do
  local part = {}
  for i = from, math.min(from + 999, #stale) do
    part[#part + 1] = stale[i]
  end
  local seqs = redis.call('ZMSCORE', KEYS[1], unpack(part))
  local gone = {}
  for i = 1, #part do
    if seqs[i] then
      gone[#gone + 1], gone[#gone + 2] = seqs[i], seqs[i]
    end
  end
  if #gone > 0 then
    redis.call('ZADD', KEYS[4], unpack(gone))
    redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
  end
  redis.call('ZREM', KEYS[1], unpack(part))
  redis.call('ZREM', KEYS[2], unpack(part))
  if KEYS[5] then
    redis.call('ZREM', KEYS[5], unpack(part))
  end
end
redis.call('INCRBY', KEYS[3], #stale)
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
if KEYS[6] then
  record_incr(KEYS[6], tonumber(ARGV[4]), {'evicted', #stale})
end
return #stale
