-- flag_acks.lua: the acknowledgements still alive; drops the expired ones.
--
-- KEYS[1] virtual-queue:acks   HASH instance ->
--                              "version:applied_at_ms:expires_at_ms[:missing:state]"
-- returns {instance, "version:applied_at_ms[:missing:state]", instance, ...} of live instances
local now = now_ms()
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local ver, at, exp, rest = string.match(all[i + 1], '^(%d+):(%d+):(%d+)(.*)$')
  if exp and tonumber(exp) > now then
    live[#live + 1] = all[i]
    live[#live + 1] = ver .. ':' .. at .. rest
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return live
