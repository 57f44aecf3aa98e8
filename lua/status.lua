-- status.lua: polls in one round trip. Refreshes each waiting user's heartbeat and tells
-- where they are; once the mark has reached a user's seq, the caller signs a token and
-- issue.lua stores it (once) and takes the user out of the queue.
--
-- One call carries every poll for this target that reached an instance while its previous
-- call was in flight (1..n users; n ≤ 128, `coalesce::MAX_JOBS`, well inside Lua's limit of
-- about 8000 unpacked values), handled one after the other, each exactly as if alone.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:admitted_count   STRING admission mark
-- KEYS[4] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[5] queue:{T}:departed         ZSET seqs of users who left or were evicted above the mark
-- KEYS[5+i] queue:{T}:token:{user i} STRING token (or "used:<token>"), EX token ttl
-- KEYS[6+n] queue:{T}:sale           HASH the sale (optional, with the next two)
-- KEYS[7+n] queue:{T}:prequeue       ZSET pre-queued users until the opening
-- KEYS[8+n] queue:{T}:opening        ZSET the frozen pre-queue until its order is written
-- ARGV[1] now, epoch ms, from the calling instance's clock (the heartbeat)
-- ARGV[1+i] user i
-- returns {mark, batch_override_or_0, then per user i: code, a, b}
--   code 1 WAITING       a = seq, b = users ahead still waiting
--   code 2 ADMITTED      a = token (issued before)
--   code 4 NOT_IN_QUEUE
--   code 5 ISSUE         admitted and still waiting: the caller signs a token, calls issue.lua
--   code 6 PRE_QUEUE     pre-queued (heartbeat refreshed)
--   code 8 CLOSED        the sale is closed and the user was not admitted
-- then, when the sale keys are given, the sale as in enter.lua: phase, opens_at, prequeue_from,
-- paused, message (phase 3 = the opening time has passed and the pre-queue may not be frozen
-- yet: this script never freezes it, enter.lua and admit.lua do)
--
-- Polls are most of the traffic (every waiting user, every 2-3 s), so the calls are per call,
-- not per user; no TTL refresh (admit.lua refreshes the target's keys every tick while anyone
-- waits).
local n = #ARGV - 1
local st = redis.call('MGET', KEYS[3], KEYS[4])
local mark = tonumber(st[1] or '0')
local batch = tonumber(st[2] or '0')
local now = ARGV[1]
local phase, sale = 0, nil
local saleKey, preKey, openKey = KEYS[6 + n], KEYS[7 + n], KEYS[8 + n]
if saleKey then
  sale = redis.call('HMGET', saleKey, 'opens_at', 'prequeue_from', 'closes_at', 'paused', 'closed', 'message', 'frozen', 'opened_at')
  if sale[1] or sale[3] or sale[5] then
    local t = redis.call('TIME')
    local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local opens = tonumber(sale[1] or '0')
    if sale[5] == '1' or (sale[3] and clock >= tonumber(sale[3])) then
      phase = 5
    elseif opens == 0 or sale[8] then
      phase = 4
    elseif clock < tonumber(sale[2] or sale[1]) then
      phase = 1
    elseif clock < opens then
      phase = 2
    else
      phase = 3
    end
  end
end
local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 2, 1 + n))
-- Pre-queued users: in the pre-queue, or in the frozen one once the opening froze it.
local pre = {}
if phase == 2 or phase == 3 then
  pre = redis.call('ZMSCORE', sale[7] and openKey or preKey, unpack(ARGV, 2, 1 + n))
end
-- Tokens of the users not waiting (admitted before, or unknown): toks[i] is user i's.
local toks, tk = {}, {}
for i = 1, n do
  if not seqs[i] then
    tk[#tk + 1] = KEYS[5 + i]
  end
end
if #tk > 0 then
  local got, j = redis.call('MGET', unpack(tk)), 0
  for i = 1, n do
    if not seqs[i] then
      j = j + 1
      toks[i] = got[j]
    end
  end
end
-- Users ahead: every seq between the mark and the user's was given to a user who is still
-- waiting or departed (left, evicted); admission only takes seqs at or below the mark. So
-- the count is arithmetic plus the departed in between, without ranking the user in the queue.
local departed = redis.call('ZCARD', KEYS[5])
local function ahead(seq)
  local gone = 0
  if departed > 0 then
    gone = redis.call('ZCOUNT', KEYS[5], '(' .. mark, '(' .. seq)
  end
  return math.max(0, seq - mark - 1 - gone)
end
-- A user twice in one call gets the first answer twice.
local out, first, beats = {mark, batch}, {}, {}
for i = 1, n do
  local user = ARGV[1 + i]
  local o, j = 3 * i, first[user]
  if j then
    out[o], out[o + 1], out[o + 2] = out[3 * j], out[3 * j + 1], out[3 * j + 2]
  else
    first[user] = i
    local seq = seqs[i] and tonumber(seqs[i])
    if seq and seq <= mark then
      out[o], out[o + 1], out[o + 2] = 5, seq, 0
    elseif seq and phase ~= 5 then
      beats[#beats + 1], beats[#beats + 2] = now, user
      out[o], out[o + 1], out[o + 2] = 1, seq, ahead(seq)
    elseif toks[i] then
      -- A token marked used by the gate is still this user's token (a reuse gets 403 there).
      local tok = toks[i]
      if string.sub(tok, 1, 5) == 'used:' then
        tok = string.sub(tok, 6)
      end
      out[o], out[o + 1], out[o + 2] = 2, tok, 0
    elseif phase == 5 then
      out[o], out[o + 1], out[o + 2] = 8, 0, 0
    elseif pre[i] then
      beats[#beats + 1], beats[#beats + 2] = now, user
      out[o], out[o + 1], out[o + 2] = 6, 0, 0
    else
      out[o], out[o + 1], out[o + 2] = 4, 0, 0
    end
  end
end
if #beats > 0 then
  redis.call('ZADD', KEYS[2], unpack(beats))
end
if saleKey then
  local nn = #out
  out[nn + 1], out[nn + 2], out[nn + 3] = phase, tonumber(sale[1] or '0'), tonumber(sale[2] or '0')
  out[nn + 4], out[nn + 5] = sale[4] == '1' and 1 or 0, sale[6] or ''
end
return out
