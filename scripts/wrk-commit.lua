-- wrk script for scripts/bench-server: one create commit per request, each with a new item id.
-- CONTAINERS=N (default 1): each request goes to one of PREFIX0 … PREFIX(N-1) at random (they must
-- exist); PREFIX defaults to com.example.wrk-.
-- Seeded from /dev/urandom: wrk processes started in the same second (one per instance) must not
-- make the same item ids (their commits would be "unchanged" ones, cheaper than creates).
local urandom = io.open("/dev/urandom", "rb")
local b1, b2, b3, b4 = urandom:read(4):byte(1, 4)
urandom:close()
math.randomseed(((b1 * 256 + b2) * 256 + b3) * 256 + b4)
local containers = tonumber(os.getenv("CONTAINERS") or "1")
local prefix = os.getenv("PREFIX") or "com.example.wrk-"
local function uuid()
  local t = 'xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx'
  return (string.gsub(t, '[xy]', function (c)
    local v = (c == 'x') and math.random(0, 0xf) or math.random(8, 0xb)
    return string.format('%x', v)
  end))
end
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("TOKEN")
request = function()
  local id = uuid()
  local body = '{"item":"' .. id .. '","state":{"kind":"file","parent":"00000000-0000-0000-0000-000000000000","name":"' .. id .. '","chunks":[],"mode":420,"modified":1,"deleted":false}}'
  local c = math.random(0, containers - 1)
  return wrk.format(nil, "/v1/containers/" .. prefix .. c .. "/commit", nil, body)
end
