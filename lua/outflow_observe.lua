-- outflow_observe.lua: counts one purchase the gate forwarded with a valid entry token in
-- control interval i of the target's adaptive outflow, as its buyer's: a buyer counts once
-- per interval, in the latency bucket of their slowest purchase, and as failed (backed off
-- from) if any of their purchases was (domain::BuyerObservation::worst). So a buyer's
-- repeated failures weigh as one buyer's.
--
-- KEYS[1] queue:{T}:outflow:obs:<i>     HASH n (buyers), e (buyers with an error), b (buyers
--                                       the purchase API backed off from), l<k> (buyers whose
--                                       slowest purchase fell in latency bucket k)
-- KEYS[2] queue:{T}:outflow:buyers:<i>  HASH buyer -> '<k>:<e><b>', what KEYS[1] counts of them
-- ARGV[1] buyer: the buyer (user id)
-- ARGV[2] bucket: the purchase's latency bucket k
-- ARGV[3] error: 1 if the purchase failed, else 0
-- ARGV[4] backoff: 1 if the purchase API backed off, else 0
-- ARGV[5] observations_ttl_s: KEYS[1]'s ttl, seconds (the pump reads it after the interval)
-- ARGV[6] buyers_ttl_s: KEYS[2]'s ttl, seconds (only the interval's own purchases write it)
-- returns 1 for the buyer's first purchase in the interval, 0 otherwise
local k, e, b = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prev = redis.call('HGET', KEYS[2], ARGV[1])
if not prev then
  if redis.call('HINCRBY', KEYS[1], 'n', 1) == 1 then
    redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  end
  redis.call('HINCRBY', KEYS[1], 'l' .. k, 1)
  if e == 1 then
    redis.call('HINCRBY', KEYS[1], 'e', 1)
  end
  if b == 1 then
    redis.call('HINCRBY', KEYS[1], 'b', 1)
  end
  redis.call('HSET', KEYS[2], ARGV[1], k .. ':' .. e .. b)
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[6]))
  return 1
end
local pk, pe, pb = string.match(prev, '^(%d+):(%d)(%d)$')
pk, pe, pb = tonumber(pk), tonumber(pe), tonumber(pb)
if not pk then
  return 0
end
local worse = false
if k > pk then
  redis.call('HINCRBY', KEYS[1], 'l' .. pk, -1)
  redis.call('HINCRBY', KEYS[1], 'l' .. k, 1)
  pk, worse = k, true
end
if e > pe then
  redis.call('HINCRBY', KEYS[1], 'e', 1)
  pe, worse = e, true
end
if b > pb then
  redis.call('HINCRBY', KEYS[1], 'b', 1)
  pb, worse = b, true
end
if worse then
  redis.call('HSET', KEYS[2], ARGV[1], pk .. ':' .. pe .. pb)
end
return 0
