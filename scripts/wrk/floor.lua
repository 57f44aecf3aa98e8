-- wrk script for the HTTP floor of scripts/bench.sh: wrk's own static request to the
-- calibration's /no-redis (no Lua per request); once at the end, the percentiles bench.sh
-- reads, µs.
wrk.path = "/no-redis"
function done(summary, latency, requests)
  io.write(string.format("percentiles us: %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
