-- wrk script for scripts/topology-check.sh: every other request enters a new user (ids from
-- 1), the others poll a user entered before; counts the answers by status class (use -t1).
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  entered, n, s2, s4, s5 = 0, 0, 0, 0, 0
end
function request()
  n = n + 1
  if n % 2 == 0 or entered == 0 then
    entered = entered + 1
    return wrk.format("POST", "/virtual-queues/limited-drop/1/entries", { ["X-User-Id"] = tostring(entered) })
  end
  local user = math.random(1, entered)
  return wrk.format("GET", "/virtual-queues/limited-drop/1/entries/me", { ["X-User-Id"] = tostring(user) })
end
function response(status)
  if status >= 500 then s5 = s5 + 1 elseif status >= 400 then s4 = s4 + 1 else s2 = s2 + 1 end
end
function done()
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do
    a, b, c = a + t:get("s2"), b + t:get("s4"), c + t:get("s5")
  end
  io.write(string.format("statuses: 2xx %d, 4xx %d, 5xx %d\n", a, b, c))
end
