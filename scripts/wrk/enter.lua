-- wrk script: every request enters a new user (ids from 1, spread over wrk threads).
local counter = 0
local threads = {}
function setup(thread)
  thread:set("offset", #threads)
  table.insert(threads, thread)
end
function init(args)
  stride = tonumber(args[1] or "2")
end
function request()
  counter = counter + 1
  local user = counter * stride + offset
  return wrk.format("POST", "/virtual-queues/limited-drop/1/entries", { ["X-User-Id"] = tostring(user) })
end
