-- wrk script: every request enters a new user (ids FIRST+1, FIRST+2, ..., spread over wrk
-- threads; numbers, which every vq build takes as user ids). Arguments: stride (the number of
-- wrk threads), target id (default 1) of limited-drop, FIRST (default 0). A user id holds its
-- place across runs and targets (and counts against queue.max_queues_per_user in all of them):
-- a run that must enter new users starts past every id an earlier run used, as
-- scripts/bench.sh does (FIRST = run × 10^8).
-- A request is one string concatenation (wrk.format per request costs the client more than
-- vq's handler; the calibration run has no script at all).
local threads = {}
function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end
function init(args)
  stride = tonumber(args[1] or "2")
  head = "POST /virtual-queues/limited-drop/" .. (args[2] or "1") .. "/entries HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port
    .. "\r\nContent-Length: 0\r\nX-User-Id: "
  first = tonumber(args[3] or "0")
  counter = 0
end
function request()
  counter = counter + 1
  return head .. (first + counter * stride + offset) .. "\r\n\r\n"
end
-- Once at the end: the percentiles scripts/bench.sh reads (wrk's own --latency has no P95), µs.
function done(summary, latency, requests)
  io.write(string.format("percentiles us: %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
