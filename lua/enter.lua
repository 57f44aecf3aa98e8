-- enter.lua: put users in a target's queue, or tell them where they already are.
--
-- One call carries every entry for this target that reached an instance while its previous
-- call was in flight (1..n users; n ≤ 128, `coalesce::MAX_JOBS`, well inside Lua's limit of
-- about 8000 unpacked values). Users are handled one after the other, each exactly as if
-- alone; only the reads every user needs (mark, batch size, counts) are made once.
--
-- vq sends this script with lua/prelude.lua in front: the reply codes and the helpers it
-- calls live there.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat        ZSET last poll ms -> user, of users without a seq (pre-queued)
-- KEYS[3] queue:{T}:seq              STRING counter
-- KEYS[4] queue:{T}:admitted_count   STRING admission mark
-- KEYS[5] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[6] queue:{T}:entry_times      ZSET entry ms of each call's new users, for wait statistics:
--                                    score = the first new seq, member "<first>-<last>:<ms>"
--                                    (the users of one call share `now`; admit.lua reads it)
-- KEYS[7] queue:{T}:departed         ZSET seqs of users who left or were evicted above the mark
-- KEYS[8] queue:{T}:record           HASH the sale's record: a:<tick> arrivals (new seqs and
--                                    pre-queued users) per tick of ARGV[6] (see prelude.lua)
-- KEYS[9] queue:{T}:beats            STRING the heartbeats of users with a seq (prelude.lua's beat_tag)
-- KEYS[9+i] queue:{T}:token:{user i} STRING token (or "used:<token>"), EX token ttl
-- KEYS[10+n] queue:{T}:sale          HASH the sale (optional, with the next two; without them
--                                    the target is always open)
-- KEYS[11+n] queue:{T}:prequeue      ZSET pre-queued users, arrival ms -> user, until the opening
-- KEYS[12+n] queue:{T}:opening       ZSET the pre-queue frozen at the opening, until the pump has
--                                    given it its order (sale_place.lua)
-- KEYS[13+n] queue:holds:{h0}:<g-1>  HASH the queues each user holds (user_hold.lua), with the
--                                    next two only when ARGV[9] > 0 (and with the sale keys)
-- KEYS[14+n] queue:holds:{h0}:<g>    the generation vq takes for Redis' current one
-- KEYS[15+n] queue:holds:{h0}:<g+1>
-- ARGV[1] capacity: max capacity (users waiting or pre-queued and not yet admitted)
-- ARGV[2] key_ttl_s: key ttl seconds (sliding)
-- ARGV[3] seq_seen: fence: the highest seq this instance has seen given (0 when none)
-- ARGV[4] seq_to: what the seq counter is raised to when Redis holds less than ARGV[3] (a lost
--                 write: ARGV[3] plus a margin for seqs other instances gave since this one last
--                 looked)
-- ARGV[5] mark_seen: fence: the highest admission mark this instance has seen
-- ARGV[6] tick_ms: tick length ms (the record's buckets)
-- ARGV[7] record_ttl_s: record ttl seconds
-- ARGV[8] ttl_refresh_every: TTL refresh period in seqs (`store::rules::TTL_REFRESH_EVERY`): see
--                            below
-- ARGV[9] hold_max: queue.max_queues_per_user when this call counts the target among the
--                  queues each user given a place holds (a single node, where the holds' keys
--                  and the target's are on one server), else 0 (no count, no hold keys)
-- ARGV[10] hold_target: the target as the holds name it (the whole target, not a shard)
-- ARGV[11] hold_generation: g, the generation of KEYS[14+n]
-- ARGV[12] hold_generation_ms: a generation's length, ms
-- ARGV[12+i] user: user i
-- Heartbeats and entry times are Redis' TIME (now_ms), like every time a script keeps.
-- returns {mark, batch_override_or_0, then per user i: code, a, b}, the codes named in prelude.lua
--   WAITING   a = seq, b = users ahead still waiting
--   ADMITTED  a = token (issued before)
--   FULL
--   ISSUE     admitted and still waiting: the caller signs a token and calls issue.lua
--   PRE_QUEUE recorded in the pre-queue (or in the frozen one, not yet placed)
--   SCHEDULED before the pre-queue opens: not recorded
--   CLOSED    the sale is closed: not recorded (admitted users still get their token)
--   TOO_MANY  a = "TARGET=ms TARGET=ms ..." the queues the user holds (ms since each was
--             counted), ARGV[9] of them already: not recorded
-- then, when the sale keys are given: phase (0 no sale, 1 scheduled, 2 pre-queue, 3 opening,
-- 4 open, 5 closed), opens_at ms or 0, prequeue_from ms or 0, paused 0|1, close message
-- then always: the seq counter after this call, fenced (bits: 1 the seq counter was raised to
-- ARGV[4], 2 the mark was raised to ARGV[5]; see `fence` in prelude.lua)
--
-- The sale's phase is read by Redis' clock. The first call at or after `opens_at` (this or
-- admit.lua) freezes the pre-queue (`freeze_prequeue` in prelude.lua), so entries from then on
-- come after every pre-queued user.
-- At sale start this runs for every entry, so its calls are per call, not per user. Key TTLs
-- are refreshed by admit.lua every tick while anyone waits, and here whenever a new seq is the
-- first or a multiple of ARGV[8] plus one (so keys written before any pump runs still expire).
-- A user given a place (a new seq or a new pre-queue entry) is counted with ARGV[9] > 0, in the
-- same step: a user refused by the count gets no place, and one refused for capacity is not
-- counted. A user the queue already knows is not counted again.
-- Users start after the U fixed arguments.
local U = 12
local n = #ARGV - U
-- The reads every user needs, in one call: mark, batch size, last seq given, then each user's
-- token key (st[3 + i]).
local st = redis.call('MGET', KEYS[4], KEYS[5], KEYS[3], unpack(KEYS, 10, 9 + n))
local mark = num(st[1] or '0')
local batch = num(st[2] or '0')
local max = num(ARGV[1])
local now = now_ms()
-- Nothing this instance saw given or admitted is given again or taken back. `counter` is the
-- seq counter as this call found it (past the pre-queue once this call froze it).
local counter, seqRaised = fence(KEYS[3], tonumber(st[3] or '0'), tonumber(ARGV[3]), ARGV[4], ARGV[2])
local markRaised
mark, markRaised = fence(KEYS[4], mark, num(ARGV[5]), ARGV[5], ARGV[2])
local saleKey, preKey, openKey = KEYS[10 + n], KEYS[11 + n], KEYS[12 + n]
local phase, sale = sale_phase(saleKey, now)
if phase == P_OPENING then
  counter = freeze_prequeue(saleKey, sale, KEYS[3], preKey, openKey, counter, now, ARGV[2])
end
local last = counter
local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, U + 1, U + n))
-- In the pre-queue (or the frozen one): pre[i] is set when user i is in it.
local pre = NONE
if phase == P_PRE_QUEUE or phase == P_OPENING then
  pre = redis.call('ZMSCORE', phase == P_PRE_QUEUE and preKey or openKey, unpack(ARGV, U + 1, U + n))
end
local prequeued = 0
if phase == P_PRE_QUEUE then
  prequeued = redis.call('ZCARD', preKey)
end
local preAdds = {}
local toks = tokens_of(seqs, n, 9, st, 3)
-- The count of queues held (ARGV[9] > 0): the fields of the users who may be given a place, read
-- once for the call (the current generation, then the previous one for those it lacks).
local holdMax, holdAt, holdMarked = num(ARGV[9]), nil, false
local holds, holdMoved, holdSet, holdEntry = NONE, NONE, NONE, nil
-- holdSet's length: user, field pairs.
local nset = 0
if holdMax > 0 and phase ~= P_SCHEDULED and phase ~= P_CLOSED then
  holds, holdMoved, holdSet = {}, {}, {}
  holdAt = hold_generation(now, num(ARGV[11]), num(ARGV[12]))
  holdEntry = ARGV[10] .. '=' .. now
  -- The users to read: every user of the call (straight from ARGV) unless the queue knows
  -- some, the common case of new users arriving.
  local src, off, na = ARGV, U, n
  for i = 1, n do
    if seqs[i] or toks[i] or pre[i] then
      src, off, na = {}, 0, 0
      for j = 1, n do
        if not (seqs[j] or toks[j] or pre[j]) then
          na = na + 1
          src[na] = ARGV[U + j]
        end
      end
      break
    end
  end
  if na > 0 then
    -- With the generation's mark (HOLD_MARK in prelude.lua): once it is there, the key has
    -- its expiry.
    local found = redis.call('HMGET', KEYS[13 + n + holdAt - 1], HOLD_MARK, unpack(src, off + 1, off + na))
    holdMarked = found[1] and true or false
    -- The users the current generation lacks: all of them, the common case, or a list.
    local msrc, moff, nm = src, off, na
    for k = 1, na do
      if found[k + 1] then
        msrc, moff, nm = {}, 0, 0
        for j = 1, na do
          local u = src[off + j]
          if found[j + 1] then
            holds[u] = found[j + 1]
          else
            nm = nm + 1
            msrc[nm] = u
          end
        end
        break
      end
    end
    if holdAt > 1 and nm > 0 then
      local older = redis.call('HMGET', KEYS[13 + n + holdAt - 2], unpack(msrc, moff + 1, moff + nm))
      for k = 1, nm do
        if older[k] then
          local u = msrc[moff + k]
          holds[u], holdMoved[u] = older[k], true
        end
      end
    end
  end
end
-- The count's answer for a user about to be given a place who holds queues already (holds[user]):
-- nil when they may take it (with the field to write once they do, nil when it stays), else the
-- TOO_MANY reply's list. A field found in the previous generation moves to the current one
-- either way. A user who holds none is counted with holdEntry. The field is written once the
-- user has their place (holdSet).
local function hold_check(user)
  local v = holds[user]
  local count, mine = 0, false
  for t in string.gmatch(v, '([^ =]+)=') do
    count = count + 1
    mine = mine or t == ARGV[10]
  end
  if mine then
    return nil, holdMoved[user] and v or nil
  elseif count < holdMax then
    return nil, v .. ' ' .. holdEntry
  end
  if holdMoved[user] then
    holdSet[nset + 1], holdSet[nset + 2] = user, v
    nset = nset + 2
  end
  local ages = {}
  for t, ms in string.gmatch(v, '([^ =]+)=(%d+)') do
    ages[#ages + 1] = t .. '=' .. math.max(0, now - tonumber(ms))
  end
  return table.concat(ages, ' ')
end
local ahead = ahead_counter(KEYS[7], mark)
-- Users waiting above the mark (all of them are ahead of a new user), counted when needed.
local above
-- Per user i: out[3i], out[3i+1], out[3i+2] = code, a, b (see above); a user twice in one
-- call gets the first answer twice.
local out, first, beats, seqBeats = {mark, batch}, {}, {}, {}
-- New users take the next seqs in arrival order, given here: the counter holds `counter` (as
-- fenced and frozen above, and nothing else writes it within the call), and is raised by their
-- number once they are all known. `adds` is their ZADD's arguments (seq, user); `refresh`
-- whether a seq asks for the keys' TTLs.
local nfresh, adds, refresh, every, seqStr = 0, {}, false, num(ARGV[8]), int_run()
for i = 1, n do
  local user = ARGV[U + i]
  local o, j = 3 * i, first[user]
  if j then
    out[o], out[o + 1], out[o + 2] = out[3 * j], out[3 * j + 1], out[3 * j + 2]
  else
    first[user] = i
    -- A new user (no seq, no token) in an open sale is the common case: nothing to look up.
    local code, a, b, beat
    if seqs[i] or toks[i] or phase == P_CLOSED then
      code, a, b, beat = known_answer(seqs[i] and tonumber(seqs[i]), toks[i], mark, phase, ahead)
    end
    if code then
      if beat then
        seqBeats[#seqBeats + 1] = seqs[i]
      end
      out[o], out[o + 1], out[o + 2] = code, a, b
    elseif phase == P_SCHEDULED then
      out[o], out[o + 1], out[o + 2] = SCHEDULED, 0, 0
    elseif pre[i] then
      beats[#beats + 1], beats[#beats + 2] = now, user
      out[o], out[o + 1], out[o + 2] = PRE_QUEUE, 0, 0
    else
      -- Counted unless they hold queues already (holds[user]: then hold_check decides).
      local refused, field = nil, holdEntry
      if holds[user] then
        refused, field = hold_check(user)
      end
      if refused then
        out[o], out[o + 1], out[o + 2] = TOO_MANY, refused, 0
      elseif phase == P_PRE_QUEUE then
        -- Pre-queued users count against the capacity like waiting ones.
        if not above then
          above = ahead(counter + 1)
        end
        if above + prequeued >= max then
          out[o], out[o + 1], out[o + 2] = FULL, 0, 0
        else
          preAdds[#preAdds + 1], preAdds[#preAdds + 2] = now, user
          beats[#beats + 1], beats[#beats + 2] = now, user
          prequeued = prequeued + 1
          if field then
            holdSet[nset + 1], holdSet[nset + 2] = user, field
            nset = nset + 2
          end
          out[o], out[o + 1], out[o + 2] = PRE_QUEUE, 0, 0
        end
      else
        -- Everyone waiting above the mark is ahead of a new user.
        if not above then
          above = ahead(counter + 1)
        end
        if above >= max then
          out[o], out[o + 1], out[o + 2] = FULL, 0, 0
        else
          nfresh = nfresh + 1
          local seq = counter + nfresh
          adds[2 * nfresh - 1], adds[2 * nfresh] = seqStr(seq), user
          refresh = refresh or seq % every == 1
          if field then
            holdSet[nset + 1], holdSet[nset + 2] = user, field
            nset = nset + 2
          end
          out[o], out[o + 1], out[o + 2] = WAITING, seq, above
          above = above + 1
        end
      end
    end
  end
end
if nfresh > 0 then
  last = redis.call('INCRBY', KEYS[3], str(nfresh))
  local from = counter + 1
  -- Their heartbeats: one run of fields, from .. last.
  beats_set_run(KEYS[9], from, nfresh, beat_tag(now))
  redis.call('ZADD', KEYS[1], unpack(adds))
  -- One entry time for all of them: seqs from .. last entered at `now`.
  redis.call('ZADD', KEYS[6], from, from .. '-' .. last .. ':' .. now)
  if refresh then
    for _, k in ipairs({KEYS[1], KEYS[3], KEYS[4], KEYS[6], KEYS[9]}) do
      redis.call('EXPIRE', k, ARGV[2])
    end
  end
end
if #beats > 0 then
  redis.call('ZADD', KEYS[2], unpack(beats))
end
if #seqBeats > 0 then
  beats_set(KEYS[9], seqBeats, beat_tag(now))
end
if nset > 0 then
  local key = KEYS[13 + n + holdAt - 1]
  if holdMarked then
    redis.call('HSET', key, unpack(holdSet, 1, nset))
  else
    -- The generation's first write here: its mark, and its expiry (kept through the next
    -- generation, where it is read as the previous one).
    holdSet[nset + 1], holdSet[nset + 2] = HOLD_MARK, '1'
    redis.call('HSET', key, unpack(holdSet, 1, nset + 2))
    redis.call('PEXPIREAT', key, (num(ARGV[11]) + holdAt) * num(ARGV[12]))
  end
  if next(holdMoved) then
    local from = {}
    for k = 1, nset, 2 do
      if holdMoved[holdSet[k]] then
        from[#from + 1] = holdSet[k]
      end
    end
    if #from > 0 then
      redis.call('HDEL', KEYS[13 + n + holdAt - 2], unpack(from))
    end
  end
end
if #preAdds > 0 then
  -- The seq key marks the target alive for the pump (forget_if_expired), also before any seq.
  redis.call('ZADD', preKey, 'NX', unpack(preAdds))
  redis.call('SET', KEYS[3], counter, 'EX', ARGV[2])
  for _, k in ipairs({preKey, KEYS[2]}) do
    redis.call('EXPIRE', k, ARGV[2])
  end
end
-- The record counts arrivals per call, not per user: one HINCRBY for the whole batch, and
-- the record's expiry moves with the tick's first arrivals only (once per tick, not per call).
local arrived = nfresh + #preAdds / 2
if arrived > 0 and redis.call('HINCRBY', KEYS[8], 'a:' .. str(math.floor(now / num(ARGV[6]))), str(arrived)) == arrived then
  redis.call('EXPIRE', KEYS[8], ARGV[7])
end
if saleKey then
  sale_tail(out, phase, sale)
end
out[#out + 1], out[#out + 2] = counter > last and counter or last, seqRaised + 2 * markRaised
return out
