-- issue.lua: store the token of a user enter.lua or status.lua found admitted (seq at or below
-- the mark) and take them out of the queue; idempotent: a user whose token is already stored
-- gets that one back (two polls of one user racing, on one instance or two).
--
-- vq sends this script with lua/prelude.lua in front: the reply codes and the helpers it
-- calls live there.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:admitted_count   STRING admission mark
-- KEYS[4] queue:{T}:waits            HASH target counters (tokens_issued)
-- KEYS[5] queue:{T}:record          HASH the sale's record: ti (tokens issued), ti_last (ms)
-- KEYS[6] queue:{T}:unused           ZSET user -> expiry ms of a token issued and not used yet
--                                    (a purchase takes it out; tokens_expire.lua counts the rest)
-- KEYS[7] queue:{T}:token:{user}     STRING token (or "used:<token>"), EX token ttl
-- KEYS[8] queue:holds:{h0}:<g-1>     HASH the queues each user holds (optional, with ARGV[5]): on
--                                    a single server the target is dropped from the user's
-- KEYS[9] queue:holds:{h0}:<g>       field when their token is stored now (`hold_drop` in
-- KEYS[10] queue:holds:{h0}:<g+1>    prelude.lua)
-- ARGV[1] user: user id
-- ARGV[2] token: the token signed by the caller
-- ARGV[3] token_ttl_s: token ttl seconds
-- ARGV[4] record_ttl_s: record ttl seconds
-- ARGV[5] hold_target: the target as the holds name it (the whole target), or '' for no drop
-- ARGV[6] hold_generation: g, the generation of KEYS[9]
-- ARGV[7] hold_generation_ms: a generation's length, ms
-- returns the shape of a one-user status.lua reply: {mark, 0, code, a, 0, 0, 0} with
--   ADMITTED      a = the caller's token if stored now, else the stored one
--   NOT_IN_QUEUE  neither waiting nor holding a token
local seq = redis.call('ZSCORE', KEYS[1], ARGV[1])
local st = redis.call('MGET', KEYS[3], KEYS[7])
local mark, tok = num(st[1] or '0'), st[2]
if seq and tonumber(seq) <= mark then
  local k = {waiting = KEYS[1], heartbeat = KEYS[2], waits = KEYS[4], record = KEYS[5], unused = KEYS[6]}
  local hold = ARGV[5] ~= '' and {{KEYS[8], KEYS[9], KEYS[10]}, ARGV[5], num(ARGV[6]), num(ARGV[7])} or nil
  issue_tokens(k, {{ARGV[1], ARGV[2], KEYS[7], tok or false}}, ARGV[3], ARGV[4], now_ms(), hold)
  return {mark, 0, ADMITTED, ARGV[2], 0, 0, 0}
end
if not tok then
  return {mark, 0, NOT_IN_QUEUE, 0, 0, 0, 0}
end
return {mark, 0, ADMITTED, stored_token(tok), 0, 0, 0}
