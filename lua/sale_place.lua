-- sale_place.lua: write one chunk of the opening order, idempotently; the last chunk marks
-- the opening done.
--
-- The pump computes the order in Rust (HMAC-SHA256 of each frozen pre-queued user) and sends
-- it in chunks. Two pumps that both believe they hold the lock send the same chunks with the
-- same seqs (the frozen set and the seed do not change), so each seq is written once: a user
-- already placed, or a seq already recorded as departed, is left alone. A user who lost their
-- heartbeat (evicted, or left) since the freeze is not placed: their seq is departed, so
-- `aheadCount` stays exact. Once the opening is done, every call is a no-op.
--
-- KEYS[1] queue:{T}:waiting       ZSET seq -> user
-- KEYS[2] queue:{T}:heartbeat     ZSET last poll ms -> user: a placed user's moves to KEYS[10]
--                                 with its time; the last chunk unlinks it (every pre-queued
--                                 user is placed or departed by then)
-- KEYS[3] queue:{T}:departed      ZSET seqs of users who left or were evicted
-- KEYS[4] queue:{T}:entry_times   ZSET entry times (see enter.lua): one member per chunk
-- KEYS[5] queue:{T}:sale          HASH the sale: frozen, opened_at, seed, commitment
-- KEYS[6] queue:{T}:opening       ZSET the frozen pre-queue (unlinked by the last chunk)
-- KEYS[7] queue:{T}:ledger        LIST ledger rows, newest first
-- KEYS[8] queue:{T}:record        HASH the sale's record: the opening (seed, commitment) as an event
-- KEYS[9] queue:{T}:events        STREAM the event log: the opening (prelude.lua's event_add)
-- KEYS[10] queue:{T}:beats        STRING the heartbeats of users with a seq (prelude.lua's beat_tag)
-- ARGV[1] last: 1 for the last chunk, else 0
-- ARGV[2] opens_at_ms: entry time ms of the pre-queued users (the opening time)
-- ARGV[3] key_ttl_s: key ttl seconds
-- ARGV[4] ledger_max: ledger rows kept
-- ARGV[5] record_ttl_s: record ttl seconds (also the event log's)
-- ARGV[6] events_max: event log entries kept (`events.max_len`); 0 on a shard after the
--                      first: no log (the target's is its first shard's)
-- ARGV[7..] places: seq, user pairs, seqs ascending and contiguous
-- returns 1 if the chunk was applied, 0 if the opening was done already (or never frozen)
local s = redis.call('HMGET', KEYS[5], 'frozen', 'opened_at', 'commitment', 'seed')
local frozen, opened, commitment, seed = s[1], s[2], s[3], s[4]
if not frozen or opened then
  return 0
end
local ttl = tonumber(ARGV[3])
local adds, gone, beatArgs = {}, {}, {}
-- Three ZMSCOREs for the chunk rather than three ZSCOREs per user.
local users, seqs = {}, {}
for i = 7, #ARGV, 2 do
  seqs[#seqs + 1], users[#users + 1] = ARGV[i], ARGV[i + 1]
end
if #users > 0 then
  local placed = redis.call('ZMSCORE', KEYS[1], unpack(users))
  local departed = redis.call('ZMSCORE', KEYS[3], unpack(seqs))
  local beats = redis.call('ZMSCORE', KEYS[2], unpack(users))
  for i = 1, #users do
    if not placed[i] and not departed[i] then
      if beats[i] then
        adds[#adds + 1], adds[#adds + 2] = seqs[i], users[i]
        -- The heartbeat moves with its time: placing a user gives them no extra grace.
        local k = #beatArgs
        beatArgs[k + 1], beatArgs[k + 2], beatArgs[k + 3] = 'SET', BEAT.type, '#' .. seqs[i]
        beatArgs[k + 4] = beat_tag(tonumber(beats[i]))
      else
        gone[#gone + 1], gone[#gone + 2] = seqs[i], seqs[i]
      end
    end
  end
end
if #adds > 0 then
  redis.call('ZADD', KEYS[1], unpack(adds))
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('BITFIELD', KEYS[10], unpack(beatArgs))
  redis.call('EXPIRE', KEYS[10], ttl)
end
if #gone > 0 then
  redis.call('ZADD', KEYS[3], unpack(gone))
  redis.call('EXPIRE', KEYS[3], ttl)
end
if #ARGV >= 7 then
  local first, last = ARGV[7], ARGV[#ARGV - 1]
  redis.call('ZADD', KEYS[4], first, first .. '-' .. last .. ':' .. ARGV[2])
  redis.call('EXPIRE', KEYS[4], ttl)
end
if ARGV[1] == '1' then
  local now = now_ms()
  redis.call('HSET', KEYS[5], 'opened_at', now)
  redis.call('UNLINK', KEYS[6], KEYS[2])
  local log = event_log(KEYS[9], ARGV[6], tonumber(ARGV[5]))
  sale_event(KEYS[7], ARGV[4], ttl, KEYS[8], tonumber(ARGV[5]), ledger_row('open', now, frozen, commitment or '', seed or ''), log)
end
return 1
