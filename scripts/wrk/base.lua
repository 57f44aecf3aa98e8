-- wrk script for the calibration of scripts/bench.sh: wrk's own static request (no request()
-- function, so no Lua per request); once at the end, the percentiles bench.sh reads, µs.
function done(summary, latency, requests)
  io.write(string.format("percentiles us: %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
