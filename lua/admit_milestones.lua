-- admit_milestones.lua: a sharded target's admission milestones, for the whole target, in its
-- event log (shard 0's): each shard's admit.lua, given a plan, announces none of its own, and
-- the pump calls this once the tick's plan is applied (store/redis/shards.rs).
--
-- KEYS[1] queue:{T}:milestones   HASH all: users admitted in all; tick: the last tick judged;
--                                filled: 1 when that tick found a batch waiting or more
-- KEYS[2] queue:{T}:events       STREAM the event log (prelude.lua's event_add)
-- ARGV[1] tick: the plan's tick
-- ARGV[2] admitted: users this pump's calls admitted in the tick, every shard
-- ARGV[3] batch: the tick's batch
-- ARGV[4] waiting: the users waiting in every shard when the plan was made (fewer than the
--                 batch: the line is gone)
-- ARGV[5] mark: the marks of every shard added up (the `emptied` event's)
-- ARGV[6] admitted_every: an event each time the users admitted in all pass a multiple of
--                         this (0: none)
-- ARGV[7] events_max: event log entries kept (`events.max_len`)
-- ARGV[8] events_ttl_s: the event log's and this hash's ttl, seconds (the record's)
-- returns 1
--
-- As admit.lua for one shard: `first` when the first users are admitted, `every` each time the
-- total passes a multiple of ARGV[6], `emptied` in the first tick that found fewer users
-- waiting than the batch after one that found as many. Two pumps applying one plan
-- (shards.rs) each add what their own calls admitted; the tick is judged once, by the first
-- call for it.
local now = now_ms()
local tick, admitted = tonumber(ARGV[1]), tonumber(ARGV[2])
local batch, waiting, every = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local ttl = tonumber(ARGV[8])
local log = event_log(KEYS[2], ARGV[7], ttl)
if admitted > 0 then
  local all = redis.call('HINCRBY', KEYS[1], 'all', admitted)
  local was = all - admitted
  if was == 0 then
    event_add(log, ledger_row('admitted', now, all, 'first'))
  end
  if every > 0 and math.floor(was / every) < math.floor(all / every) then
    event_add(log, ledger_row('admitted', now, all, 'every'))
  end
end
local judged = redis.call('HMGET', KEYS[1], 'tick', 'filled')
if tick > tonumber(judged[1] or '-1') then
  if waiting < batch and judged[2] == '1' then
    event_add(log, ledger_row('emptied', now, ARGV[5]))
  end
  redis.call('HSET', KEYS[1], 'tick', tick, 'filled', waiting >= batch and 1 or 0)
end
redis.call('EXPIRE', KEYS[1], ttl)
return 1
