-- admit.lua: advance the admission mark by one batch of users still waiting, at most once
-- per tick of Redis' own clock.
--
-- Two pumps that both believe they hold the lock (lock lost, pause, clock skew) still admit
-- one batch per tick: the tick number comes from TIME here, not from the caller. Users who
-- left or were evicted are not in `waiting`, so they do not use a slot.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:admitted_count   STRING admission mark
-- KEYS[3] queue:{T}:last_tick        STRING last tick advanced
-- KEYS[4] queue:{T}:batch_size       STRING runtime batch size for this target (optional)
-- KEYS[5] queue:{T}:admissions       LIST "tick:count", newest first, last 60 ticks
-- KEYS[6] queue:{T}:entered_at       HASH user -> entry ms
-- KEYS[7] queue:{T}:waits            HASH wait histogram: b:<lower bound s> -> users,
--                                    count, sum_ms, admitted (users admitted in all)
-- KEYS[8] queue:{T}:heartbeat        ZSET last poll ms -> user   (ttl refresh only)
-- KEYS[9] queue:{T}:seq              STRING counter              (ttl refresh only)
-- KEYS[10] queue:{T}:evicted         STRING evictions            (ttl refresh only)
-- KEYS[11] queue:{T}:departed        ZSET seqs of users who left or were evicted: those at
--                                    or below the new mark no longer matter and are dropped
-- ARGV[1] batch size in force when the target has none of its own
-- ARGV[2] tick length ms
-- ARGV[3] key ttl seconds
-- returns {advanced 0|1, mark, tick, admitted, batch, waits}: waits = the admitted users'
-- waits in ms, comma-separated (for the Prometheus histogram), '' when none
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tick = math.floor(now / tonumber(ARGV[2]))
local ttl = tonumber(ARGV[3])
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
local batch = tonumber(redis.call('GET', KEYS[4]) or ARGV[1])
local last = tonumber(redis.call('GET', KEYS[3]) or '-1')
if tick <= last then
  return {0, mark, tick, 0, batch, ''}
end
redis.call('SET', KEYS[3], tick, 'EX', ttl)
local front = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. mark, '+inf', 'WITHSCORES', 'LIMIT', 0, batch)
local admitted = #front / 2
local waits = {}
if admitted > 0 then
  mark = tonumber(front[#front])
  redis.call('SET', KEYS[2], mark, 'EX', ttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', mark)
  -- Wait statistics: entry -> admission, bucketed like domain::wait_bucket.
  local users = {}
  for i = 1, #front, 2 do
    users[#users + 1] = front[i]
  end
  -- In parts, so no unpack passes Lua's limit on values (about 8000) whatever the batch is.
  local sum, counted = 0, 0
  for from = 1, #users, 1000 do
    local part = {}
    for i = from, math.min(from + 999, #users) do
      part[#part + 1] = users[i]
    end
    local entered = redis.call('HMGET', KEYS[6], unpack(part))
    for i = 1, #entered do
      if entered[i] then
        local w = math.max(0, now - tonumber(entered[i]))
        local s = math.floor(w / 1000)
        local b
        if s < 120 then b = s elseif s < 600 then b = math.floor(s / 10) * 10
        elseif s < 3600 then b = math.floor(s / 60) * 60 else b = 3600 end
        redis.call('HINCRBY', KEYS[7], 'b:' .. b, 1)
        sum = sum + w
        counted = counted + 1
        waits[counted] = w
      end
    end
    redis.call('HDEL', KEYS[6], unpack(part))
  end
  redis.call('HINCRBY', KEYS[7], 'count', counted)
  redis.call('HINCRBY', KEYS[7], 'sum_ms', sum)
  redis.call('HINCRBY', KEYS[7], 'admitted', admitted)
  redis.call('EXPIRE', KEYS[7], ttl)
end
redis.call('LPUSH', KEYS[5], tick .. ':' .. admitted)
redis.call('LTRIM', KEYS[5], 0, 59)
-- The sliding TTL: while anyone waits, every tick keeps all of the target's keys alive
-- (enter and poll do not refresh them); 30 min after the queue empties they expire.
if admitted > 0 or redis.call('ZCARD', KEYS[1]) > 0 then
  for _, k in ipairs({KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]}) do
    redis.call('EXPIRE', k, ttl)
  end
else
  redis.call('EXPIRE', KEYS[5], ttl)
end
return {1, mark, tick, admitted, batch, table.concat(waits, ',')}
