-- evict.lua: remove users who stopped polling, a bounded amount of work per call so Redis never
-- blocks on a huge queue (the pump calls it in slices of `pump::EVICT_SLICE` users, as often as
-- a tick allows, while it answers that there is more).
--
-- Two kinds of heartbeat, two passes:
-- 1. Users without a seq (pre-queued, or frozen at the opening) have theirs in KEYS[2], a ZSET
--    by time: the stale ones are the lowest scores. A waiting user still found there (a
--    heartbeat kept before the beats existed) is not evicted from it: their heartbeat moves to
--    KEYS[5] with its time, unless they polled since.
-- 2. Users with a seq have theirs in KEYS[5] (prelude.lua's beat_tag). A sweep walks the seqs
--    from the first one still waiting (admitted users who never collect their token included),
--    at most ARGV[5] a call and at most ARGV[2] lookups of a user, and evicts each whose last
--    poll is at least the timeout old. One sweep starts per quarter of the timeout (KEYS[6],
--    "generation:next:end": it covers the seqs given when it started), once the one before it
--    is done, so a user is evicted between the timeout and about the timeout and a quarter
--    after their last poll (plus the sweep's own length), never before.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user, of users without a seq
-- KEYS[3] queue:{T}:evicted          STRING count of evictions (churn)
-- KEYS[4] queue:{T}:departed         ZSET seq -> seq of users who left or were evicted (leave.lua)
-- KEYS[5] queue:{T}:beats            STRING the heartbeats of users with a seq (prelude.lua's beat_tag)
-- KEYS[6] queue:{T}:sweep            STRING the sweep in progress: "generation:next:end"
-- KEYS[7] queue:{T}:seq              STRING the last seq given (where a sweep ends)
-- KEYS[8] queue:{T}:prequeue         ZSET pre-queued users (optional): stale ones leave it too; in
--                                    the frozen pre-queue they only lose their heartbeat, and
--                                    sale_place.lua records their seq as departed
-- KEYS[9] queue:{T}:record           HASH the sale's record (optional, with ARGV[4]): evicted
-- ARGV[1] timeout_ms: heartbeat timeout ms
-- ARGV[2] max: max users to evict (and to look up) in this call, 1000 at most
-- ARGV[3] key_ttl_s: key ttl seconds
-- ARGV[4] record_ttl_s: record ttl seconds
-- ARGV[5] sweep_seqs: the most seqs one call's sweep reads (`store::redis::slices::SWEEP_SEQS`)
-- returns {evicted, more}: more = 1 when a next call may find stale users this one left
local now = now_ms()
-- At most 1000 users a call whatever ARGV[2] says, so no unpack passes Lua's limit (about 8000
-- values).
local timeout, max, ttl = tonumber(ARGV[1]), math.min(tonumber(ARGV[2]), 1000), tonumber(ARGV[3])
local cutoff = now - timeout
local evicted, more = 0, 0
local departed = {}

-- 1. Heartbeats by time.
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff, 'WITHSCORES', 'LIMIT', 0, max)
local lookups = 0
if #stale > 0 then
  local users, at = {}, {}
  for i = 1, #stale, 2 do
    users[#users + 1], at[#at + 1] = stale[i], tonumber(stale[i + 1])
  end
  local seqs = redis.call('ZMSCORE', KEYS[1], unpack(users))
  local gone, get, moved = {}, {}, {}
  for i = 1, #users do
    if seqs[i] then
      get[#get + 1], get[#get + 2], get[#get + 3] = 'GET', BEAT.type, '#' .. seqs[i]
      moved[#moved + 1] = {seqs[i], at[i]}
    else
      gone[#gone + 1] = users[i]
    end
  end
  if #moved > 0 then
    local tags = redis.call('BITFIELD', KEYS[5], unpack(get))
    local set = {}
    for i, m in ipairs(moved) do
      if tags[i] == 0 then
        set[#set + 1], set[#set + 2], set[#set + 3], set[#set + 4] = 'SET', BEAT.type, '#' .. m[1], beat_tag(m[2])
      end
    end
    if #set > 0 then
      redis.call('BITFIELD', KEYS[5], unpack(set))
      redis.call('EXPIRE', KEYS[5], ttl)
    end
  end
  redis.call('ZREM', KEYS[2], unpack(users))
  if #gone > 0 and KEYS[8] then
    redis.call('ZREM', KEYS[8], unpack(gone))
  end
  evicted = #gone
  lookups = #users
  if #users == max then
    more = 1
  end
end

-- 2. The sweep of the users with a seq.
local every = math.max(1, math.floor(timeout / 4))
local gen = math.floor(now / every)
local st = redis.call('MGET', KEYS[6], KEYS[7])
local cur = st[1]
local sgen, nxt, last
if cur then
  local a, b, c = string.match(cur, '^(%d+):(%d+):(%d+)$')
  sgen, nxt, last = tonumber(a), tonumber(b), tonumber(c)
end
if not sgen or (nxt > last and gen > sgen) then
  local head = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  sgen, last = gen, tonumber(st[2] or '0')
  nxt = head[2] and tonumber(head[2]) or last + 1
  -- The beats live as long as the target's other keys: each sweep's start moves their expiry
  -- (admit.lua refreshes the rest every tick while anyone waits).
  redis.call('EXPIRE', KEYS[5], ttl)
end
if lookups < max and nxt <= last then
  local hi = math.min(last, nxt + tonumber(ARGV[5]) - 1)
  local w = BEAT.bytes
  local bytes = redis.call('GETRANGE', KEYS[5], w * nxt, w * hi + w - 1)
  local stop = hi
  local users, zero = {}, {}
  -- A tag is stale when the end of its slot is at or before the cutoff: its age in slots (0
  -- for now's, counted across the wrap) is at least `oldest`. A tag ahead of now (written by a
  -- node whose clock ran ahead, before a failover; more than half the wrap old) reads as now,
  -- as a heartbeat score in the future would: it ages from there.
  local wrap, slot = BEAT.wrap, math.floor(now / BEAT.ms)
  local base, oldest, half = slot % wrap + 1, slot + 1 - math.floor(cutoff / BEAT.ms), wrap / 2
  local byte = string.byte
  for k = 1, #bytes - w + 1, w do
    local b1, b2, b3, b4 = byte(bytes, k, k + 3)
    local tag = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    local age = (base - tag) % wrap
    if tag ~= 0 and age >= oldest and age <= half then
      local seq = nxt + (k - 1) / w
      if lookups >= max then
        stop = seq - 1
        break
      end
      lookups = lookups + 1
      local user = redis.call('ZRANGEBYSCORE', KEYS[1], seq, seq, 'LIMIT', 0, 1)[1]
      if user then
        users[#users + 1] = user
        departed[#departed + 1], departed[#departed + 2] = seq, seq
      end
      zero[#zero + 1] = seq
    end
  end
  if #users > 0 then
    redis.call('ZREM', KEYS[1], unpack(users))
    evicted = evicted + #users
  end
  beats_set(KEYS[5], zero, 0)
  nxt = stop + 1
end
if nxt <= last then
  more = 1
end
local sweep = sgen .. ':' .. nxt .. ':' .. last
if sweep ~= cur then
  redis.call('SET', KEYS[6], sweep, 'EX', ttl)
end
if #departed > 0 then
  redis.call('ZADD', KEYS[4], unpack(departed))
  redis.call('EXPIRE', KEYS[4], ttl)
end
if evicted > 0 then
  redis.call('INCRBY', KEYS[3], evicted)
  redis.call('EXPIRE', KEYS[3], ttl)
  if KEYS[9] then
    record_incr(KEYS[9], tonumber(ARGV[4]), {'evicted', evicted})
  end
end
return {evicted, more}
