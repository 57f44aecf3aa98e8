-- outflow_set.lua: records the adaptive controller's decision for a target and, when it
-- changed the batch, an admission ledger row saying why, in one step.
--
-- KEYS[1] queue:{T}:outflow          HASH the decision (fields as outflow_claim.lua reads them)
-- KEYS[2] queue:{T}:ledger           LIST admission ledger rows, newest first (LTRIM-capped)
-- KEYS[3] queue:{T}:events           STREAM the event log: the batch change, as the purchase
--                                    API's health seen by the outflow (prelude.lua's event_add)
-- ARGV[1] key_ttl_s: the key ttl, seconds
-- ARGV[2] row: the ledger row `batch|ms|from|to|instance|reason` (encoded by
--              `store::redis::codec`), '' when the batch is unchanged
-- ARGV[3] ledger_max: ledger rows kept
-- ARGV[4] events_max: event log entries kept (`events.max_len`)
-- ARGV[5] events_ttl_s: the event log's ttl, seconds (the record's)
-- ARGV[6..] fields: field, value, ... to set in KEYS[1]
-- returns 1
local ttl = tonumber(ARGV[1])
local fields = {}
for i = 6, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ttl)
if ARGV[2] ~= '' then
  ledger_push(KEYS[2], ARGV[2], ARGV[3], ttl)
  event_add(event_log(KEYS[3], ARGV[4], tonumber(ARGV[5])), ARGV[2])
end
return 1
