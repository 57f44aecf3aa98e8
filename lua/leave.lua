-- leave.lua: a user leaves the queue. The seq is not reused and nobody behind moves up
-- before the next tick: admission follows the fixed seq.
--
-- KEYS[1] queue:{T}:waiting     ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat   ZSET last poll ms -> user
-- KEYS[3] queue:{T}:departed    ZSET seq -> seq of users who left or were evicted, above the
--                               mark (so enter and status count users ahead without a rank)
-- KEYS[4] queue:{T}:prequeue    ZSET pre-queued users (optional): a pre-queued user leaves it
--                               (from the frozen pre-queue they leave by losing their
--                               heartbeat: sale_place.lua then records their seq as departed)
-- KEYS[5] queue:{T}:record      HASH the sale's record (optional, with KEYS[4] and ARGV[3]):
--                               left (users who left the queue or the pre-queue)
-- KEYS[6] queue:holds:{h0}:<g-1>  HASH the queues each user holds (optional, with ARGV[4]): on a
-- KEYS[7] queue:holds:{h0}:<g>    single server the target is dropped from the user's field
-- KEYS[8] queue:holds:{h0}:<g+1>  (`hold_drop` in prelude.lua), whether they were waiting or not
-- ARGV[1] user: user id
-- ARGV[2] key_ttl_s: key ttl seconds
-- ARGV[3] record_ttl_s: record ttl seconds
-- ARGV[4] hold_target: the target as the holds name it (the whole target), or '' for no drop
-- ARGV[5] hold_generation: g, the generation of KEYS[7]
-- ARGV[6] hold_generation_ms: a generation's length, ms
-- returns 1 if the user was waiting, else 0
local seq = redis.call('ZSCORE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[4] ~= '' then
  hold_drop({KEYS[6], KEYS[7], KEYS[8]}, ARGV[1], ARGV[4], now_ms(), num(ARGV[5]), num(ARGV[6]))
end
local prequeued = 0
if KEYS[4] then
  prequeued = redis.call('ZREM', KEYS[4], ARGV[1])
end
if KEYS[5] and (seq or prequeued == 1) then
  record_incr(KEYS[5], ARGV[3], {'left', '1'})
end
if not seq then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[3], seq, seq)
redis.call('EXPIRE', KEYS[3], ARGV[2])
return 1
