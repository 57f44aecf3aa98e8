-- user_hold.lua: counts targets among the queues users hold a place in, unless a user holds
-- `max` already (queue.max_queues_per_user), and drops targets from them: the entries of every
-- user of one bucket gathered while earlier calls were in flight, in one call (vq coalesces
-- them as it does enters; `store/redis/holds.rs`). A target already counted stays counted.
--
-- vq sends this script with lua/prelude.lua in front (Redis' clock, now_ms).
--
-- The count is kept in HASHes shared by the users of a bucket (one bucket on a single server; a
-- fixed number on a cluster, each in its own slot): one field per user, no key of their own.
-- On a single server enter.lua counts a user given a place in the same call (the same fields,
-- the same generations); this script counts on a cluster, where a target's scripts cannot
-- reach the buckets, and drops targets (a token collected, a leave) everywhere. The
-- count is checked against the targets only when it reaches its limit: vq asks each target
-- counted long enough ago for its enter to have run whether the user still holds a place
-- there, and drops the ones they left, were admitted from or evicted from.
--
-- On a cluster vq counts a new user without this script where the fields say enough (`holds.rs`:
-- HSETNX of the current generation's field, and whether the previous one has the user); a count
-- written that way for a user the previous generation holds too comes here as a check
-- ("T?max"), which keeps the target only if the user holds fewer than max others. A user's
-- targets are those of both generations: this script merges them into the current one.
--
-- The HASHes come in generations of ARGV[2] ms of Redis' clock: a user's field is written into
-- the current one (moved there from the previous one when found there) and a generation expires
-- at the end of the next one, so a user nobody counts or drops for a whole generation is
-- forgotten with it, as a key of their own would expire.
--
-- KEYS[1] queue:holds:{h<b>}:<g-1>  HASH user -> "TARGET=ms TARGET=ms ..." (ms it was counted)
-- KEYS[2] queue:holds:{h<b>}:<g>    the generation vq takes for Redis' current one
-- KEYS[3] queue:holds:{h<b>}:<g+1>
-- ARGV[1] generation: g, the generation of KEYS[2]
-- ARGV[2] generation_ms: a generation's length, ms
-- ARGV[2+2i-1] user: entry i's user
-- ARGV[2+2i] target: entry i's target, then "=" and max to count it (e.g. LIMITED_DROP:42=10),
--                    "?" and max to check a count written ahead (LIMITED_DROP:42?10), or the
--                    target alone to drop it
-- returns, per entry in order: n, then n pairs (target, ms since counted): n = 0 when the target
-- is counted (now or before) or dropped, else every target the user holds, none counted
local now = now_ms()
local g, len = num(ARGV[1]), num(ARGV[2])
-- Redis' generation among the three (vq's clock is corrected by the offset it measures).
local cur = hold_generation(now, g, len)

local users, at = {}, {}
for i = 3, #ARGV, 2 do
  if not at[ARGV[i]] then
    users[#users + 1] = ARGV[i]
    at[ARGV[i]] = true
  end
end

-- Each user's targets (in counted order) and where they were found.
local held, moved, incur = {}, {}, {}
local function parse(v)
  local list = {}
  for t, ms in string.gmatch(v, '([^ =]+)=(%d+)') do
    list[#list + 1] = {t, tonumber(ms)}
  end
  return list
end
local found = redis.call('HMGET', KEYS[cur], unpack(users))
for i, u in ipairs(users) do
  if found[i] then
    held[u], incur[u] = parse(found[i]), true
  else
    held[u] = {}
  end
end
-- The previous generation, for every user (a count written ahead leaves a user in both until
-- a call here merges them): its targets come first (counted earlier), then the current
-- one's that it lacks.
if cur > 1 then
  local older = redis.call('HMGET', KEYS[cur - 1], unpack(users))
  for i, u in ipairs(users) do
    if older[i] then
      local list, have = parse(older[i]), {}
      for _, e in ipairs(list) do
        have[e[1]] = true
      end
      for _, e in ipairs(held[u]) do
        if not have[e[1]] then
          list[#list + 1] = e
        end
      end
      held[u], moved[u] = list, true
    end
  end
end

local dirty, out = {}, {}
for i = 3, #ARGV, 2 do
  local u = ARGV[i]
  local target, max = string.match(ARGV[i + 1], '^([^=]+)=(%d+)$')
  local ahead = false
  if not target then
    target, max = string.match(ARGV[i + 1], '^([^?]+)%?(%d+)$')
    ahead = target ~= nil
  end
  local list = held[u]
  local pos
  for k, e in ipairs(list) do
    if e[1] == (target or ARGV[i + 1]) then pos = k end
  end
  if ahead and pos then
    -- Written ahead: taken out, then counted against the others as any count is (kept while
    -- they are fewer than max, else refused).
    table.remove(list, pos)
    pos, dirty[u] = nil, true
  end
  if not target then
    if pos then
      table.remove(list, pos)
      dirty[u] = true
    end
    out[#out + 1] = 0
  elseif pos then
    out[#out + 1] = 0
  elseif #list >= num(max) then
    out[#out + 1] = #list
    for _, e in ipairs(list) do
      out[#out + 1] = e[1]
      out[#out + 1] = math.max(0, now - e[2])
    end
  else
    list[#list + 1] = {target, now}
    dirty[u] = true
    out[#out + 1] = 0
  end
end

local set, gone, from = {}, {}, {}
for _, u in ipairs(users) do
  if dirty[u] or moved[u] then
    if #held[u] > 0 then
      local parts = {}
      for k, e in ipairs(held[u]) do
        parts[k] = e[1] .. '=' .. e[2]
      end
      set[#set + 1] = u
      set[#set + 1] = table.concat(parts, ' ')
    elseif incur[u] then
      gone[#gone + 1] = u
    end
    if moved[u] then
      from[#from + 1] = u
    end
  end
end
if #set > 0 then
  redis.call('HSET', KEYS[cur], unpack(set))
  -- Kept through the next generation, where it is read as the previous one.
  redis.call('PEXPIREAT', KEYS[cur], (g + cur) * len)
end
if #gone > 0 then
  redis.call('HDEL', KEYS[cur], unpack(gone))
end
if #from > 0 then
  redis.call('HDEL', KEYS[cur - 1], unpack(from))
end
return out
