-- admit.lua: advance the admission mark by one batch of users still waiting, at most once
-- per tick of Redis' own clock, in slices: one call walks at most ARGV[15] users, and the
-- caller continues the tick (ARGV[16], the continuation the previous slice returned) until a
-- slice says the tick is done, so no call holds Redis for long whatever the batch.
--
-- Two pumps that both believe they hold the lock (lock lost, pause, clock skew) still admit
-- one batch per tick: the tick number comes from TIME here, not from the caller. Users who
-- left or were evicted are not in `waiting`, so they do not use a slot.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:admitted_count   STRING admission mark
-- KEYS[3] queue:{T}:last_tick        STRING last tick advanced
-- KEYS[4] queue:{T}:batch_size       STRING runtime batch size for this target (optional)
-- KEYS[5] queue:{T}:admissions       LIST "tick:count", newest first, the last ARGV[12] ticks
-- KEYS[6] queue:{T}:entry_times      ZSET entry times, one member per enter.lua call that gave new
--                                    seqs: score = its first seq, member "<first>-<last>:<ms>"
-- KEYS[7] queue:{T}:waits            HASH wait histogram: b:<lower bound s> -> users,
--                                    count, sum_ms, admitted (users admitted in all)
-- KEYS[8] queue:{T}:heartbeat        ZSET last poll ms -> user   (ttl refresh only)
-- KEYS[9] queue:{T}:seq              STRING counter              (ttl refresh only)
-- KEYS[10] queue:{T}:evicted         STRING evictions            (ttl refresh only)
-- KEYS[11] queue:{T}:departed        ZSET seqs of users who left or were evicted: those at
--                                    or below the new mark no longer matter and are dropped
-- KEYS[12] queue:{T}:sale            HASH the sale (optional, with the next three)
-- KEYS[13] queue:{T}:prequeue        ZSET pre-queued users until the opening
-- KEYS[14] queue:{T}:opening         ZSET the frozen pre-queue until its order is written
-- KEYS[15] queue:{T}:ledger          LIST admission ledger rows, newest first (LTRIM-capped)
-- KEYS[16] queue:{T}:record          HASH the sale's record (optional, with ARGV[10]; see
--                                    prelude.lua): t:<tick> admitted, admitted, wb:<bucket>,
--                                    wc, ws, wmax (the waits as in KEYS[7]), tick_ms, and the
--                                    scheduled close as an event
-- KEYS[17] queue:{T}:events          STREAM the event log (optional, with ARGV[13]): the
--                                    scheduled close, the pre-queue's opening (once, marked
--                                    `prequeue_told` in the sale), the first admission, every
--                                    ARGV[14] admitted, and the line gone (a tick under its
--                                    batch after a full one) (prelude.lua's event_add)
-- ARGV[1] batch size in force when the target has none of its own
-- ARGV[2] tick length ms
-- ARGV[3] key ttl seconds
-- ARGV[4] instance running the step (ledger), optional
-- ARGV[5] ledger rows kept (`store::LEDGER_MAX_ROWS`)
-- ARGV[6] fence: the highest admission mark the instance has seen, optional with the next three
--         (see `fence` in prelude.lua)
-- ARGV[7] fence: the highest seq the instance has seen given
-- ARGV[8] what the seq counter is raised to when Redis holds less than ARGV[7] (as in enter.lua)
-- ARGV[9] fence: the last tick the instance saw advanced
-- ARGV[10] record ttl seconds, with KEYS[16]
-- ARGV[11] the wait buckets' edges, "below:width ..." (`domain::stats::WAIT_BUCKETS`; see
--          `wait_bucket` in prelude.lua)
-- ARGV[12] ticks kept in KEYS[5] (`store::rules::ADMISSIONS_KEPT`)
-- ARGV[13] event log entries kept (`events.max_len`), with KEYS[17]; its ttl is ARGV[10]'s
-- ARGV[14] an event each time the users admitted in all pass a multiple of this (0: none)
-- ARGV[15] most users this call admits (a slice of the batch), optional: the whole batch
-- ARGV[16] the continuation of a tick started by an earlier call of this caller, as that call
--          returned it ("<tick>:<mark before>:<ms>:<admitted so far>:<mark>"), optional: a
--          new tick. Honoured only while Redis' clock is still in that tick and the tick's
--          admissions entry (KEYS[5]) still says what the earlier slice wrote, so a slice
--          never admits past the batch, never in another tick, and a caller that stops
--          mid-tick (crashed, paused) blocks nothing: the next tick starts afresh.
-- ARGV[17] the tick of a sharded target's plan (store/redis/shards.rs), optional with the
--          next: this shard admits only while its own clock is in that tick (else advanced 0),
--          and at most once in it (KEYS[3], as any tick)
-- ARGV[18] this shard's share of the plan's batch, in place of the batch in force
-- returns {advanced 0|1, mark, tick, admitted, batch, waits, fenced, more, continuation}:
-- admitted = by this call; waits = the admitted users' waits in ms, comma-separated (for the
-- Prometheus histogram), '' when none; fenced = bits 1 the seq counter, 2 the mark, 4 the last
-- tick was raised to the instance's fence; more = 1 when the tick has room and users may be
-- left: call again with the continuation (ARGV[16])
--
-- The tick's bookkeeping is written as it grows: its admissions entry and ledger row are
-- updated in place (LSET) by each later slice, the counters (waits, record) are added to, and
-- milestones fire in the slice that passes them; "the line gone" is judged by the tick's last
-- slice.
--
-- With a sale, nobody is admitted before `opens_at` (Redis' clock), until the opening order is
-- written (sale_place.lua), while paused, or once closed (the prelude's sale_phase); such a
-- tick is not used up (advanced 0, last_tick unchanged). The first call at or after `opens_at`
-- freezes the pre-queue (the prelude's freeze_prequeue, as enter.lua); the first at or after
-- `closes_at` closes the sale and records it.
local now = now_ms()
local tick = math.floor(now / tonumber(ARGV[2]))
local ttl = tonumber(ARGV[3])
local mark = tonumber(redis.call('GET', KEYS[2]) or '0')
local batch = tonumber(redis.call('GET', KEYS[4]) or ARGV[1])
local last = tonumber(redis.call('GET', KEYS[3]) or '-1')
local fenced = 0
if ARGV[9] then
  -- A lost admission is not admitted again in its tick, nor are its users sent back to waiting.
  -- Only keys Redis still holds: the pump ticks over idle targets too, whose keys expire
  -- (the sliding TTL) and must not be brought back. enter.lua and status.lua (users asking)
  -- fence a missing key as well.
  local seq = redis.call('GET', KEYS[9])
  local r1, r2, r4 = 0, 0, 0
  if seq then
    seq, r1 = fence(KEYS[9], tonumber(seq), tonumber(ARGV[7]), tonumber(ARGV[8]), ttl)
    if redis.call('EXISTS', KEYS[2]) == 1 then
      mark, r2 = fence(KEYS[2], mark, tonumber(ARGV[6]), tonumber(ARGV[6]), ttl)
    end
    if last >= 0 then
      last, r4 = fence(KEYS[3], last, tonumber(ARGV[9]), tonumber(ARGV[9]), ttl)
    end
  end
  fenced = r1 + 2 * r2 + 4 * r4
end
if ARGV[17] then
  if tonumber(ARGV[17]) ~= tick then
    return {0, mark, tick, 0, batch, '', fenced, 0, ''}
  end
  batch = tonumber(ARGV[18])
end
local slice = tonumber(ARGV[15] or '') or batch
-- The tick this call continues: before = the mark when it started, at = its first call's time,
-- sofar = admitted in it by the earlier slices, prev = the mark they left.
local cont = ARGV[16] or ''
local before, at, sofar = mark, now, 0
if cont ~= '' then
  local ct, cb, ca, cs, cm = string.match(cont, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not ct or tonumber(ct) ~= tick or last ~= tick or redis.call('LINDEX', KEYS[5], 0) ~= ct .. ':' .. cs then
    return {0, mark, tick, 0, batch, '', fenced, 0, ''}
  end
  before, at, sofar = tonumber(cb), tonumber(ca), tonumber(cs)
  cont = {prev = tonumber(cm)}
elseif tick <= last then
  return {0, mark, tick, 0, batch, '', fenced, 0, ''}
else
  cont = nil
end
local saleKey, ledger = KEYS[12], KEYS[15]
local rec, recTtl = KEYS[16], tonumber(ARGV[10] or '0')
local ledgerMax = ARGV[5]
local log = event_log(KEYS[17], ARGV[13], recTtl)
if saleKey then
  local phase, s = sale_phase(saleKey, now)
  if phase == P_CLOSED and s[5] ~= '1' then
    -- `closes_at` has passed: the first tick after it closes the sale.
    redis.call('HSET', saleKey, 'closed', 1, 'close_source', 'schedule', 'closed_at', now)
    sale_event(ledger, ledgerMax, ttl, rec, recTtl, ledger_row('close', now, 'schedule', s[6] or ''), log)
  end
  -- A sale closed before its opening was done is frozen all the same (enter.lua freezes in
  -- P_OPENING only).
  if s[1] and now >= tonumber(s[1]) and not s[8] then
    freeze_prequeue(saleKey, s, KEYS[9], KEYS[13], KEYS[14], nil, now, ttl)
  end
  if phase == P_PRE_QUEUE and log and redis.call('HSETNX', saleKey, 'prequeue_told', now) == 1 then
    event_add(log, ledger_row('prequeue', now, s[1], s[2]))
  end
  if sale_holds_admission(phase, s) then
    -- Keep a gathering pre-queue (and the sale) alive while nobody is admitted; a closed
    -- sale's keys expire as an empty queue's do.
    if phase ~= P_CLOSED then
      for _, k in ipairs({KEYS[1], KEYS[2], KEYS[8], KEYS[9], KEYS[11], KEYS[13], KEYS[14]}) do
        redis.call('EXPIRE', k, ttl)
      end
      redis.call('EXPIRE', saleKey, ttl, 'GT')
    end
    return {0, mark, tick, 0, batch, '', fenced, 0, ''}
  end
end
if not cont then
  redis.call('SET', KEYS[3], tick, 'EX', ttl)
end
local want = math.max(0, math.min(slice, batch - sofar))
local front = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. mark, '+inf', 'WITHSCORES', 'LIMIT', 0, want)
local admitted = #front / 2
local total = sofar + admitted
local more = (want > 0 and admitted == want and total < batch) and 1 or 0
-- Leftovers below the mark change no answer (every count is above the mark): each call drops
-- a bounded number, so a mark that passes a long run of departed seqs costs no long call.
local drop = 4 * math.max(want, 250)
local waits = {}
-- Wait buckets -> users of this batch, written once per bucket (to the histogram and the record).
local hist, sum, counted, longest = {}, 0, 0, -1
if admitted > 0 then
  mark = tonumber(front[#front])
  redis.call('SET', KEYS[2], mark, 'EX', ttl)
  local passed = redis.call('ZCOUNT', KEYS[11], '-inf', mark)
  if passed > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[11], 0, math.min(passed, drop) - 1)
  end
  -- Wait statistics: entry -> admission, bucketed by the prelude's wait_bucket. A seq's entry time
  -- is that of the enter.lua call that gave it: the member with the greatest first seq at or
  -- below it, if its range holds the seq (seqs given by an older vq have no entry time).
  local lowest = tonumber(front[2])
  local recs = redis.call('ZREVRANGEBYSCORE', KEYS[6], lowest, '-inf', 'LIMIT', 0, 1)
  -- One member per enter call: at most one per admitted user, bar calls whose users all
  -- departed; bounded all the same (a seq past the members read counts no wait).
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. lowest, mark, 'LIMIT', 0, drop)) do
    recs[#recs + 1] = r
  end
  local from, to, at = {}, {}, {}
  for i, r in ipairs(recs) do
    local a, b, ms = string.match(r, '^(%d+)-(%d+):(%d+)$')
    from[i], to[i], at[i] = tonumber(a), tonumber(b), tonumber(ms)
  end
  local k, edges = 0, wait_bucket_edges(ARGV[11])
  for i = 2, #front, 2 do
    local seq = tonumber(front[i])
    while k < #from and from[k + 1] <= seq do
      k = k + 1
    end
    if k > 0 and seq <= to[k] then
      local w = math.max(0, now - at[k])
      local b = wait_bucket(math.floor(w / 1000), edges)
      hist[b] = (hist[b] or 0) + 1
      longest = math.max(longest, w)
      sum = sum + w
      counted = counted + 1
      waits[counted] = w
    end
  end
  -- Entry times of seqs the mark passed are not needed again; the member whose range holds
  -- the next seq stays.
  local keep = redis.call('ZREVRANGEBYSCORE', KEYS[6], mark + 1, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #keep > 0 then
    local old = redis.call('ZCOUNT', KEYS[6], '-inf', '(' .. keep[2])
    if old > 0 then
      redis.call('ZREMRANGEBYRANK', KEYS[6], 0, math.min(old, drop) - 1)
    end
  end
  for b, c in pairs(hist) do
    redis.call('HINCRBY', KEYS[7], 'b:' .. b, c)
  end
  redis.call('HINCRBY', KEYS[7], 'count', counted)
  redis.call('HINCRBY', KEYS[7], 'sum_ms', sum)
  local total = redis.call('HINCRBY', KEYS[7], 'admitted', admitted)
  if log then
    -- Milestones: the first users admitted, and each multiple of ARGV[14] passed.
    local every, was = tonumber(ARGV[14]), total - admitted
    if was == 0 then
      event_add(log, ledger_row('admitted', now, total, 'first'))
    end
    if every > 0 and math.floor(was / every) < math.floor(total / every) then
      event_add(log, ledger_row('admitted', now, total, 'every'))
    end
  end
  redis.call('EXPIRE', KEYS[7], ttl)
end
if log and more == 0 and total < batch then
  -- The line is gone: the tick before filled its batch, this one does not.
  local prev = redis.call('LINDEX', KEYS[5], cont and 1 or 0)
  if prev and tonumber(string.match(prev, ':(%d+)$')) >= batch then
    event_add(log, ledger_row('emptied', now, mark))
  end
end
if cont then
  redis.call('LSET', KEYS[5], 0, tick .. ':' .. total)
else
  redis.call('LPUSH', KEYS[5], tick .. ':' .. admitted)
  redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[12]) - 1)
end
if rec and admitted > 0 then
  local f = {'t:' .. tick, admitted, 'admitted', admitted, 'wc', counted, 'ws', sum}
  for b, c in pairs(hist) do
    f[#f + 1], f[#f + 2] = 'wb:' .. b, c
  end
  record_incr(rec, recTtl, f)
  redis.call('HSET', rec, 'tick_ms', ARGV[2])
  if longest > tonumber(redis.call('HGET', rec, 'wmax') or '-1') then
    redis.call('HSET', rec, 'wmax', longest)
  end
end
if ledger and admitted > 0 then
  -- One row per tick: a later slice rewrites the row its tick's earlier slices wrote (unless
  -- another row, a pause say, came in between: then its part gets a row of its own).
  local row = ledger_row('admit', at, before, mark, total, ARGV[4] or '')
  if cont and sofar > 0
    and redis.call('LINDEX', ledger, 0) == ledger_row('admit', at, before, cont.prev, sofar, ARGV[4] or '') then
    redis.call('LSET', ledger, 0, row)
  elseif cont then
    ledger_push(ledger, ledger_row('admit', now, cont.prev, mark, admitted, ARGV[4] or ''), ledgerMax, ttl)
  else
    ledger_push(ledger, row, ledgerMax, ttl)
  end
end
if saleKey then
  redis.call('EXPIRE', saleKey, ttl, 'GT')
end
-- The sliding TTL: while anyone waits, every tick keeps all of the target's keys alive
-- (enter and poll do not refresh them); 30 min after the queue empties they expire.
if admitted > 0 or redis.call('ZCARD', KEYS[1]) > 0 then
  for _, k in ipairs({KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]}) do
    redis.call('EXPIRE', k, ttl)
  end
else
  redis.call('EXPIRE', KEYS[5], ttl)
end
local continuation = ''
if more == 1 then
  continuation = table.concat({tick, before, at, total, mark}, ':')
end
return {1, mark, tick, admitted, batch, table.concat(waits, ','), fenced, more, continuation}
