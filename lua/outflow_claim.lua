-- outflow_claim.lua: claims a control interval of the target's adaptive outflow, once across
-- every pump (queue.outflow = "adaptive"); the decision itself is vq's (domain::Controller).
--
-- KEYS[1] queue:{T}:outflow          HASH batch, interval (the last one claimed), reason, at
-- KEYS[2] queue:{T}:batch_size       STRING runtime batch size for this target (a pin)
-- KEYS[3] queue:{T}:outflow:obs:<i>  HASH what the gates saw in interval i: n, e (errors),
--                                    b (backoffs), l<k> (purchases in latency bucket k)
-- ARGV[1] the interval i
-- ARGV[2] the key ttl, seconds
-- returns {'pinned'}, {'decided', batch}, or {'decide', batch, field, value, ...} with the
-- interval's observations; batch is '' before the first decision
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'pinned'}
end
local s = redis.call('HMGET', KEYS[1], 'batch', 'interval')
local batch = s[1] or ''
if s[2] and tonumber(s[2]) >= tonumber(ARGV[1]) then
  return {'decided', batch}
end
redis.call('HSET', KEYS[1], 'interval', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
local out = {'decide', batch}
for _, v in ipairs(redis.call('HGETALL', KEYS[3])) do
  out[#out + 1] = v
end
return out
