-- wrk script: polls of the users listed in the file given as argument (one id per line,
-- written by scripts/bench.sh from the queue), in random order. The requests are built in
-- init, before the run (the calibration run has no script at all). Second argument: the
-- target id (default 1) of limited-drop.
function init(args)
  local head = "GET /virtual-queues/limited-drop/" .. (args[2] or "1") .. "/entries/me HTTP/1.1\r\nHost: "
    .. wrk.host .. ":" .. wrk.port
    .. "\r\nX-User-Id: "
  reqs = {}
  for line in io.lines(args[1]) do
    reqs[#reqs + 1] = head .. line .. "\r\n\r\n"
  end
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000)
end
function request()
  return reqs[math.random(1, #reqs)]
end
