-- view.lua: one instance's copy of a target's admission state, and the heartbeats of the polls
-- it answered from that copy since its previous call (see `service::local`).
--
-- An instance answers a waiting user's poll from its copy (mark, runtime batch size, departed
-- seqs above the mark) and sends the heartbeats here every few hundred ms, one call per target,
-- instead of one status.lua call per poll.
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:beats            STRING the heartbeats of users with a seq (prelude.lua's beat_tag)
-- KEYS[3] queue:{T}:admitted_count   STRING admission mark
-- KEYS[4] queue:{T}:batch_size       STRING runtime batch size (optional)
-- KEYS[5] queue:{T}:departed         ZSET seq -> seq of users who left or were evicted
-- KEYS[6] queue:{T}:sale             HASH the sale (optional)
-- ARGV[1] departed_max: the most departed seqs above the mark to return, the lowest first (0: none,
--                       the later calls of one round): a bound, so a queue whose users left in
--                       their millions costs no long call; the copy then knows the departed only up
--                       to the last one returned
-- ARGV[1+i] user: user i, who polled since the previous call (at most
--                 `slices::VIEW_USERS_PER_CALL`); their heartbeat is Redis' TIME (now_ms)
-- returns {mark, batch_override_or_0, g, [sale,] gone users 1..g, then departed seqs above the
-- mark (at most ARGV[1])}; sale (only with KEYS[6]) = 0 no sale or open, 1 paused, 2 every poll asks status.lua
-- (closed, or not opened yet: the answer is not WAITING as the copy would say)
--   gone = users not waiting any more (admitted and issued, left, evicted): the instance
--   forgets them, so their next poll asks status.lua
local n = #ARGV - 1
local st = redis.call('MGET', KEYS[3], KEYS[4])
local mark = num(st[1] or '0')
local out = {mark, num(st[2] or '0'), 0}
local head = 3
if KEYS[6] then
  local phase, s = sale_phase(KEYS[6], now_ms())
  local flag = 0
  if phase ~= NO_SALE and phase ~= P_OPEN then
    flag = 2
  elseif s.paused == '1' then
    flag = 1
  end
  out[4] = flag
  head = 4
end
if n > 0 then
  local seqs = redis.call('ZMSCORE', KEYS[1], unpack(ARGV, 2, 1 + n))
  local beats, nb = {}, 0
  for i = 1, n do
    if seqs[i] then
      nb = nb + 1
      beats[nb] = seqs[i]
    else
      out[#out + 1] = ARGV[1 + i]
    end
  end
  out[3] = #out - head
  -- Only users still waiting: one evicted or admitted meanwhile is not given a heartbeat back
  -- (the script is atomic).
  beats_set(KEYS[2], beats, beat_tag(now_ms()))
end
local most = num(ARGV[1])
if most > 0 then
  for _, seq in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. mark, '+inf', 'LIMIT', 0, most)) do
    out[#out + 1] = tonumber(seq)
  end
end
return out
