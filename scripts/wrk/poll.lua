-- wrk script: polls of the users listed in the file given as argument (one id per line,
-- written by scripts/bench.sh from the queue), in random order.
function init(args)
  users = {}
  for line in io.lines(args[1]) do
    users[#users + 1] = line
  end
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000)
end
function request()
  local user = users[math.random(1, #users)]
  return wrk.format("GET", "/virtual-queues/limited-drop/1/entries/me", { ["X-User-Id"] = user })
end
