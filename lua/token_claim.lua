-- token_claim.lua: the purchase limits. Counts one purchase against the token's limit
-- (purchases_per_admission) and the user's (purchases_per_user) before it is forwarded, and
-- marks the token used with its last purchase, so a purchase past either limit is refused
-- even while the earlier ones are in flight; the gate gives the use back (token_release.lua)
-- when the purchase does not succeed. With one purchase per admission and no per-user limit
-- (the defaults) this is one-time use, and KEYS[3] and KEYS[4] are never touched.
--
-- Every token a user bought with is remembered until it expires, whichever tokens they hold
-- besides (a user may hold several valid ones: fail-open tokens from an outage, a queue token):
-- alternating them must not make any of them usable past its limit. The token key holds the
-- mark of the last token used up, for as long as that token lives; a mark about to be replaced
-- by another token's moves into KEYS[2] first, with its expiry, so a user with one used token
-- (nearly all) has no KEYS[2].
--
-- KEYS[1] queue:{T}:token:{user}   STRING token, or its used mark (`used_mark` in prelude.lua)
--                                  for the last one used up
-- KEYS[2] queue:{T}:used:{user}    ZSET token -> expiry (ms, Redis' clock) of the used-up
--                                  tokens whose mark KEYS[1] no longer holds; a member past its
--                                  expiry counts for nothing; expires with its last one
-- KEYS[3] queue:{T}:uses:{user}    HASH token -> purchases claimed with it (ARGV[3] > 1 only);
--                                  expires with its longest-lived token
-- KEYS[4] queue:{T}:bought         HASH user -> purchases claimed in the sale (ARGV[4] > 0 only);
--                                  expires ARGV[6] s after the target's last claim, deleted by
--                                  a sale's clear (sale_control.lua)
-- KEYS[5] queue:{T}:forwarded      HASH tick -> purchases reserved (optional, with ARGV[7] >
--                                  0): the purchase's first place in a tick, reserved
--                                  before the claim (`pace_reserve` in prelude.lua, as
--                                  gate_pace.lua) and given back when the claim is refused
-- KEYS[6] queue:{T}:batch_size     STRING runtime batch size (optional, as KEYS[5])
-- ARGV[1] token: the token presented
-- ARGV[2] ttl_s: seconds until the token expires (its mark lives as long)
-- ARGV[3] per_admission: purchases per admission (≥ 1)
-- ARGV[4] per_user: purchases per user (0 = no limit)
-- ARGV[5] user: the user id
-- ARGV[6] key_ttl_s: key ttl seconds (queue.key_ttl_s)
-- ARGV[7] pace_tick_ms: tick length ms to reserve the purchase's place in a tick first, 0: no
--         reservation
-- ARGV[8] pace_budget: budget per tick without a runtime batch size
-- ARGV[9] pace_guard_ms: as gate_pace.lua's guard_ms
-- ARGV[10] pace_ahead: ticks ahead the gate may wait at most
-- returns {1, previous value of KEYS[1] or ''} when claimed, {0} when the token is used up,
-- {2} when the user made their purchases; with a reservation asked, a claim's reply goes on
-- with ms until the reserved tick starts and ms until it ends, and {3, ms until the next tick}
-- means every tick is full: nothing claimed, nothing reserved
local now = now_ms()
local paceTick, starts, ends
if num(ARGV[7]) > 0 then
  paceTick, starts, ends = pace_reserve(KEYS[5], KEYS[6], now, num(ARGV[7]), ARGV[8], num(ARGV[9]), num(ARGV[10]))
  if not paceTick then
    return {3, starts}
  end
end
-- A refused claim gives its place in the tick back.
local function refused(code)
  if paceTick then
    redis.call('HINCRBY', KEYS[5], str(paceTick), '-1')
  end
  return {code}
end
-- A claim's reply.
local function claimed(previous)
  if paceTick then
    return {1, previous, starts, ends}
  end
  return {1, previous}
end
local used = used_mark(ARGV[1])
local v = redis.call('GET', KEYS[1])
if v == used then
  return refused(0)
end
local until_used = redis.call('ZSCORE', KEYS[2], ARGV[1])
if until_used and tonumber(until_used) > now then
  return refused(0)
end
local ttl = num(ARGV[2])
local perUser = num(ARGV[4])
if perUser > 0 then
  if tonumber(redis.call('HGET', KEYS[4], ARGV[5]) or '0') >= perUser then
    return refused(2)
  end
  redis.call('HINCRBY', KEYS[4], ARGV[5], '1')
  redis.call('EXPIRE', KEYS[4], ARGV[6])
end
local perAdmission = num(ARGV[3])
if perAdmission > 1 then
  local n = redis.call('HINCRBY', KEYS[3], ARGV[1], '1')
  local until_ms = now + ttl * 1000
  if redis.call('PEXPIRETIME', KEYS[3]) < until_ms then
    redis.call('PEXPIREAT', KEYS[3], until_ms)
  end
  if n < perAdmission then
    return claimed(v or '')
  end
end
-- The key holds another token's mark: that token stays used, in KEYS[2], until it expires.
-- (KEYS[2] is the key used_mark_keep names from KEYS[1]; a mark without an expiry, never
-- written so, is kept a key TTL.)
if v and v ~= stored_token(v) then
  used_mark_keep(KEYS[1], v, now, num(ARGV[6]) * 1000)
end
redis.call('SET', KEYS[1], used, 'EX', ARGV[2])
return claimed(v or '')
