-- sale_schedule.lua: set (or change, before the opening) a target's sale schedule.
--
-- The seed is drawn once: a schedule changed before the opening keeps the seed, so the
-- commitment published first stays the one to check. Scheduling again reopens a sale closed
-- before its opening; a pause stays.
--
-- KEYS[1] queue:{T}:sale     HASH opens_at, prequeue_from, closes_at (ms), seed, commitment (hex), ...
-- KEYS[2] queue:{T}:ledger   LIST ledger rows, newest first: gets "schedule|ms|opens|prequeue|closes"
-- KEYS[3] queue:{T}:record   HASH the sale's record: the schedule as an event (prelude.lua)
-- KEYS[4] queue:{T}:events   STREAM the event log: the schedule (prelude.lua's event_add)
-- ARGV[1] opens_at_ms: opens_at ms
-- ARGV[2] prequeue_from_ms: prequeue_from ms, '' for none
-- ARGV[3] closes_at_ms: closes_at ms, '' for none
-- ARGV[4] seed: seed, lowercase hex of 32 random bytes (used only if the sale has none)
-- ARGV[5] commitment: commitment, lowercase hex SHA-256 of ARGV[4]'s bytes
-- ARGV[6] expire_at_s: expiry, epoch s (the last of the schedule's times plus the key ttl)
-- ARGV[7] ledger_max: ledger rows kept
-- ARGV[8] record_ttl_s: record ttl seconds (also the event log's)
-- ARGV[9] events_max: event log entries kept (`events.max_len`); 0 on a shard after the
--                      first: no log (the target's is its first shard's)
-- returns {1, commitment} when scheduled, {0, frozen_at ms} when the pre-queue was frozen
-- already (the opening happened: clear the sale first)
local frozen = redis.call('HGET', KEYS[1], 'frozen_at')
if frozen then
  return {0, frozen}
end
local commitment = redis.call('HGET', KEYS[1], 'commitment')
if not commitment or not redis.call('HGET', KEYS[1], 'seed') then
  commitment = ARGV[5]
  redis.call('HSET', KEYS[1], 'seed', ARGV[4], 'commitment', commitment)
end
redis.call('HSET', KEYS[1], 'opens_at', ARGV[1])
-- `prequeue_told`: a new schedule's pre-queue opening is announced again (admit.lua).
redis.call('HDEL', KEYS[1], 'closed', 'close_source', 'closed_at', 'message', 'prequeue_told')
for i, field in ipairs({'prequeue_from', 'closes_at'}) do
  if ARGV[1 + i] == '' then
    redis.call('HDEL', KEYS[1], field)
  else
    redis.call('HSET', KEYS[1], field, ARGV[1 + i])
  end
end
redis.call('EXPIREAT', KEYS[1], tonumber(ARGV[6]))
-- Every schedule written is in the ledger, so a changed opening is on record.
-- The ledger lives at least as long as the schedule (below), not the key ttl.
local log = event_log(KEYS[4], ARGV[9], tonumber(ARGV[8]))
sale_event(KEYS[2], ARGV[7], nil, KEYS[3], tonumber(ARGV[8]), ledger_row('schedule', now_ms(), ARGV[1], ARGV[2], ARGV[3]), log)
if redis.call('TTL', KEYS[2]) < tonumber(ARGV[6]) - math.floor(now_ms() / 1000) then
  redis.call('EXPIREAT', KEYS[2], tonumber(ARGV[6]))
end
return {1, commitment}
