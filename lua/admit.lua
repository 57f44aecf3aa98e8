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
-- ARGV[1] default_batch: batch size in force when the target has none of its own
-- ARGV[2] tick_ms: tick length ms
-- ARGV[3] key_ttl_s: key ttl seconds
-- ARGV[4] instance: instance running the step (ledger), optional
-- ARGV[5] ledger_max: ledger rows kept (`store::LEDGER_MAX_ROWS`)
-- ARGV[6] mark_seen: fence: the highest admission mark the instance has seen, optional with the
--                    next three (see `fence` in prelude.lua)
-- ARGV[7] seq_seen: fence: the highest seq the instance has seen given
-- ARGV[8] seq_to: what the seq counter is raised to when Redis holds less than ARGV[7] (as in
--                 enter.lua)
-- ARGV[9] tick_seen: fence: the last tick the instance saw advanced
-- ARGV[10] record_ttl_s: record ttl seconds, with KEYS[16]
-- ARGV[11] wait_buckets: the wait buckets' edges, "below:width ..." (`domain::stats::WAIT_BUCKETS`;
--                        see `wait_bucket` in prelude.lua)
-- ARGV[12] admissions_kept: ticks kept in KEYS[5] (`store::rules::ADMISSIONS_KEPT`)
-- ARGV[13] events_max: event log entries kept (`events.max_len`), with KEYS[17]; its ttl is
--                      ARGV[10]'s
-- ARGV[14] admitted_every: an event each time the users admitted in all pass a multiple of this (0:
--                          none)
-- ARGV[15] slice: most users this call admits (a slice of the batch), optional: the whole batch
-- ARGV[16] continuation: the continuation of a tick started by an earlier call of this caller, as
--                        that call returned it
--                        ("<tick>:<mark before>:<ms>:<admitted so far>:<mark>"), optional: a new
--                        tick. Honoured only while Redis' clock is still in that tick and the
--                        tick's admissions entry (KEYS[5]) still says what the earlier slice
--                        wrote, so a slice never admits past the batch, never in another tick,
--                        and a caller that stops mid-tick (crashed, paused) blocks nothing: the
--                        next tick starts afresh.
-- ARGV[17] plan_tick: the tick of a sharded target's plan (store/redis/shards.rs), optional
--                   with the next: this shard admits only while its own clock is in that tick
--                   (else advanced 0), and at most once in it (KEYS[3], as any tick)
-- ARGV[18] plan_share: this shard's share of the plan's batch, in place of the batch in force;
--                    with a plan, the milestones are the whole target's (admit_milestones.lua)
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
--
-- The call's steps, each a function below, in the order they run: fence_counters,
-- tick_to_work_in, sale_holds_tick (with a sale), take_slice, waits_of, drop_entry_times,
-- count_waits, announce_milestones, announce_line_gone, note_admissions, record_tick,
-- ledger_tick, keep_alive.
--
-- The steps are defined once, when vq's library loads, not on every call (the `-- vq:call`
-- line below divides them from the call; src/store/redis/scripts.rs): they read the call's
-- keys and settings from these locals, which every call sets first.
local waiting, markKey, lastTickKey, batchKey, admissions
local entryTimes, waitsKey, heartbeat, seqKey, evicted
local departed, saleKey, preKey, openKey, ledger, rec
local now, tick, ttl, instance, ledgerMax, recTtl, log

-- Fences (prelude.lua's `fence`, with ARGV[6..9]): a lost admission is not admitted again in
-- its tick, nor are its users sent back to waiting. Only keys Redis still holds: the pump ticks
-- over idle targets too, whose keys expire (the sliding TTL) and must not be brought back.
-- enter.lua and status.lua (users asking) fence a missing key as well. Returns the mark and
-- the last tick in force, and the fences raised (bits 1 seq, 2 mark, 4 last tick).
local function fence_counters(mark, last)
  if not ARGV[9] then
    return mark, last, 0
  end
  local seq = redis.call('GET', seqKey)
  local r1, r2, r4 = 0, 0, 0
  if seq then
    seq, r1 = fence(seqKey, tonumber(seq), tonumber(ARGV[7]), ARGV[8], ttl)
    if redis.call('EXISTS', markKey) == 1 then
      mark, r2 = fence(markKey, mark, tonumber(ARGV[6]), ARGV[6], ttl)
    end
    if last >= 0 then
      last, r4 = fence(lastTickKey, last, tonumber(ARGV[9]), ARGV[9], ttl)
    end
  end
  return mark, last, r1 + 2 * r2 + 4 * r4
end

-- The tick this call admits in: nil for a new tick; the tick an earlier slice of this caller
-- started, from its continuation (ARGV[16]): before = the mark when it started, at = its first
-- call's time, sofar = admitted in it by the earlier slices, prev = the mark they left; false
-- when this call admits nothing (the tick was advanced already, or the continuation is stale).
local function tick_to_work_in(last)
  local cont = ARGV[16] or ''
  if cont == '' then
    if tick <= last then
      return false
    end
    return nil
  end
  local ct, cb, ca, cs, cm = string.match(cont, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
  if not ct or tonumber(ct) ~= tick or last ~= tick or redis.call('LINDEX', admissions, 0) ~= ct .. ':' .. cs then
    return false
  end
  return {before = tonumber(cb), at = tonumber(ca), sofar = tonumber(cs), prev = tonumber(cm)}
end

-- The sale's part of the tick (prelude.lua's sale_phase): closes a sale whose `closes_at` has
-- passed, freezes the pre-queue at or after `opens_at` (a sale closed before its opening was
-- done is frozen all the same; enter.lua freezes in P_OPENING only), tells the log the
-- pre-queue is open. true when the sale holds admission: then a gathering pre-queue (and the
-- sale) is kept alive while nobody is admitted; a closed sale's keys expire as an empty
-- queue's do.
local function sale_holds_tick()
  local phase, sale = sale_phase(saleKey, now)
  if phase == P_CLOSED and sale.closed ~= '1' then
    redis.call('HSET', saleKey, 'closed', 1, 'close_source', 'schedule', 'closed_at', now)
    sale_event(ledger, ledgerMax, ttl, rec, recTtl, ledger_row('close', now, 'schedule', sale.message or ''), log)
  end
  if sale.opens_at and now >= tonumber(sale.opens_at) and not sale.opened_at then
    freeze_prequeue(saleKey, sale, seqKey, preKey, openKey, nil, now, ttl)
  end
  if phase == P_PRE_QUEUE and log and redis.call('HSETNX', saleKey, 'prequeue_told', now) == 1 then
    event_add(log, ledger_row('prequeue', now, sale.opens_at, sale.prequeue_from))
  end
  if not sale_holds_admission(phase, sale) then
    return false
  end
  if phase ~= P_CLOSED then
    for _, k in ipairs({waiting, markKey, heartbeat, seqKey, departed, preKey, openKey}) do
      redis.call('EXPIRE', k, ttl)
    end
    redis.call('EXPIRE', saleKey, ttl, 'GT')
  end
  return true
end

-- The slice: the next `want` users still waiting above `mark` ({user, seq, ...}), and the mark
-- moved to the last of them. The departed seqs it passed change no answer (every count is
-- above the mark): at most `drop` are dropped per call, so a mark that passes a long run of
-- them costs no long call.
local function take_slice(mark, want, drop)
  local front = redis.call('ZRANGEBYSCORE', waiting, '(' .. mark, '+inf', 'WITHSCORES', 'LIMIT', 0, want)
  if #front == 0 then
    return front, mark
  end
  mark = tonumber(front[#front])
  redis.call('SET', markKey, mark, 'EX', ttl)
  local passed = redis.call('ZCOUNT', departed, '-inf', mark)
  if passed > 0 then
    redis.call('ZREMRANGEBYRANK', departed, 0, math.min(passed, drop) - 1)
  end
  return front, mark
end

-- The waits of the slice's users, entry -> admission, in ms, and their histogram (buckets by
-- the prelude's wait_bucket -> users). A seq's entry time is that of the enter.lua call that
-- gave it: the member of entry_times with the greatest first seq at or below it, if its range
-- holds the seq (seqs given by an older vq have no entry time). One member per enter call: at
-- most one per admitted user, bar calls whose users all departed; at most `drop` are read (a
-- seq past them counts no wait).
local function waits_of(front, mark, drop)
  local w = {list = {}, hist = {}, sum = 0, counted = 0, longest = -1}
  local lowest = tonumber(front[2])
  local recs = redis.call('ZREVRANGEBYSCORE', entryTimes, lowest, '-inf', 'LIMIT', 0, 1)
  for _, r in ipairs(redis.call('ZRANGEBYSCORE', entryTimes, '(' .. lowest, mark, 'LIMIT', 0, drop)) do
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
      local ms = math.max(0, now - at[k])
      local b = wait_bucket(math.floor(ms / 1000), edges)
      w.hist[b] = (w.hist[b] or 0) + 1
      w.longest = math.max(w.longest, ms)
      w.sum = w.sum + ms
      w.counted = w.counted + 1
      w.list[w.counted] = ms
    end
  end
  return w
end

-- Entry times of seqs the mark passed are not needed again (at most `drop` go per call); the
-- member whose range holds the next seq stays.
local function drop_entry_times(mark, drop)
  local keep = redis.call('ZREVRANGEBYSCORE', entryTimes, mark + 1, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #keep > 0 then
    local old = redis.call('ZCOUNT', entryTimes, '-inf', '(' .. keep[2])
    if old > 0 then
      redis.call('ZREMRANGEBYRANK', entryTimes, 0, math.min(old, drop) - 1)
    end
  end
end

-- The slice's waits added to the target's histogram (KEYS[7]); returns the users admitted in
-- all, this slice's included.
local function count_waits(w, admitted)
  for b, c in pairs(w.hist) do
    redis.call('HINCRBY', waitsKey, 'b:' .. b, c)
  end
  redis.call('HINCRBY', waitsKey, 'count', w.counted)
  redis.call('HINCRBY', waitsKey, 'sum_ms', w.sum)
  return redis.call('HINCRBY', waitsKey, 'admitted', admitted)
end

-- Milestones in the event log: the first users admitted, and each multiple of ARGV[14] passed
-- by the users admitted in all (`all`, this slice's `admitted` included).
local function announce_milestones(all, admitted)
  local every, was = tonumber(ARGV[14]), all - admitted
  if was == 0 then
    event_add(log, ledger_row('admitted', now, all, 'first'))
  end
  if every > 0 and math.floor(was / every) < math.floor(all / every) then
    event_add(log, ledger_row('admitted', now, all, 'every'))
  end
end

-- The line is gone: the tick before filled its batch, this one (`total` admitted in it) does
-- not. Judged by the tick's last slice.
local function announce_line_gone(cont, total, batch, mark)
  local prev = redis.call('LINDEX', admissions, cont and 1 or 0)
  if prev and tonumber(string.match(prev, ':(%d+)$')) >= batch then
    event_add(log, ledger_row('emptied', now, mark))
  end
end

-- The tick's admissions entry (KEYS[5], "tick:count"): pushed by its first slice, rewritten
-- by the later ones; the last ARGV[12] ticks kept.
local function note_admissions(cont, total, admitted)
  if cont then
    redis.call('LSET', admissions, 0, tick .. ':' .. total)
  else
    redis.call('LPUSH', admissions, tick .. ':' .. admitted)
    redis.call('LTRIM', admissions, 0, tonumber(ARGV[12]) - 1)
  end
end

-- The slice in the sale's record (prelude.lua's record_incr): admitted per tick and in all,
-- the waits as in KEYS[7], the tick's length and the longest wait.
local function record_tick(w, admitted)
  local f = {'t:' .. tick, admitted, 'admitted', admitted, 'wc', w.counted, 'ws', w.sum}
  for b, c in pairs(w.hist) do
    f[#f + 1], f[#f + 2] = 'wb:' .. b, c
  end
  record_incr(rec, recTtl, f)
  redis.call('HSET', rec, 'tick_ms', ARGV[2])
  if w.longest > tonumber(redis.call('HGET', rec, 'wmax') or '-1') then
    redis.call('HSET', rec, 'wmax', w.longest)
  end
end

-- One ledger row per tick: a later slice rewrites the row its tick's earlier slices wrote
-- (unless another row, a pause say, came in between: then its part gets a row of its own).
local function ledger_tick(cont, before, at, sofar, mark, total, admitted)
  local row = ledger_row('admit', at, before, mark, total, instance)
  if cont and sofar > 0 and redis.call('LINDEX', ledger, 0) == ledger_row('admit', at, before, cont.prev, sofar, instance) then
    redis.call('LSET', ledger, 0, row)
  elseif cont then
    ledger_push(ledger, ledger_row('admit', now, cont.prev, mark, admitted, instance), ledgerMax, ttl)
  else
    ledger_push(ledger, row, ledgerMax, ttl)
  end
end

-- The sliding TTL: while anyone waits, every tick keeps all of the target's keys alive
-- (enter and poll do not refresh them); 30 min after the queue empties they expire.
local function keep_alive(admitted)
  if saleKey then
    redis.call('EXPIRE', saleKey, ttl, 'GT')
  end
  if admitted > 0 or redis.call('ZCARD', waiting) > 0 then
    for _, k in ipairs({waiting, markKey, admissions, entryTimes, waitsKey, heartbeat, seqKey, evicted, departed}) do
      redis.call('EXPIRE', k, ttl)
    end
  else
    redis.call('EXPIRE', admissions, ttl)
  end
end

-- vq:call: what runs on every call.
waiting, markKey, lastTickKey, batchKey, admissions = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
entryTimes, waitsKey, heartbeat, seqKey, evicted = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
departed, saleKey, preKey, openKey = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
ledger, rec = KEYS[15], KEYS[16]
now = now_ms()
tick = math.floor(now / tonumber(ARGV[2]))
ttl = tonumber(ARGV[3])
instance, ledgerMax = ARGV[4] or '', ARGV[5]
recTtl = tonumber(ARGV[10] or '0')
log = event_log(KEYS[17], ARGV[13], recTtl)
local mark = tonumber(redis.call('GET', markKey) or '0')
local batch = tonumber(redis.call('GET', batchKey) or ARGV[1])
local last = tonumber(redis.call('GET', lastTickKey) or '-1')
local fenced
mark, last, fenced = fence_counters(mark, last)
-- A sharded target's plan: this shard admits only in the plan's tick, its share in place of the
-- batch.
if ARGV[17] then
  if tonumber(ARGV[17]) ~= tick then
    return {0, mark, tick, 0, batch, '', fenced, 0, ''}
  end
  batch = tonumber(ARGV[18])
end
local cont = tick_to_work_in(last)
if cont == false or (saleKey and sale_holds_tick()) then
  return {0, mark, tick, 0, batch, '', fenced, 0, ''}
end
local before, at, sofar = mark, now, 0
if cont then
  before, at, sofar = cont.before, cont.at, cont.sofar
else
  redis.call('SET', lastTickKey, tick, 'EX', ttl)
end
local want = math.max(0, math.min(tonumber(ARGV[15] or '') or batch, batch - sofar))
local drop = 4 * math.max(want, 250)
local front
front, mark = take_slice(mark, want, drop)
local admitted = #front / 2
local total = sofar + admitted
local more = (want > 0 and admitted == want and total < batch) and 1 or 0
local w = {list = {}}
if admitted > 0 then
  w = waits_of(front, mark, drop)
  drop_entry_times(mark, drop)
  local all = count_waits(w, admitted)
  if log and not ARGV[17] then
    announce_milestones(all, admitted)
  end
  redis.call('EXPIRE', waitsKey, ttl)
end
if log and not ARGV[17] and more == 0 and total < batch then
  announce_line_gone(cont, total, batch, mark)
end
note_admissions(cont, total, admitted)
if rec and admitted > 0 then
  record_tick(w, admitted)
end
if ledger and admitted > 0 then
  ledger_tick(cont, before, at, sofar, mark, total, admitted)
end
keep_alive(admitted)
local continuation = ''
if more == 1 then
  continuation = table.concat({tick, before, at, total, mark}, ':')
end
return {1, mark, tick, admitted, batch, table.concat(w.list, ','), fenced, more, continuation}
