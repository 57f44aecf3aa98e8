-- prelude.lua: what the scripts share, written once. vq loads it once per Redis node, at the
-- head of its library of functions (one per script), or sends it in front of a script where
-- Redis refuses functions (src/store/redis/scripts.rs).
--
-- One clock: every time a script compares or stores (heartbeats, entry times, ticks, the
-- sale's instants, expiries) is Redis' own TIME, never an instance's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
--
-- Numbers cost Redis' Lua dearly: `tonumber` of a string is a strtod (~1,000 instructions), and
-- a number formatted (concatenated, or an argument of `redis.call`) an sprintf (~3,000). So an
-- argument that is a setting, the same call after call (the capacity, a TTL, the tick), is
-- parsed with `num`, which keeps what it parsed; a count is formatted with `str`, which keeps
-- what it formatted; and a value only handed on to Redis stays the string it came as. Where vq
-- loads its library of functions the kept values last until the library is loaded again (at
-- most keptMax of each); where a script goes with this prelude in front (EVAL), for the call.
local keptMax = 1024
-- An empty table for what a call reads when it has nothing to read (never written).
local NONE = {}
-- `make` of a key, kept for the next call (at most keptMax keys, then it starts again).
local function kept(make)
  local values, count = {}, 0
  return function(key)
    local v = values[key]
    if v == nil then
      v = make(key)
      if count >= keptMax then
        values, count = {}, 0
      end
      values[key], count = v, count + 1
    end
    return v
  end
end
-- (Wrapped: the library's load sees Redis' API alone; Lua's own functions exist at call time.)
local num = kept(function(s) return tonumber(s) end)
local str = kept(function(n) return tostring(n) end)
-- Whole numbers that differ call after call, counted up one at a time (a call's new seqs:
-- nothing to keep), as decimal strings: `run(n)` is n's. The tens' string comes from
-- `string.format`'s integer path (an sprintf of `%d`, where `tostring`, a concatenation or a
-- number argument of `redis.call` formats a number as a float), once per ten numbers; each
-- number joins it and its last digit.
local DIGIT = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
local function int_run()
  local tens, head = -1, ''
  return function(n)
    local d = n % 10
    local t = (n - d) / 10
    if t ~= tens then
      tens, head = t, t > 0 and string.format('%d', t) or ''
    end
    return head .. DIGIT[d]
  end
end
--
-- The per-user reply codes (Rust: `scripts::Code`, checked against these lines by its tests).
local WAITING = 1
local ADMITTED = 2
local FULL = 3
local NOT_IN_QUEUE = 4
local ISSUE = 5
local PRE_QUEUE = 6
local SCHEDULED = 7
local CLOSED = 8
local TOO_MANY = 9
-- The sale's phases in the replies' trailing items.
local NO_SALE = 0
local P_SCHEDULED = 1
local P_PRE_QUEUE = 2
local P_OPENING = 3
local P_OPEN = 4
local P_CLOSED = 5

-- The gate's mark on a token key (`queue:{T}:token:{user}`): "used:<token>" once a purchase
-- claimed it (token_claim.lua, undone by token_release.lua). Rust reads it through
-- `store::redis::keys::used_token`.
local USED_MARK = 'used:'
local function used_mark(token)
  return USED_MARK .. token
end

-- A token marked used by the gate is still this user's token: a reuse gets 403 at the gate,
-- not a second place here.
local function stored_token(tok)
  if string.sub(tok, 1, #USED_MARK) == USED_MARK then
    return string.sub(tok, #USED_MARK + 1)
  end
  return tok
end

-- A user's used tokens whose mark their token key no longer holds (`queue:{T}:used:{user}`,
-- ZSET token -> expiry ms), named from their token key as `keys::used_tokens` names it: the
-- same hash tag, so the same slot. (A tag holds no '}': the first "}:token:" ends it.)
local function used_key(tokenKey)
  local at = string.find(tokenKey, '}:token:', 1, true)
  return string.sub(tokenKey, 1, at) .. ':used:' .. string.sub(tokenKey, at + 8)
end

-- Keeps the used mark `mark` that `tokenKey` holds, about to be replaced, among the user's used
-- tokens until the mark would have expired (`fallbackMs` from now for a mark without an
-- expiry): that token stays used, whatever the key holds next. Members past their expiry go.
local function used_mark_keep(tokenKey, mark, now, fallbackMs)
  local left = redis.call('PTTL', tokenKey)
  if left == -1 then
    left = fallbackMs
  end
  if left > 0 then
    local used = used_key(tokenKey)
    redis.call('ZREMRANGEBYSCORE', used, '-inf', now)
    redis.call('ZADD', used, now + left, stored_token(mark))
    local last = redis.call('ZRANGE', used, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', used, tonumber(last[2]))
  end
end

-- The sale's hash (queue:{T}:sale) as the scripts read it: `sale_read` gives its fields by
-- name (`sale.opens_at`: a string, nil when absent), read in one HMGET of these fields. Rust:
-- `codec::SALE_FIELDS`, the same list (checked by the tests of src/store/redis/scripts.rs and
-- tests/it/scripts.rs). A new field is added to SALE_FIELDS and to sale_read's table, at the
-- same place (the tests hold the two together): one table made whole costs a call less than
-- one filled field by field or read through a metatable. These are the fields the scripts
-- decide by (sale_place.lua reads the seed and commitment it publishes with its own HMGET).
local SALE_FIELDS = {'opens_at', 'prequeue_from', 'closes_at', 'paused', 'closed', 'message', 'frozen', 'opened_at'}
local function sale_read(saleKey)
  local v = redis.call('HMGET', saleKey, unpack(SALE_FIELDS))
  return {
    opens_at = v[1] or nil, prequeue_from = v[2] or nil, closes_at = v[3] or nil, paused = v[4] or nil,
    closed = v[5] or nil, message = v[6] or nil, frozen = v[7] or nil, opened_at = v[8] or nil,
  }
end

-- The sale's hash (sale_read's table) and its phase at `clock` (now_ms()): NO_SALE without a
-- schedule or a close (a pause alone is not a sale: its hash still says `paused`); P_OPENING
-- once `opens_at` has passed and before the opening has placed everyone (enter.lua and
-- admit.lua freeze the pre-queue then; status.lua never does). Rust:
-- `domain::SaleRecord::phase`, checked against this function by tests/it/scripts.rs.
local function sale_phase(saleKey, clock)
  if not saleKey then
    return NO_SALE, nil
  end
  local sale = sale_read(saleKey)
  if not (sale.opens_at or sale.closes_at or sale.closed) then
    return NO_SALE, sale
  end
  local opens = tonumber(sale.opens_at or '0')
  if sale.closed == '1' or (sale.closes_at and clock >= tonumber(sale.closes_at)) then
    return P_CLOSED, sale
  elseif opens == 0 or sale.opened_at then
    return P_OPEN, sale
  elseif clock < tonumber(sale.prequeue_from or sale.opens_at) then
    return P_SCHEDULED, sale
  elseif clock < opens then
    return P_PRE_QUEUE, sale
  end
  return P_OPENING, sale
end

-- Whether nobody is admitted: before the opening is done, closed, or paused (a pause needs
-- no schedule). Rust: `domain::SaleRecord::holds_admission`.
local function sale_holds_admission(phase, sale)
  return (phase ~= NO_SALE and phase ~= P_OPEN) or (sale ~= nil and sale.paused == '1')
end

-- The opening freezes the pre-queue, once (`sale.frozen` says it was): the pre-queue
-- becomes the `opening` set (RENAME), N = its size, and the seq counter moves past N, so its
-- users get seqs base+1 .. base+N and entries from then on come after every one of them.
-- Called by whichever of enter.lua and admit.lua runs first at or after `opens_at`. `base` is
-- the seq counter (nil: read here). Returns the seq counter after the freeze.
local function freeze_prequeue(saleKey, sale, seqKey, preKey, openKey, base, now, ttl)
  base = base or tonumber(redis.call('GET', seqKey) or '0')
  if sale.frozen then
    return base
  end
  local frozen = redis.call('ZCARD', preKey)
  if frozen > 0 then
    redis.call('RENAME', preKey, openKey)
  end
  redis.call('SET', seqKey, base + frozen, 'EX', ttl)
  redis.call('HSET', saleKey, 'frozen', frozen, 'base', base, 'frozen_at', now)
  sale.frozen = tostring(frozen)
  return base + frozen
end

-- The histogram bucket (its lower bound, s) of a wait of `s` whole seconds. `edges` is
-- `domain::stats::WAIT_BUCKETS` as Rust sends it ("below:width ..."; see `wait_bucket_edges`):
-- below each `below`, buckets `width` s wide; from the last `below` on, one bucket.
local function wait_bucket_edges(arg)
  local edges = {}
  for below, width in string.gmatch(arg, '(%d+):(%d+)') do
    edges[#edges + 1] = {tonumber(below), tonumber(width)}
  end
  return edges
end
local function wait_bucket(s, edges)
  for _, e in ipairs(edges) do
    if s < e[1] then
      return math.floor(s / e[2]) * e[2]
    end
  end
  return edges[#edges][1]
end

-- The stored tokens of the users not waiting (admitted before, new or unknown): toks[i] is user
-- i's, token keys being KEYS[first + i]. enter.lua, whose users are mostly new, reads every
-- user's token key in its first MGET, with the target's counters (one command where two
-- were), and passes it as `got` (user i's at `got[skip + i]`); status.lua, whose users mostly
-- wait, passes none and the keys of the others are read here, with those of the users `due`
-- names (due[i] true: the mark has reached their seq, and issue_tokens is about to set their
-- token key): toks[i] is theirs too.
local function tokens_of(seqs, n, first, got, skip, due)
  local toks = {}
  if got then
    -- Only the tokens found: an absent one (false) would grow the table for nothing.
    for i = 1, n do
      if not seqs[i] and got[skip + i] then
        toks[i] = got[skip + i]
      end
    end
    return toks
  end
  local keys, users = {}, {}
  for i = 1, n do
    if not seqs[i] or (due and due[i]) then
      keys[#keys + 1], users[#users + 1] = KEYS[first + i], i
    end
  end
  if #keys > 0 then
    local read = redis.call('MGET', unpack(keys))
    for k, i in ipairs(users) do
      toks[i] = read[k]
    end
  end
  return toks
end

-- Users ahead of a waiting user: every seq between the mark and theirs was given to a user
-- who is still waiting or departed (left, evicted); admission only takes seqs at or below the
-- mark. So the count is arithmetic plus the departed in between, without a rank.
local function ahead_counter(departedKey, mark)
  local departed = redis.call('ZCARD', departedKey)
  return function(seq)
    local gone = 0
    if departed > 0 then
      gone = redis.call('ZCOUNT', departedKey, '(' .. mark, '(' .. seq)
    end
    return math.max(0, seq - mark - 1 - gone)
  end
end

-- The answer every poll and enter gives a user the queue knows, or who holds a token, or to
-- anyone once the sale is closed: code, a, b, and whether the user's heartbeat is refreshed;
-- nil when the caller decides (a new or unknown user).
local function known_answer(seq, tok, mark, phase, ahead)
  if seq and seq <= mark then
    return ISSUE, seq, 0, false
  elseif seq and phase ~= P_CLOSED then
    return WAITING, seq, ahead(seq), true
  elseif tok then
    return ADMITTED, stored_token(tok), 0, false
  elseif phase == P_CLOSED then
    return CLOSED, 0, 0, false
  end
  return nil
end

-- Waiting users' heartbeats (`queue:{T}:beats`, a STRING): one unsigned 32-bit field per seq,
-- at byte 4*seq (BITFIELD u32 #seq), holding the time of the user's last poll in slots of
-- BEAT.ms of Redis' clock (modulo 2^32 - 1, plus one: the tags wrap after about 16 months). 0 is
-- no heartbeat to keep: a seq not given yet, departed or evicted. Four bytes per seq where a
-- ZSET entry took ~95, and a poll's heartbeat is an O(1) write, not a move within a skiplist of
-- every waiting user. Users without a seq (pre-queued, frozen at the opening) keep theirs in
-- `queue:{T}:heartbeat`, a ZSET by time.
local BEAT = {ms = 10, wrap = 4294967295, type = 'u32', bytes = 4}
local function beat_tag(ms)
  return math.floor(ms / BEAT.ms) % BEAT.wrap + 1
end
-- Sets the heartbeat of each seq in `seqs` (numbers or their strings) to `tag` (0 forgets them),
-- one BITFIELD per 1500. The tag goes as one string: a number argument costs Redis a
-- conversion per user.
local function beats_set(key, seqs, tag)
  tag = tostring(tag)
  local n, typ = #seqs, BEAT.type
  for from = 1, n, 1500 do
    -- k counts the arguments: the length operator is a search each time it is asked.
    local part, k = {}, 0
    for i = from, math.min(from + 1499, n) do
      part[k + 1], part[k + 2], part[k + 3], part[k + 4] = 'SET', typ, '#' .. seqs[i], tag
      k = k + 4
    end
    redis.call('BITFIELD', key, unpack(part, 1, k))
  end
end

-- The queues each user holds a place in (`queue.max_queues_per_user`): HASHes of one field per
-- user ("TARGET=ms TARGET=ms ...", the ms each target was counted), in generations of `len` ms
-- of Redis' clock (user_hold.lua says why). vq names three generations, g-1, g and g+1 (g by its
-- own clock); this is the one of the three that is Redis' current one at `now` (1, 2 or 3).
local function hold_generation(now, g, len)
  return math.min(3, math.max(1, math.floor(now / len) - g + 2))
end
-- A generation's mark: a field no user id can be (an empty one), written with the key's expiry
-- by the first enter.lua call that writes the generation. The other fields come and go (a user
-- whose last target is dropped loses theirs) but the mark stays, so the key is never emptied
-- and made again without an expiry, and an enter that finds the mark sets no expiry.
local HOLD_MARK = ''

-- Drops `target` from the queues `user` holds, in the same call that ends their place there (a
-- token issued, a leave) on a single server, where user_hold.lua would take a call of its own:
-- the same field and generations (`gens`: the keys of g-1, g and g+1; `g`, `len` as above). A
-- field found in the previous generation only moves to the current one, as user_hold.lua moves it.
local function hold_drop(gens, user, target, now, g, len)
  local cur = hold_generation(now, g, len)
  local v, moved = redis.call('HGET', gens[cur], user), false
  if not v and cur > 1 then
    v, moved = redis.call('HGET', gens[cur - 1], user), true
  end
  if not v then
    return
  end
  local kept, found = {}, false
  for t, ms in string.gmatch(v, '([^ =]+)=(%d+)') do
    if t == target then
      found = true
    else
      kept[#kept + 1] = t .. '=' .. ms
    end
  end
  if not (found or moved) then
    return
  end
  if #kept > 0 then
    redis.call('HSET', gens[cur], user, table.concat(kept, ' '))
    -- Kept through the next generation, where it is read as the previous one.
    redis.call('PEXPIREAT', gens[cur], (g + cur) * len)
  elseif not moved then
    redis.call('HDEL', gens[cur], user)
  end
  if moved then
    redis.call('HDEL', gens[cur - 1], user)
  end
end
-- Sets the heartbeats of `count` consecutive seqs from `from` to `tag`: one SETRANGE of their
-- fields side by side (BITFIELD's u32 is big-endian), where beats_set sends four arguments a
-- seq. New users' seqs are consecutive.
local function beats_set_run(key, from, count, tag)
  local b = string.char(math.floor(tag / 16777216) % 256, math.floor(tag / 65536) % 256, math.floor(tag / 256) % 256, tag % 256)
  redis.call('SETRANGE', key, BEAT.bytes * from, string.rep(b, count))
end

-- Pacing (gate_pace.lua; token_claim.lua with a purchase's first reservation): reserves one
-- purchase a place in the earliest tick of Redis' clock, from the one `guard` ms from now to
-- `ahead` ticks later, whose count in `key` (HASH tick -> purchases reserved) is still under
-- `budget` (`pace_budget`). Returns the tick reserved, ms until it starts and ms until it ends;
-- or nil and ms until the next tick when every one is full.
-- A tick's budget of purchases: `batchKey`'s runtime batch size, else `default` (a string).
local function pace_budget(batchKey, default)
  return num(redis.call('GET', batchKey) or default)
end

local function pace_reserve(key, budget, now, tick_ms, guard, ahead)
  local first = math.floor((now + guard) / tick_ms)
  for tick = first, first + ahead do
    local n = redis.call('HINCRBY', key, str(tick), '1')
    if n <= budget then
      -- A tick's first reservation tidies the hash (the ticks before the last two go) and
      -- extends its life: once per tick, not per purchase.
      if n == 1 then
        redis.call('HDEL', key, first - 2, first - 3)
        redis.call('PEXPIRE', key, tick_ms * (ahead + 4))
      end
      return tick, math.max(0, tick * tick_ms - now), (tick + 1) * tick_ms - now
    end
    redis.call('HINCRBY', key, str(tick), '-1')
  end
  return nil, (math.floor(now / tick_ms) + 1) * tick_ms - now
end

-- Fences: after a failover that lost the last writes, Redis may hold a counter (the seq
-- counter, the admission mark, the last tick) below a value an instance has already seen and
-- told buyers about. The instance sends the highest value it has seen (`seen`); a counter below
-- it is raised to `to` (≥ seen) and never goes back, so no seq is handed out twice and no
-- admitted user is told WAITING again. Returns the value in force and 1 when it was raised.
-- `seen` is a number; `to` and `ttl` are the callers' argument strings, read only when the
-- counter is raised.
local function fence(key, value, seen, to, ttl)
  if value < seen then
    redis.call('SET', key, to, 'EX', ttl)
    return tonumber(to), 1
  end
  return value, 0
end

-- The sale's five trailing items of a reply: phase, opens_at, prequeue_from, paused, message.
local function sale_tail(out, phase, sale)
  local nn = #out
  out[nn + 1], out[nn + 2] = phase, tonumber(sale.opens_at or '0')
  out[nn + 3], out[nn + 4] = tonumber(sale.prequeue_from or '0'), sale.paused == '1' and 1 or 0
  out[nn + 5] = sale.message or ''
end

-- The sale's record (queue:{T}:record, HASH; `domain::TargetRecord` reads it): counters per tick
-- and totals, written by the script that sees each event and kept `queue.record_ttl_days`
-- after its last write, so it outlives the queue keys. `fields` alternates field, increment.
local function record_incr(rec, ttl, fields)
  for i = 1, #fields, 2 do
    redis.call('HINCRBY', rec, fields[i], fields[i + 1])
  end
  redis.call('EXPIRE', rec, ttl)
end

-- Stores the tokens of users found admitted (their seq at or below the mark) and takes them
-- out of the queue: `issued` lists them as {user, token, token key, what the key holds or
-- false}. Each token key is set (EX `ttl` s): a used mark it holds, of a token that bought
-- while its user waited, moves to their used tokens first (`used_mark_keep`); the mark of this
-- very token stays, and the token is not among the unused ones. Then, once for all of them,
-- their places, the counts of tokens issued and the unused tokens' expiry; with `hold`
-- ({gens, target, g, len}) the target leaves the queues each holds (`hold_drop`). `k` names
-- the keys: waiting, heartbeat, waits, record, unused. issue.lua (one user) and status.lua
-- (every poll of its call that finds its user admitted) store tokens so: a call's admitted
-- users share its writes, where each took nine. `ttl` and `recordTtl` come as the callers'
-- ARGV strings: Redis reads a string argument as it is, where a Lua number is formatted first
-- (an snprintf each).
local function issue_tokens(k, issued, ttl, recordTtl, now, hold)
  local users, unused = {}, {}
  local expires = string.format('%.0f', now + num(ttl) * 1000)
  for i, e in ipairs(issued) do
    local v = e[4]
    -- A token is its user, target and expiry signed: one handed out outside the queue in the
    -- same second is this string, and when it bought its mark stays.
    if v ~= used_mark(e[2]) then
      if v and v ~= stored_token(v) then
        used_mark_keep(e[3], v, now, num(ttl) * 1000)
      end
      redis.call('SET', e[3], e[2], 'EX', ttl)
      unused[#unused + 1], unused[#unused + 2] = expires, e[1]
    end
    if hold then
      hold_drop(hold[1], e[1], hold[2], now, hold[3], hold[4])
    end
    users[i] = e[1]
  end
  local count = str(#issued)
  redis.call('ZREM', k.waiting, unpack(users))
  redis.call('ZREM', k.heartbeat, unpack(users))
  redis.call('HINCRBY', k.waits, 'tokens_issued', count)
  record_incr(k.record, recordTtl, {'ti', count})
  redis.call('HSET', k.record, 'ti_last', now)
  if #unused > 0 then
    redis.call('ZADD', k.unused, unpack(unused))
    redis.call('EXPIRE', k.unused, str(num(ttl) + 600))
  end
end

-- One of the sale's events in its record (a ledger row: schedule, open, pause, resume, close,
-- clear) as field e:<n>: the ledger's admission rows push old rows out, the record keeps these.
local function record_event(rec, ttl, row)
  local n = redis.call('HINCRBY', rec, 'events', 1)
  redis.call('HSET', rec, 'e:' .. n, row)
  redis.call('EXPIRE', rec, ttl)
end

-- A ledger row (queue:{T}:ledger; decoded by `store::redis::codec`): its fields joined by
-- '|', the kind first, then the time in ms (the last field may hold '|').
local function ledger_row(...)
  return table.concat({...}, '|')
end

-- Pushes `row` onto the ledger (newest first), keeps its newest `max` rows
-- (`store::LEDGER_MAX_ROWS`, sent by Rust) and, with `ttl`, gives it that lifetime (s).
local function ledger_push(ledger, row, max, ttl)
  redis.call('LPUSH', ledger, row)
  redis.call('LTRIM', ledger, 0, tonumber(max) - 1)
  if ttl then
    redis.call('EXPIRE', ledger, ttl)
  end
end

-- The target's event log (queue:{T}:events, a STREAM that `vq events` and the webhooks read;
-- decoded by `store::redis::codec::decode_event_row`): `key`, about `max` entries kept
-- (`events.max_len`), `ttl` s after its last entry. nil without the key, or with `max` 0 (a
-- shard after a target's first: the target's log is its first shard's): no log.
local function event_log(key, max, ttl)
  if key and tonumber(max) > 0 then
    return {key = key, max = max, ttl = ttl}
  end
  return nil
end

-- Appends `row` (a ledger row, or one of the kinds only the log has: prequeue, admitted,
-- emptied) to the event log `log` (event_log's), in the step that made the change: each
-- change is in the log once, in the order the changes happened.
local function event_add(log, row)
  if log then
    redis.call('XADD', log.key, 'MAXLEN', '~', log.max, '*', 'row', row)
    redis.call('EXPIRE', log.key, log.ttl)
  end
end

-- A change of the sale (schedule, open, pause, resume, close, clear): a ledger row, the
-- same row as an event of the record when the record's key is given, and in the event log
-- `log` when given.
local function sale_event(ledger, max, ttl, rec, recTtl, row, log)
  ledger_push(ledger, row, max, ttl)
  if rec then
    record_event(rec, recTtl, row)
  end
  event_add(log, row)
end

-- A flag acknowledgement as stored (virtual-queue:acks, instance -> value; decoded by
-- `store::FlagAck`): "version:applied_at_ms:expires_at_ms:missing:state".
local function ack_value(version, applied_at, expires_at, missing, state)
  return version .. ':' .. applied_at .. ':' .. string.format('%.0f', expires_at) .. ':' .. missing .. ':' .. state
end

-- An acknowledgement's version, time applied, expiry (numbers) and the rest (":missing:state",
-- or '' from an older vq); nil when it does not parse.
local function ack_parse(value)
  local ver, at, exp, rest = string.match(value, '^(%d+):(%d+):(%d+)(.*)$')
  if not exp then
    return nil
  end
  return ver, at, tonumber(exp), rest
end
