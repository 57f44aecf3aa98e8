-- enter.lua: put users in a target's queue, or tell them where they already are.
--
-- One call carries every entry for this target that reached an instance while its previous
-- call was in flight (1..n users; n ≤ 128, `coalesce::MAX_JOBS`, well inside Lua's limit of
-- about 8000 unpacked values). Users are handled one after the other, each exactly as if
-- alone; only the reads every user needs (mark, batch size, counts) are made once.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user
-- KEYS[3] queue:{T}:seq              STRING counter
-- KEYS[4] queue:{T}:admitted_count   STRING admission mark
-- KEYS[5] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[6] queue:{T}:entry_times      ZSET entry ms of each call's new users, for wait statistics:
--                                    score = the first new seq, member "<first>-<last>:<ms>"
--                                    (the users of one call share `now`; admit.lua reads it)
-- KEYS[7] queue:{T}:departed         ZSET seqs of users who left or were evicted above the mark
-- KEYS[7+i] queue:{T}:token:{user i} STRING token (or "used:<token>"), EX token ttl
-- KEYS[8+n] queue:{T}:sale           HASH the sale (optional, with the next two; without them
--                                    the target is always open)
-- KEYS[9+n] queue:{T}:prequeue       ZSET pre-queued users, arrival ms -> user, until the opening
-- KEYS[10+n] queue:{T}:opening       ZSET the pre-queue frozen at the opening, until the pump has
--                                    given it its order (sale_place.lua)
-- ARGV[1] max capacity (users waiting or pre-queued and not yet admitted)
-- ARGV[2] key ttl seconds (sliding)
-- ARGV[3] now, epoch ms, from the calling instance's clock (heartbeat and entry time; the
--         admission tick uses Redis' own TIME in admit.lua)
-- ARGV[3+i] user i
-- returns {mark, batch_override_or_0, then per user i: code, a, b}
--   code 1 WAITING   a = seq, b = users ahead still waiting
--   code 2 ADMITTED  a = token (issued before)
--   code 3 FULL
--   code 5 ISSUE     admitted and still waiting: the caller signs a token and calls issue.lua
--   code 6 PRE_QUEUE recorded in the pre-queue (or in the frozen one, not yet placed)
--   code 7 SCHEDULED before the pre-queue opens: not recorded
--   code 8 CLOSED    the sale is closed: not recorded (admitted users still get their token)
-- then, when the sale keys are given: phase (0 no sale, 1 scheduled, 2 pre-queue, 3 opening,
-- 4 open, 5 closed), opens_at ms or 0, prequeue_from ms or 0, paused 0|1, close message
--
-- The sale's phase is read by Redis' clock. The first call at or after `opens_at` (this or
-- admit.lua) freezes the pre-queue: it becomes `opening` (RENAME), N = its size, and the seq
-- counter moves past N, so entries from then on come after every pre-queued user.
-- At sale start this runs for every entry, so its calls are per call, not per user. Key TTLs
-- are refreshed by admit.lua every tick while anyone waits, and here whenever a new seq is the
-- first or a multiple of 64 plus one (so keys written before any pump runs still expire).
local n = #ARGV - 3
-- The reads every user needs, in one call: mark, batch size, last seq given.
local st = redis.call('MGET', KEYS[4], KEYS[5], KEYS[3])
local mark = tonumber(st[1] or '0')
local batch = tonumber(st[2] or '0')
local max = tonumber(ARGV[1])
local now = ARGV[3]
-- The sale's phase (see the header); 0 without a sale.
local phase, sale = 0, nil
local saleKey, preKey, openKey = KEYS[8 + n], KEYS[9 + n], KEYS[10 + n]
if saleKey then
  sale = redis.call('HMGET', saleKey, 'opens_at', 'prequeue_from', 'closes_at', 'paused', 'closed', 'message', 'frozen', 'opened_at')
  if sale[1] or sale[3] or sale[5] then
    local t = redis.call('TIME')
    local clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local opens = tonumber(sale[1] or '0')
    if sale[5] == '1' or (sale[3] and clock >= tonumber(sale[3])) then
      phase = 5
    elseif opens == 0 then
      phase = 4
    elseif clock < tonumber(sale[2] or sale[1]) then
      phase = 1
    elseif clock < opens then
      phase = 2
    elseif sale[8] then
      phase = 4
    else
      phase = 3
      if not sale[7] then
        -- The opening: freeze the pre-queue once; its users get seqs base+1 .. base+N.
        local base = tonumber(st[3] or '0')
        local frozen = redis.call('ZCARD', preKey)
        if frozen > 0 then
          redis.call('RENAME', preKey, openKey)
        end
        redis.call('SET', KEYS[3], base + frozen, 'EX', tonumber(ARGV[2]))
        redis.call('HSET', saleKey, 'frozen', frozen, 'base', base, 'frozen_at', clock)
        st[3] = tostring(base + frozen)
      end
    end
  end
end
local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 4, 3 + n))
-- In the pre-queue (or the frozen one): pre[i] is set when user i is in it.
local pre = {}
if phase == 2 or phase == 3 then
  pre = redis.call('ZMSCORE', phase == 2 and preKey or openKey, unpack(ARGV, 4, 3 + n))
end
local prequeued = 0
if phase == 2 then
  prequeued = redis.call('ZCARD', preKey)
end
local preAdds = {}
-- Tokens of the users not waiting (admitted before, or new): toks[i] is user i's.
local toks = {}
local notwaiting = 0
for i = 1, n do
  if not seqs[i] then
    notwaiting = notwaiting + 1
  end
end
if notwaiting == n then
  toks = redis.call('MGET', unpack(KEYS, 8, 7 + n))
elseif notwaiting > 0 then
  local tk = {}
  for i = 1, n do
    if not seqs[i] then
      tk[#tk + 1] = KEYS[7 + i]
    end
  end
  local got, j = redis.call('MGET', unpack(tk)), 0
  for i = 1, n do
    if not seqs[i] then
      j = j + 1
      toks[i] = got[j]
    end
  end
end
-- Users ahead of a waiting user: every seq between the mark and theirs was given to a user
-- who is still waiting or departed (left, evicted); admission only takes seqs at or below the
-- mark. So the count is arithmetic plus the departed in between, without a rank.
local departed = redis.call('ZCARD', KEYS[7])
local function ahead(seq)
  local gone = 0
  if departed > 0 then
    gone = redis.call('ZCOUNT', KEYS[7], '(' .. mark, '(' .. seq)
  end
  return math.max(0, seq - mark - 1 - gone)
end
-- Users waiting above the mark (all of them are ahead of a new user), counted when needed.
local above
-- Per user i: out[3i], out[3i+1], out[3i+2] = code, a, b (see above); a user twice in one
-- call gets the first answer twice.
local out, first, beats, fresh = {mark, batch}, {}, {}, {}
for i = 1, n do
  local user = ARGV[3 + i]
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
    elseif phase == 1 then
      out[o], out[o + 1], out[o + 2] = 7, 0, 0
    elseif pre[i] then
      beats[#beats + 1], beats[#beats + 2] = now, user
      out[o], out[o + 1], out[o + 2] = 6, 0, 0
    elseif phase == 2 then
      -- Pre-queued users count against the capacity like waiting ones.
      if not above then
        above = ahead(tonumber(st[3] or '0') + 1)
      end
      if above + prequeued >= max then
        out[o], out[o + 1], out[o + 2] = 3, 0, 0
      else
        preAdds[#preAdds + 1], preAdds[#preAdds + 2] = now, user
        beats[#beats + 1], beats[#beats + 2] = now, user
        prequeued = prequeued + 1
        out[o], out[o + 1], out[o + 2] = 6, 0, 0
      end
    else
      -- Everyone waiting above the mark is ahead of a new user.
      if not above then
        above = ahead(tonumber(st[3] or '0') + 1)
      end
      if above >= max then
        out[o], out[o + 1], out[o + 2] = 3, 0, 0
      else
        fresh[#fresh + 1] = i
        out[o], out[o + 1], out[o + 2] = 1, 0, above
        above = above + 1
      end
    end
  end
end
-- New users take the next seqs in arrival order.
local nfresh = #fresh
if nfresh > 0 then
  local last = redis.call('INCRBY', KEYS[3], nfresh)
  local from = last - nfresh + 1
  local adds, refresh = {}, false
  for j = 1, nfresh do
    local i, seq = fresh[j], from + j - 1
    local user = ARGV[3 + i]
    out[3 * i + 1] = seq
    adds[2 * j - 1], adds[2 * j] = seq, user
    beats[#beats + 1], beats[#beats + 2] = now, user
    refresh = refresh or seq % 64 == 1
  end
  redis.call('ZADD', KEYS[1], unpack(adds))
  -- One entry time for all of them: seqs from .. last entered at `now`.
  redis.call('ZADD', KEYS[6], from, from .. '-' .. last .. ':' .. now)
  if refresh then
    local ttl = tonumber(ARGV[2])
    for _, k in ipairs({KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]}) do
      redis.call('EXPIRE', k, ttl)
    end
  end
  -- Duplicates of a new user were copied before their seq was known.
  for i = 1, n do
    local j = first[ARGV[3 + i]]
    if j ~= i then
      out[3 * i + 1] = out[3 * j + 1]
    end
  end
end
if #beats > 0 then
  redis.call('ZADD', KEYS[2], unpack(beats))
end
if #preAdds > 0 then
  -- The seq key marks the target alive for the pump (forget_if_expired), also before any seq.
  local ttl = tonumber(ARGV[2])
  redis.call('ZADD', preKey, 'NX', unpack(preAdds))
  redis.call('SET', KEYS[3], st[3] or '0', 'EX', ttl)
  for _, k in ipairs({preKey, KEYS[2]}) do
    redis.call('EXPIRE', k, ttl)
  end
end
if saleKey then
  local nn = #out
  out[nn + 1], out[nn + 2], out[nn + 3] = phase, tonumber(sale[1] or '0'), tonumber(sale[2] or '0')
  out[nn + 4], out[nn + 5] = sale[4] == '1' and 1 or 0, sale[6] or ''
end
return out
