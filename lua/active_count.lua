-- active_count.lua: the buyers of a target who hold a place in active-buyer mode
-- (queue.outflow = "active"): admitted and not yet given their token (seq at or below the
-- mark, still in `waiting`), or holding a token issued through the queue that no purchase has
-- used and that has not expired. Read in one step, so a user whose token is issued meanwhile
-- is counted once.
--
-- vq sends this script with lua/prelude.lua in front (now_ms).
--
-- KEYS[1] queue:{T}:waiting          ZSET seq -> user
-- KEYS[2] queue:{T}:admitted_count   STRING admission mark
-- KEYS[3] queue:{T}:unused           ZSET user -> expiry ms of a token issued and not used yet
-- returns the number of such buyers
local mark = redis.call('GET', KEYS[2]) or '0'
local admitted = redis.call('ZCOUNT', KEYS[1], '-inf', mark)
local holding = redis.call('ZCOUNT', KEYS[3], '(' .. now_ms(), '+inf')
return admitted + holding
