-- sale_control.lua: pause, resume, close or clear a target's sale, and record it in the ledger.
--
-- Works on a target without a schedule too: pausing or closing an always-open target.
--
-- KEYS[1] queue:{T}:sale       HASH the sale (resume sets resumed_at, ms)
-- KEYS[2] queue:{T}:ledger     LIST ledger rows, newest first
-- KEYS[3] queue:{T}:prequeue   ZSET pre-queued users (deleted by clear)
-- KEYS[4] queue:{T}:opening    ZSET frozen pre-queue (deleted by clear)
-- KEYS[5] queue:{T}:record     HASH the sale's record: the change as an event (prelude.lua)
-- KEYS[6] queue:{T}:events     STREAM the event log: the change (prelude.lua's event_add)
-- KEYS[7] queue:{T}:bought     HASH purchases per user (token_claim.lua; deleted by clear: a
--                              new sale counts each user's purchases from zero)
-- ARGV[1] action: pause | resume | close | clear
-- ARGV[2] source: source: command | schedule | purchase-api
-- ARGV[3] message: close message ('' otherwise)
-- ARGV[4] key_ttl_s: key ttl seconds
-- ARGV[5] ledger_max: ledger rows kept
-- ARGV[6] record_ttl_s: record ttl seconds (also the event log's)
-- ARGV[7] force: clear only: 1 to clear whatever it drops; 0 to refuse while it would drop users
--         (pre-queued before the opening, or being given their places at the opening)
-- ARGV[8] events_max: event log entries kept (`events.max_len`); 0 on a shard after the
--                      first: no log (the target's is its first shard's)
-- returns {1} when the state changed, {0} when it already was so (nothing recorded), and
-- {2, opening, users} when a clear was refused: opening 1 in P_OPENING, 0 before it,
-- users = those in the pre-queue (or the frozen one). The check and the clear are one step:
-- no user pre-queues between them.
local now = now_ms()
local ttl = tonumber(ARGV[4])
local action, source = ARGV[1], ARGV[2]
local row
if action == 'pause' then
  if redis.call('HGET', KEYS[1], 'paused') == '1' then
    return {0}
  end
  redis.call('HSET', KEYS[1], 'paused', 1)
  row = ledger_row('pause', now, source)
elseif action == 'resume' then
  if redis.call('HDEL', KEYS[1], 'paused') == 0 then
    return {0}
  end
  -- When admission restarted: vq stats judges the rate from then on.
  redis.call('HSET', KEYS[1], 'resumed_at', now)
  row = ledger_row('resume', now, source)
elseif action == 'close' then
  if redis.call('HGET', KEYS[1], 'closed') == '1' then
    return {0}
  end
  redis.call('HSET', KEYS[1], 'closed', 1, 'close_source', source, 'closed_at', now, 'message', ARGV[3])
  row = ledger_row('close', now, source, ARGV[3])
elseif action == 'clear' then
  if ARGV[7] ~= '1' then
    local phase = sale_phase(KEYS[1], now)
    local users = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
    if phase == P_OPENING or ((phase == P_SCHEDULED or phase == P_PRE_QUEUE) and users > 0) then
      return {2, phase == P_OPENING and 1 or 0, users}
    end
  end
  redis.call('UNLINK', KEYS[7])
  -- UNLINK: a pre-queue of a million users is freed off the main thread.
  if redis.call('UNLINK', KEYS[1], KEYS[3], KEYS[4]) == 0 then
    return {0}
  end
  row = ledger_row('clear', now, source)
else
  return redis.error_reply('unknown sale action ' .. action)
end
-- A hash made here (a pause or close without a schedule) lives the key ttl, and the pump's
-- ticks extend it while the target is active; a scheduled one keeps its longer expiry.
if action ~= 'clear' then
  if redis.call('TTL', KEYS[1]) < ttl then
    redis.call('EXPIRE', KEYS[1], ttl)
  end
end
sale_event(KEYS[2], ARGV[5], ttl, KEYS[5], tonumber(ARGV[6]), row, event_log(KEYS[6], ARGV[8], tonumber(ARGV[6])))
return {1}
