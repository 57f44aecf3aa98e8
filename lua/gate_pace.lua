-- gate_pace.lua: keep the purchases the gate forwards for a target within one batch per
-- tick of Redis' clock. Reserves a place in the earliest tick (now, or up to `ahead` ticks
-- later) that still has room; the gate waits until that tick starts, then forwards if the
-- tick has not ended meanwhile (a paused process reserves again).
--
-- Admission lets one batch through per tick, but admitted users learn it at their next poll
-- (0-3 s later), so their purchases from consecutive batches can bunch in one tick: this
-- smooths them into the downstream's budget instead of refusing them.
--
-- KEYS[1] queue:{T}:forwarded    HASH tick -> purchases forwarded (reserved) in that tick
-- KEYS[2] queue:{T}:batch_size   STRING runtime batch size for this target (optional)
-- ARGV[1] tick_ms: tick length ms
-- ARGV[2] default_budget: budget per tick when the target has no runtime batch size of its own
-- ARGV[3] guard_ms: guard ms: a request this close to the end of a tick goes to the next one, so it
--         reaches the downstream inside the tick it was counted in
-- ARGV[4] ahead: ticks ahead the gate may wait at most
-- returns {1, ms until the reserved tick starts, ms until it ends} with a reserved place (by
-- Redis' clock: the gate forwards only inside that window, else reserves again), or
-- {0, ms until the next tick} when full
local now = now_ms()
local tick_ms = tonumber(ARGV[1])
local budget = tonumber(redis.call('GET', KEYS[2]) or ARGV[2])
local first = math.floor((now + tonumber(ARGV[3])) / tick_ms)
for tick = first, first + tonumber(ARGV[4]) do
  if redis.call('HINCRBY', KEYS[1], tick, 1) <= budget then
    redis.call('HDEL', KEYS[1], first - 2, first - 3)
    redis.call('PEXPIRE', KEYS[1], tick_ms * (tonumber(ARGV[4]) + 4))
    return {1, math.max(0, tick * tick_ms - now), (tick + 1) * tick_ms - now}
  end
  redis.call('HINCRBY', KEYS[1], tick, -1)
end
return {0, (math.floor(now / tick_ms) + 1) * tick_ms - now}
