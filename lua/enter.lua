-- enter.lua: put a user in a target's queue, or tell where they already are.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:seq              STRING counter
-- KEYS[4] queue:{T}:admitted_count   STRING admission mark
-- KEYS[5] queue:{T}:token:{user}     STRING token (or "used:<token>"), EX token ttl
-- KEYS[6] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[7] queue:{T}:entered_at       HASH user -> entry ms (wait statistics)
-- KEYS[8] queue:{T}:waits            HASH target counters (tokens_issued)
-- ARGV[1] user id
-- ARGV[2] max capacity (users waiting and not yet admitted)
-- ARGV[3] key ttl seconds (sliding)
-- ARGV[4] candidate token, stored only if the user is admitted now
-- ARGV[5] token ttl seconds
-- ARGV[6] now, epoch ms, from the calling instance's clock (heartbeat and entry time; the
--         admission tick uses Redis' own TIME in admit.lua)
-- returns {'ADMITTED', token}
--       | {'WAITING', seq, mark, ahead, batch_override_or_0}
--       | {'FULL'}
--
-- This runs for every entry at sale start, so it makes as few calls as it can: a user
-- already waiting costs 5 calls, a new one 9. Key TTLs are refreshed by admit.lua every tick while anyone
-- waits, and here by the first and every 64th new entrant (so keys written before any pump
-- runs still expire).
local user = ARGV[1]
local seq = redis.call('ZSCORE', KEYS[1], user)
local mark = tonumber(redis.call('GET', KEYS[4]) or '0')
-- For a new user, everyone waiting above the mark is ahead: the capacity count is the answer.
local ahead
if seq then
  seq = tonumber(seq)
else
  -- Not waiting: admitted before (token), or new.
  local tok = redis.call('GET', KEYS[5])
  if tok then
    -- A token marked used by the gate is still this user's token (a reuse gets 403 there).
    if string.sub(tok, 1, 5) == 'used:' then
      tok = string.sub(tok, 6)
    end
    return {'ADMITTED', tok}
  end
  ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark, '+inf')
  if ahead >= tonumber(ARGV[2]) then
    return {'FULL'}
  end
  seq = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], seq, user)
  redis.call('HSET', KEYS[7], user, ARGV[6])
  if seq % 64 == 1 then
    local ttl = tonumber(ARGV[3])
    for _, k in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[7]}) do
      redis.call('EXPIRE', k, ttl)
    end
  end
end
if seq <= mark then
  redis.call('SET', KEYS[5], ARGV[4], 'EX', tonumber(ARGV[5]))
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  redis.call('HDEL', KEYS[7], user)
  redis.call('HINCRBY', KEYS[8], 'tokens_issued', 1)
  return {'ADMITTED', ARGV[4]}
end
redis.call('ZADD', KEYS[2], ARGV[6], user)
if not ahead then
  ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark, '(' .. seq)
end
return {'WAITING', seq, mark, ahead, tonumber(redis.call('GET', KEYS[6]) or '0')}
