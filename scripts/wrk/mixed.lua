-- wrk script for scripts/topology-check.sh: every other request enters a new user (ids from
-- 1), the others poll a user entered before; counts the answers by status class (use -t1).
-- Polls pick among the users entered at least `lag` requests ago: a user whose enter is still
-- on its way (32 connections) would rightly get 404 NOT_IN_QUEUE. 404s are counted apart all
-- the same: an enter lost with the replica killed mid-run leaves its user unknown. User 1 is
-- never polled: wrk calls request() once before the run to check it (script_verify_request)
-- and drops that request, so user 1 never enters.
local threads = {}
function setup(thread)
  table.insert(threads, thread)
end
function init(args)
  entered, n, s2, s4, s404, s5 = 0, 0, 0, 0, 0, 0
  lag = 256
end
function request()
  n = n + 1
  if n % 2 == 0 or entered <= lag + 1 then
    entered = entered + 1
    return wrk.format("POST", "/virtual-queues/limited-drop/1/entries", { ["X-User-Id"] = tostring(entered) })
  end
  local user = math.random(2, entered - lag)
  return wrk.format("GET", "/virtual-queues/limited-drop/1/entries/me", { ["X-User-Id"] = tostring(user) })
end
function response(status)
  if status >= 500 then
    s5 = s5 + 1
  elseif status == 404 then
    s404 = s404 + 1
  elseif status >= 400 then
    s4 = s4 + 1
  else
    s2 = s2 + 1
  end
end
function done()
  local a, b, d, c = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    a, b, d, c = a + t:get("s2"), b + t:get("s4"), d + t:get("s404"), c + t:get("s5")
  end
  io.write(string.format("statuses: 2xx %d, 404 %d, other 4xx %d, 5xx %d\n", a, d, b, c))
end
