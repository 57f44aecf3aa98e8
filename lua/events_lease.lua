-- events_lease.lua: take or keep a lease (the webhooks' delivery: one instance at a time).
--
-- KEYS[1] queue:events:lease:<name>  STRING the holder, expiring
-- ARGV[1] holder: holder (an instance id)
-- ARGV[2] lease_ms: lease ms
-- returns 1 when ARGV[1] holds the lease for ARGV[2] ms from now, 0 while another holds it
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
