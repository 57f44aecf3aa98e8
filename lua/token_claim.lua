-- token_claim.lua: the purchase limits. Counts one purchase against the token's limit
-- (purchases_per_admission) and the user's (purchases_per_user) before it is forwarded, and
-- marks the token used with its last purchase, so a purchase past either limit is refused
-- even while the earlier ones are in flight; the gate gives the use back (token_release.lua)
-- when the purchase does not succeed. With one purchase per admission and no per-user limit
-- (the defaults) this is one-time use, and a user's uses key and KEYS[1] are never touched.
--
-- One call carries every claim for this target (or part of it) that reached an instance while
-- its previous call was in flight (1..n claims; n ≤ 128, `coalesce::MAX_JOBS`), handled one
-- after the other, each exactly as if alone: two claims of one token in the same call are the
-- first purchase and a token used up. A claim that fails (a key of the wrong type) answers its
-- error alone and gives its place in a tick back; the others in the call are made all the same.
--
-- Every token a user bought with is remembered until it expires, whichever tokens they hold
-- besides (a user may hold several valid ones: fail-open tokens from an outage, a queue token):
-- alternating them must not make any of them usable past its limit. The token key holds the
-- mark of the last token used up, for as long as that token lives; a mark about to be replaced
-- by another token's moves into the used tokens first, with its expiry, so a user with one used
-- token (nearly all) has no used-tokens key.
--
-- KEYS[1] queue:{T}:bought           HASH user -> purchases claimed in the sale (ARGV[2] > 0
--                                    only); expires ARGV[3] s after the target's last claim,
--                                    deleted by a sale's clear (sale_control.lua)
-- KEYS[2] queue:{T}:forwarded        HASH tick -> purchases reserved (read with ARGV[4] > 0):
--                                    each purchase's first place in a tick, reserved before its
--                                    claim (`pace_reserve` in prelude.lua, as gate_pace.lua)
--                                    and given back when the claim is refused
-- KEYS[3] queue:{T}:batch_size       STRING runtime batch size (read with ARGV[4] > 0)
-- KEYS[1+3i] queue:{T}:token:{user}  STRING claim i's token, or its used mark (`used_mark` in
--                                    prelude.lua) for the last one used up
-- KEYS[2+3i] queue:{T}:used:{user}   ZSET token -> expiry (ms, Redis' clock) of the used-up
--                                    tokens whose mark the token key no longer holds; a member
--                                    past its expiry counts for nothing; expires with its last
-- KEYS[3+3i] queue:{T}:uses:{user}   HASH token -> purchases claimed with it (ARGV[1] > 1 only);
--                                    expires with its longest-lived token
-- ARGV[1] per_admission: purchases per admission (≥ 1)
-- ARGV[2] per_user: purchases per user (0 = no limit)
-- ARGV[3] key_ttl_s: key ttl seconds (queue.key_ttl_s)
-- ARGV[4] pace_tick_ms: tick length ms to reserve each purchase's place in a tick first, 0: no
--         reservation
-- ARGV[5] pace_budget: budget per tick without a runtime batch size
-- ARGV[6] pace_guard_ms: as gate_pace.lua's guard_ms
-- ARGV[7] pace_ahead: ticks ahead the gate may wait at most
-- ARGV[5+3i] token: claim i's token
-- ARGV[6+3i] ttl_s: seconds until claim i's token expires (its mark lives as long)
-- ARGV[7+3i] user: claim i's user id
-- returns four items per claim: {1, previous value of the token key or '', starts, ends} when
-- claimed, {0, '', '', ''} when the token is used up, {2, '', '', ''} when the user made their
-- purchases, {3, ms until the next tick, '', ''} when every tick is full (nothing claimed,
-- nothing reserved), {4, the error, '', ''} when the claim failed; starts and ends are ms until
-- the reserved tick starts and ends, '' without a reservation
local now = now_ms()
local perAdmission = num(ARGV[1])
local perUser = num(ARGV[2])
local keyTtl = ARGV[3]
local paceTickMs = num(ARGV[4])
-- The tick's budget, read once for the call's claims.
local paceBudget = paceTickMs > 0 and pace_budget(KEYS[3], ARGV[5])
-- Claim i (as the header numbers them, from 1), its place in a tick reserved: 1 and the token
-- key's previous value when claimed, else the refusal's code.
local function claim(i)
  local tokenKey, usedKey, usesKey = KEYS[1 + 3 * i], KEYS[2 + 3 * i], KEYS[3 + 3 * i]
  local token, ttl, user = ARGV[5 + 3 * i], ARGV[6 + 3 * i], ARGV[7 + 3 * i]
  local used = used_mark(token)
  local v = redis.call('GET', tokenKey)
  if v == used then
    return 0
  end
  local until_used = redis.call('ZSCORE', usedKey, token)
  if until_used and tonumber(until_used) > now then
    return 0
  end
  if perUser > 0 then
    if tonumber(redis.call('HGET', KEYS[1], user) or '0') >= perUser then
      return 2
    end
    redis.call('HINCRBY', KEYS[1], user, '1')
    redis.call('EXPIRE', KEYS[1], keyTtl)
  end
  if perAdmission > 1 then
    local n = redis.call('HINCRBY', usesKey, token, '1')
    local until_ms = now + num(ttl) * 1000
    if redis.call('PEXPIRETIME', usesKey) < until_ms then
      redis.call('PEXPIREAT', usesKey, until_ms)
    end
    if n < perAdmission then
      return 1, v or ''
    end
  end
  -- The key holds another token's mark: that token stays used, among the used tokens, until it
  -- expires. (A mark without an expiry, never written so, is kept a key TTL.)
  if v and v ~= stored_token(v) then
    used_mark_keep(tokenKey, v, now, num(keyTtl) * 1000)
  end
  redis.call('SET', tokenKey, used, 'EX', ttl)
  return 1, v or ''
end

local out = {}
for i = 1, (#ARGV - 7) / 3 do
  local code, previous, starts, ends = 3, '', '', ''
  local tick, a, b
  if paceTickMs > 0 then
    tick, a, b = pace_reserve(KEYS[2], paceBudget, now, paceTickMs, num(ARGV[6]), num(ARGV[7]))
  end
  if paceTickMs > 0 and not tick then
    previous = a
  else
    local ok, c, p = pcall(claim, i)
    if not ok then
      c, p = 4, type(c) == 'table' and (c.err or '?') or tostring(c)
    end
    code, previous = c, p or ''
    if code == 1 then
      starts, ends = a or '', b or ''
    elseif tick then
      -- A refused claim (or a failed one) gives its place in the tick back.
      redis.call('HINCRBY', KEYS[2], str(tick), '-1')
    end
  end
  out[#out + 1] = code
  out[#out + 1] = previous
  out[#out + 1] = starts
  out[#out + 1] = ends
end
return out
