-- leave.lua: a user leaves the queue. The seq is not reused and nobody behind moves up
-- before the next tick: admission follows the fixed seq.
--
-- KEYS[1] queue:{T}:waiting     ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat   ZSET last poll ms -> user
-- KEYS[3] queue:{T}:entered_at  HASH user -> entry ms
-- ARGV[1] user id
-- returns 1 if the user was waiting, else 0
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return removed
