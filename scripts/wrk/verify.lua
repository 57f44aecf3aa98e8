-- wrk script: /gate/verify as nginx auth_request sends it, for the purchase of each user listed
-- in the file given as first argument (lines `user token`, tokens for limited-drop:1), each
-- line once, the wrk threads taking turns. Second argument: the number of wrk threads
-- (default 2). A purchase's check claims its token, so a run uses each token once; a list
-- longer than the run's requests keeps every check a first one (past its end, lines repeat).
local threads = {}
function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end
function init(args)
  local stride = tonumber(args[2] or "2")
  reqs = {}
  local i = 0
  for line in io.lines(args[1]) do
    if i % stride == offset then
      local user, token = line:match("^(%S+) (%S+)$")
      reqs[#reqs + 1] = "GET /gate/verify HTTP/1.1\r\nHost: " .. wrk.host .. ":" .. wrk.port
        .. "\r\nX-Original-URI: /limited-drops/1/orders\r\nX-Original-Method: POST\r\nX-User-Id: " .. user
        .. "\r\nX-Entry-Token: " .. token .. "\r\n\r\n"
    end
    i = i + 1
  end
  n = #reqs
  next_i = 0
end
function request()
  next_i = next_i + 1
  return reqs[(next_i - 1) % n + 1]
end
function done(summary, latency, requests)
  io.write(string.format("percentiles us: %d %d %d\n", latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
