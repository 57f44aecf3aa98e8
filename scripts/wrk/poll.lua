-- wrk script: polls of users 1..N (entered beforehand), in random order.
function init(args)
  users = tonumber(args[1] or "100000")
  math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16) % 1000)
end
function request()
  local user = math.random(1, users)
  return wrk.format("GET", "/virtual-queues/limited-drop/1/entries/me", { ["X-User-Id"] = tostring(user) })
end
