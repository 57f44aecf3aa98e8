-- status.lua: polls in one round trip. Refreshes each waiting user's heartbeat and tells
-- where they are; once the mark has reached a user's seq, stores the token the caller signed
-- for them (`issue_tokens` in prelude.lua, as issue.lua does; the call's admitted users share
-- its writes) and takes them out of the queue, so the poll that finds a user admitted hands
-- them their token in the same call.
--
-- One call carries every poll for this target that reached an instance while its previous
-- call was in flight (1..n users; n ≤ 128, `coalesce::MAX_JOBS`, well inside Lua's limit of
-- about 8000 unpacked values), handled one after the other, each exactly as if alone.
--
-- vq sends this script with lua/prelude.lua in front: the reply codes and the helpers it
-- calls live there.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user, of users without a seq (pre-queued)
-- KEYS[3] queue:{T}:admitted_count   STRING admission mark
-- KEYS[4] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[5] queue:{T}:departed         ZSET seqs of users who left or were evicted above the mark
-- KEYS[6] queue:{T}:beats            STRING the heartbeats of users with a seq (prelude.lua's
--                                    beat_tag)
-- KEYS[7] queue:{T}:waits            HASH target counters (tokens_issued)
-- KEYS[8] queue:{T}:record           HASH the sale's record: ti (tokens issued), ti_last (ms)
-- KEYS[9] queue:{T}:unused           ZSET user -> expiry ms of a token issued and not used yet
-- KEYS[9+i] queue:{T}:token:{user i} STRING token (or "used:<token>"), EX token ttl
-- KEYS[10+n] queue:{T}:sale          HASH the sale (optional, with the next two)
-- KEYS[11+n] queue:{T}:prequeue      ZSET pre-queued users until the opening
-- KEYS[12+n] queue:{T}:opening       ZSET the frozen pre-queue until its order is written
-- KEYS[13+n] queue:holds:{h0}:<g-1>  HASH the queues each user holds (optional, after the sale's
-- KEYS[14+n] queue:holds:{h0}:<g>    keys, with ARGV[5]): on a single server the target leaves
-- KEYS[15+n] queue:holds:{h0}:<g+1>  the user's when their token is stored (`hold_drop`)
-- ARGV[1] mark_seen: fence: the highest admission mark this instance has seen (see `fence` in
--                    prelude.lua)
-- ARGV[2] key_ttl_s: key ttl seconds (of the mark, when the fence raises it)
-- ARGV[3] token_ttl_s: token ttl seconds
-- ARGV[4] record_ttl_s: record ttl seconds
-- ARGV[5] hold_target: the target as the holds name it (the whole target), or '' for no drop
-- ARGV[6] hold_generation: g, the generation of KEYS[14+n]
-- ARGV[7] hold_generation_ms: a generation's length, ms
-- ARGV[7+i] user: user i (heartbeats are Redis' TIME)
-- ARGV[7+n+i] token: the token signed for user i, stored if this call finds them admitted
-- returns {mark, batch_override_or_0, then per user i: code, a, b}, the codes named in prelude.lua
--   WAITING       a = seq, b = users ahead still waiting
--   ADMITTED      a = token: issued before, or the caller's, stored now (b = 1)
--   NOT_IN_QUEUE
--   PRE_QUEUE     pre-queued (heartbeat refreshed)
--   CLOSED        the sale is closed and the user was not admitted
-- then, when the sale keys are given, the sale as in enter.lua: phase, opens_at, prequeue_from,
-- paused, message (phase 3 = the opening time has passed and the pre-queue may not be frozen
-- yet: this script never freezes it, enter.lua and admit.lua do)
-- then always: 0 (enter.lua's seq counter; not read here), fenced (2: the mark was raised)
--
-- Polls are most of the traffic (every waiting user, every 2-3 s), so the calls are per call,
-- not per user; no TTL refresh (admit.lua refreshes the target's keys every tick while anyone
-- waits).
local U = 7
local n = (#ARGV - U) / 2
local st = redis.call('MGET', KEYS[3], KEYS[4])
local mark, markRaised = fence(KEYS[3], num(st[1] or '0'), num(ARGV[1]), ARGV[1], ARGV[2])
local batch = num(st[2] or '0')
local now = now_ms()
local saleKey, preKey, openKey = KEYS[10 + n], KEYS[11 + n], KEYS[12 + n]
local phase, sale = sale_phase(saleKey, now)
local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, U + 1, U + n))
-- Pre-queued users: in the pre-queue, or in the frozen one once the opening froze it.
local pre = NONE
if phase == P_PRE_QUEUE or phase == P_OPENING then
  pre = redis.call('ZMSCORE', sale.frozen and openKey or preKey, unpack(ARGV, U + 1, U + n))
end
-- Each seq as a number (sq[i]), and whether the mark has reached it.
local sq, due = {}, {}
for i = 1, n do
  local seq = seqs[i] and tonumber(seqs[i])
  sq[i], due[i] = seq, seq and seq <= mark
end
local toks = tokens_of(seqs, n, 9, nil, nil, due)
-- The users found admitted, {user, token, token key, what it holds} each: their tokens are
-- stored after the loop (issue_tokens).
local issued = {}
local ahead = ahead_counter(KEYS[5], mark)
-- A user twice in one call gets the first answer twice.
local out, first, beats, seqBeats = {mark, batch}, {}, {}, {}
-- seqBeats' length.
local nsb = 0
for i = 1, n do
  local user = ARGV[U + i]
  local o, j = 3 * i, first[user]
  if j then
    out[o], out[o + 1], out[o + 2] = out[3 * j], out[3 * j + 1], out[3 * j + 2]
  else
    first[user] = i
    local code, a, b, beat = known_answer(sq[i], toks[i], mark, phase, ahead)
    if code == ISSUE then
      issued[#issued + 1] = {user, ARGV[U + n + i], KEYS[9 + i], toks[i] or false}
      code, a, b = ADMITTED, ARGV[U + n + i], 1
    elseif not code then
      code, a, b, beat = NOT_IN_QUEUE, 0, 0, false
      if pre[i] then
        code, beat = PRE_QUEUE, true
      end
    end
    if beat and code == WAITING then
      -- The seq as ZMSCORE gave it (a string: no formatting).
      nsb = nsb + 1
      seqBeats[nsb] = seqs[i]
    elseif beat then
      beats[#beats + 1], beats[#beats + 2] = now, user
    end
    out[o], out[o + 1], out[o + 2] = code, a, b
  end
end
if #issued > 0 then
  local hold = ARGV[5] ~= '' and {{KEYS[13 + n], KEYS[14 + n], KEYS[15 + n]}, ARGV[5], num(ARGV[6]), num(ARGV[7])} or nil
  issue_tokens({waiting = KEYS[1], heartbeat = KEYS[2], waits = KEYS[7], record = KEYS[8], unused = KEYS[9]}, issued, ARGV[3], ARGV[4], now, hold)
end
if #beats > 0 then
  redis.call('ZADD', KEYS[2], unpack(beats))
end
beats_set(KEYS[6], seqBeats, beat_tag(now))
if saleKey then
  sale_tail(out, phase, sale)
end
out[#out + 1], out[#out + 2] = 0, 2 * markRaised
return out
