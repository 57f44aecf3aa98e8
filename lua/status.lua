-- status.lua: one poll in one round trip. Refreshes the heartbeat; issues the token
-- (idempotently) and takes the user out of the queue once the mark has reached their seq.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:admitted_count   STRING admission mark
-- KEYS[4] queue:{T}:token:{user}     STRING token (or "used:<token>"), EX token ttl
-- KEYS[5] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[6] queue:{T}:entered_at       HASH user -> entry ms
-- KEYS[7] queue:{T}:waits            HASH target counters (tokens_issued)
-- ARGV[1] user id
-- ARGV[2] candidate token, stored only if the user is admitted now
-- ARGV[3] token ttl seconds
-- ARGV[4] now, epoch ms, from the calling instance's clock (the heartbeat)
-- returns {'ADMITTED', token}
--       | {'WAITING', seq, mark, ahead, batch_override_or_0}
--       | {'NOT_IN_QUEUE'}
--
-- Polls are most of the traffic (every waiting user, every 2-3 s): a waiting user costs 5
-- calls and no TTL refresh (admit.lua refreshes the target's keys every tick while anyone
-- waits).
local user = ARGV[1]
local seq = redis.call('ZSCORE', KEYS[1], user)
if not seq then
  local tok = redis.call('GET', KEYS[4])
  if not tok then
    return {'NOT_IN_QUEUE'}
  end
  -- A token marked used by the gate is still this user's token (a reuse gets 403 there).
  if string.sub(tok, 1, 5) == 'used:' then
    tok = string.sub(tok, 6)
  end
  return {'ADMITTED', tok}
end
seq = tonumber(seq)
local mark = tonumber(redis.call('GET', KEYS[3]) or '0')
if seq <= mark then
  redis.call('SET', KEYS[4], ARGV[2], 'EX', tonumber(ARGV[3]))
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  redis.call('HDEL', KEYS[6], user)
  redis.call('HINCRBY', KEYS[7], 'tokens_issued', 1)
  return {'ADMITTED', ARGV[2]}
end
redis.call('ZADD', KEYS[2], ARGV[4], user)
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark, '(' .. seq)
return {'WAITING', seq, mark, ahead, tonumber(redis.call('GET', KEYS[5]) or '0')}
