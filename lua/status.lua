-- status.lua: one poll in one round trip. Refreshes the heartbeat; issues the token
-- (idempotently) and takes the user out of the queue once the mark has reached their seq.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:seq              STRING counter (ttl refresh only)
-- KEYS[4] queue:{T}:admitted_count   STRING admission mark
-- KEYS[5] queue:{T}:token:{user}     STRING token (or "used:<token>"), EX token ttl
-- KEYS[6] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[7] queue:{T}:entered_at       HASH user -> entry ms
-- KEYS[8] queue:{T}:waits            HASH target counters (tokens_issued)
-- ARGV[1] user id
-- ARGV[2] key ttl seconds (sliding)
-- ARGV[3] candidate token, stored only if the user is admitted now
-- ARGV[4] token ttl seconds
-- returns {'ADMITTED', token}
--       | {'WAITING', seq, mark, ahead, batch_override_or_0}
--       | {'NOT_IN_QUEUE'}
local user = ARGV[1]
local ttl = tonumber(ARGV[2])
local tok = redis.call('GET', KEYS[5])
if tok then
  -- A token marked used by the gate is still this user's token (a reuse gets 403 there).
  if string.sub(tok, 1, 5) == 'used:' then
    tok = string.sub(tok, 6)
  end
  return {'ADMITTED', tok}
end
local seq = redis.call('ZSCORE', KEYS[1], user)
if not seq then
  return {'NOT_IN_QUEUE'}
end
seq = tonumber(seq)
local mark = tonumber(redis.call('GET', KEYS[4]) or '0')
if seq <= mark then
  redis.call('SET', KEYS[5], ARGV[3], 'EX', tonumber(ARGV[4]))
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  redis.call('HDEL', KEYS[7], user)
  redis.call('HINCRBY', KEYS[8], 'tokens_issued', 1)
  return {'ADMITTED', ARGV[3]}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], now, user)
for i = 1, 4 do
  redis.call('EXPIRE', KEYS[i], ttl)
end
redis.call('EXPIRE', KEYS[7], ttl)
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark, '(' .. seq)
return {'WAITING', seq, mark, ahead, tonumber(redis.call('GET', KEYS[6]) or '0')}
