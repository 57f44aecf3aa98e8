-- sale_read.lua: a target's sale as stored, with Redis' clock and the pre-queue's size.
--
-- KEYS[1] queue:{T}:sale       HASH the sale
-- KEYS[2] queue:{T}:prequeue   ZSET pre-queued users
-- KEYS[3] queue:{T}:opening    ZSET the frozen pre-queue, until its order is written
-- returns {now ms, pre-queued users, then the hash's field, value pairs}
local out = {now_ms(),
  redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3])}
for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = v
end
return out
