-- wrk script: polls of the users listed in the file given as first argument (one id per line,
-- in entry order, written by scripts/bench.sh from the queue). Second argument: the target id
-- (default 1) of limited-drop. Third: the number of wrk threads (default 2; wrk runs a thread's
-- init before the next thread exists, so it cannot be counted here). Fourth: the order,
--   cycle  (default) every listed user once per round, in entry order, the wrk threads taking
--          turns; what a waiting room sees from users who all poll at the same interval: the
--          user polled next is the one whose heartbeat is the oldest;
--   random each poll picks a listed user at random; the least favourable order for Redis
--          (each heartbeat update moves a user from anywhere in the 100k-member set).
-- A request is one string concatenation (the calibration run has no script at all).
local threads = {}
function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end
function init(args)
  head = "GET /virtual-queues/limited-drop/" .. (args[2] or "1") .. "/entries/me HTTP/1.1\r\nHost: "
    .. wrk.host .. ":" .. wrk.port
    .. "\r\nX-User-Id: "
  local stride = tonumber(args[3] or "2")
  random = args[4] == "random"
  ids = {}
  local i = 0
  for line in io.lines(args[1]) do
    if random or i % stride == offset then
      ids[#ids + 1] = line
    end
    i = i + 1
  end
  n = #ids
  k = 0
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000)
end
function request()
  if random then
    k = math.random(1, n)
  else
    k = k % n + 1
  end
  return head .. ids[k] .. "\r\n\r\n"
end
-- Once at the end: the percentiles scripts/bench.sh reads (wrk's own --latency has no P95), µs.
function done(summary, latency, requests)
  io.write(string.format("percentiles us: %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
