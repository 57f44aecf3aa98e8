-- lane_join.lua: a user joins a lane of the target: with an access code the shop issued
-- (claimed here: single-use or capped, bound to each user who claims it, so a user claiming
-- the same code again uses nothing), or with a claim the service has verified (its signature).
-- The user's lane is written where every enter and poll of the target looks it up.
--
-- KEYS[1] queue:{T}:lane_codes  HASH code hash -> "lane:uses left"; code hash|user -> 1 for
--                               each user bound to the code
-- KEYS[2] queue:{T}:lane_of     HASH user -> their lane (absent: the public lane)
-- ARGV[1] user: user id
-- ARGV[2] code_hash: hex SHA-256 of the target and the code, or empty with a verified claim
-- ARGV[3] lane: the verified claim's lane (empty with a code)
-- ARGV[4] lanes: the lanes that exist now, space-separated (a code of a removed lane is refused)
-- ARGV[5] key_ttl_s: key ttl seconds of KEYS[2]
-- returns {1, lane} joined (or joined before with this code), {0, ""} no such code or lane,
--   {2, lane} the code has no use left
local user, hash, lane = ARGV[1], ARGV[2], ARGV[3]
local function exists(name)
  return string.find(' ' .. ARGV[4] .. ' ', ' ' .. name .. ' ', 1, true) ~= nil
end
if hash ~= '' then
  local v = redis.call('HGET', KEYS[1], hash)
  if not v then
    return {0, ''}
  end
  local left
  lane, left = string.match(v, '^([^:]+):(%d+)$')
  if not lane or not exists(lane) then
    return {0, ''}
  end
  if redis.call('HEXISTS', KEYS[1], hash .. '|' .. user) == 0 then
    if tonumber(left) <= 0 then
      return {2, lane}
    end
    redis.call('HSET', KEYS[1], hash, lane .. ':' .. (tonumber(left) - 1), hash .. '|' .. user, 1)
  end
elseif lane == '' or not exists(lane) then
  return {0, ''}
end
redis.call('HSET', KEYS[2], user, lane)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
return {1, lane}
