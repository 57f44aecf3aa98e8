-- gate_pace.lua: keep the purchases the gate forwards for a target within one batch per
-- tick of Redis' clock. Reserves a place in the earliest tick (now, or up to `ahead` ticks
-- later) that still has room; the gate waits until that tick starts, then forwards if the
-- tick has not ended meanwhile (a paused process reserves again).
--
-- Admission lets one batch through per tick, but admitted users learn it at their next poll
-- (0-3 s later), so their purchases from consecutive batches can bunch in one tick: this
-- smooths them into the downstream's budget instead of refusing them. A purchase's first
-- reservation is usually made by token_claim.lua, with its claim (`pace_reserve` in
-- prelude.lua); this script makes the others.
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
local tick, a, b = pace_reserve(KEYS[1], pace_budget(KEYS[2], ARGV[2]), now_ms(), num(ARGV[1]), num(ARGV[3]), num(ARGV[4]))
if tick then
  return {1, a, b}
end
return {0, a}
