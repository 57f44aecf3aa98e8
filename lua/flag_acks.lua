-- flag_acks.lua: every instance's acknowledgement, live or silent for less than the keep
-- time; drops the older ones. An instance whose acknowledgement expired (stopped without
-- withdrawing it, frozen, or cut off from Redis) stays listed, silent, so that `vq flag status`
-- keeps showing it as not applying the current version.
--
-- KEYS[1] virtual-queue:acks   HASH instance -> `ack_value` (prelude.lua), parsed by
--                              `ack_parse`
-- ARGV[1] keep_ms: keep, ms: how long an expired acknowledgement stays listed
-- returns {instance, "version:applied_at_ms[:missing:state]", silent ms ("-1" while live), ...}
local now = now_ms()
local keep = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local ver, at, exp, rest = ack_parse(all[i + 1])
  if exp and exp + keep > now then
    out[#out + 1] = all[i]
    out[#out + 1] = ver .. ':' .. at .. rest
    if exp > now then
      out[#out + 1] = '-1'
    else
      out[#out + 1] = string.format('%.0f', now - exp)
    end
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
