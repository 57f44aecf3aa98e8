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
-- ARGV[1] max capacity (users waiting and not yet admitted)
-- ARGV[2] key ttl seconds (sliding)
-- ARGV[3] now, epoch ms, from the calling instance's clock (heartbeat and entry time; the
--         admission tick uses Redis' own TIME in admit.lua)
-- ARGV[3+i] user i
-- returns {mark, batch_override_or_0, then per user i: code, a, b}
--   code 1 WAITING   a = seq, b = users ahead still waiting
--   code 2 ADMITTED  a = token (issued before)
--   code 3 FULL
--   code 5 ISSUE     admitted and still waiting: the caller signs a token and calls issue.lua
--
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
local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 4, 3 + n))
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
    elseif seq then
      beats[#beats + 1], beats[#beats + 2] = now, user
      out[o], out[o + 1], out[o + 2] = 1, seq, ahead(seq)
    elseif toks[i] then
      -- A token marked used by the gate is still this user's token (a reuse gets 403 there).
      local tok = toks[i]
      if string.sub(tok, 1, 5) == 'used:' then
        tok = string.sub(tok, 6)
      end
      out[o], out[o + 1], out[o + 2] = 2, tok, 0
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
return out
