-- flag_ack.lua: record which flag version one instance applied, for `vq flag off`'s
-- confirmation. One hash instead of one key per instance, so readers need no SCAN (which on
-- Redis Cluster would see one node only, and on one node walks every token key).
--
-- KEYS[1] virtual-queue:acks   HASH instance -> `ack_value` (prelude.lua): version, applied
--                              at, expires at (Redis' clock; readers prune past it), missing,
--                              state
-- ARGV[1] instance: instance id
-- ARGV[2] version: flag version applied
-- ARGV[3] applied_at_ms: applied at, epoch ms (the instance's clock, shown to the operator)
-- ARGV[4] ttl_ms: lifetime of this acknowledgement, ms
-- ARGV[5] missing: "1" when the flag hash is missing and the instance keeps its last known flag,
--                  else "0"
-- ARGV[6] state: the flag the instance applies, one line for the operator (e.g. "on 100%")
-- ARGV[7] keep_ms: keep, ms: how long readers list an acknowledgement after it expired (silent)
-- returns 1
local now = now_ms()
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ack_value(ARGV[2], ARGV[3], now + ttl, ARGV[5], ARGV[6]))
-- The hash goes away by itself once no instance has acknowledged for the keep time.
redis.call('PEXPIRE', KEYS[1], ttl + tonumber(ARGV[7]))
return 1
