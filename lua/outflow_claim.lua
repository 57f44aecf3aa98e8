-- outflow_claim.lua: claims a control interval of the target's adaptive outflow, once across
-- every pump (queue.outflow = "adaptive"); the decision itself is vq's (domain::Controller).
--
-- KEYS[1] queue:{T}:outflow          HASH batch, interval (the last one claimed), reason, at,
--                                    used, expired (the token counters at the last decision),
--                                    no_show (the smoothed share of no-shows)
-- KEYS[2] queue:{T}:batch_size       STRING runtime batch size for this target (a pin)
-- KEYS[3] queue:{T}:outflow:obs:<i>  HASH what the gates saw in interval i, in buyers
--                                    (outflow_observe.lua): n, e (errors), b (backoffs),
--                                    l<k> (buyers in latency bucket k)
-- KEYS[4] queue:{T}:waits            HASH target counters (tokens_used, tokens_expired)
-- ARGV[1] interval: the interval i
-- ARGV[2] key_ttl_s: the key ttl, seconds
-- returns {'pinned'}, {'decided', batch}, or {'decide', batch, used, expired, no_show,
-- used_now, expired_now, field, value, ...} with the interval's observations; batch is ''
-- before the first decision, used/expired/no_show '' before the first decision recorded them
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'pinned'}
end
local s = redis.call('HMGET', KEYS[1], 'batch', 'interval', 'used', 'expired', 'no_show')
local batch = s[1] or ''
if s[2] and tonumber(s[2]) >= tonumber(ARGV[1]) then
  return {'decided', batch}
end
redis.call('HSET', KEYS[1], 'interval', ARGV[1])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
local now = redis.call('HMGET', KEYS[4], 'tokens_used', 'tokens_expired')
local out = {'decide', batch, s[3] or '', s[4] or '', s[5] or '', now[1] or '0', now[2] or '0'}
for _, v in ipairs(redis.call('HGETALL', KEYS[3])) do
  out[#out + 1] = v
end
return out
