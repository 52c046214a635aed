-- push.lua: add requests to the frontier unless their fingerprint was seen.
-- One round trip for any number of requests: for each, the dupefilter check
-- and the queue push are atomic. Times are the Redis server's clock (TIME),
-- so workers' clocks don't matter.
--
-- KEYS[1]  {s}:dupefilter   set of request fingerprints
-- KEYS[2]  {s}:wait         zset site -> ms when the site may be served next
-- KEYS[3]  {s}:active       hash site -> requests leased now
-- KEYS[4]  {s}:due          hash site -> ms before which the site is not served
-- KEYS[5]  {s}:conc         hash site -> concurrency override
-- KEYS[6]  {s}:count        string: requests queued (all sites)
-- ARGV[1]  key prefix "{s}:" (per-site keys are built from it; same hash tag)
-- ARGV[2]  default concurrency per site
-- ARGV[3]  dupefilter mode: "set", or "bloom" (BloomDupeFilter)
-- ARGV[4]  bloom: bitmap size in bytes (an absent bitmap is created zeroed,
--          at exactly this size, so Redis allocates it once); else ""
-- ARGV[5..] one group of 6 per request:
--          fingerprint (raw bytes), or "" to skip the dupefilter
--          "1" to queue even if seen (dont_filter), else "0"
--          site ("host" or "host:port")
--          priority (integer; higher is served first)
--          encoded request
--          bloom: the bitmap's key ({s}:bloom or its shard {s}:bloom:<i>) and
--          the request's bit offsets, decimal, separated by spaces, as
--          "key offsets"; seen when every bit was already set. Else "".
-- Returns a list with, per request, 1 when queued, 0 when filtered as a
-- duplicate.
local P = ARGV[1]
local cap_default = tonumber(ARGV[2])
local bloom = ARGV[3] == 'bloom'
local size = tonumber(ARGV[4])
local now = nil
local out = {}

-- Bloom mode: check (or create) every bitmap before writing anything, so a
-- size mismatch fails the whole call and leaves Redis unchanged.
if bloom then
  local checked = {}
  for i = 10, #ARGV, 6 do
    if ARGV[i] ~= '' then
      local key = string.sub(ARGV[i], 1, string.find(ARGV[i], ' ', 1, true) - 1)
      if not checked[key] then
        checked[key] = true
        local len = redis.call('STRLEN', key)
        if len ~= 0 and len ~= size then
          return redis.error_reply('ERR Bloom filter ' .. key .. ' holds ' .. len ..
            ' bytes but this worker expects ' .. size .. ': FRONTIER_BLOOM_CAPACITY ' ..
            'or FRONTIER_BLOOM_ERROR_RATE differ from those the filter was created with')
        end
      end
    end
  end
  for key in pairs(checked) do
    if redis.call('STRLEN', key) == 0 then
      redis.call('SETRANGE', key, size - 1, '\0')
    end
  end
end

-- 1 when the bits of spec ("key offsets") were not all set before.
local function bloom_add(spec)
  local sp = string.find(spec, ' ', 1, true)
  local key = string.sub(spec, 1, sp - 1)
  local args = {}
  for o in string.gmatch(string.sub(spec, sp + 1), '%d+') do
    local j = #args
    args[j + 1], args[j + 2], args[j + 3], args[j + 4] = 'SET', 'u1', o, '1'
  end
  for _, old in ipairs(redis.call('BITFIELD', key, unpack(args))) do
    if old == 0 then return 1 end
  end
  return 0
end

for i = 5, #ARGV, 6 do
  local fp, dont_filter, site, prio, data = ARGV[i], ARGV[i + 1], ARGV[i + 2],
                                             ARGV[i + 3], ARGV[i + 4]
  local added = 1
  if bloom and ARGV[i + 5] ~= '' then
    added = bloom_add(ARGV[i + 5])
  elseif fp ~= '' then
    added = redis.call('SADD', KEYS[1], fp)
  end
  if added == 0 and dont_filter ~= '1' then
    out[#out + 1] = 0
  else
    redis.call('LPUSH', P .. 'q:' .. site .. ':' .. prio, data)
    redis.call('ZADD', P .. 'lv:' .. site, -tonumber(prio), prio)
    redis.call('INCR', KEYS[6])
    if redis.call('ZSCORE', KEYS[2], site) == false then
      local active = tonumber(redis.call('HGET', KEYS[3], site) or '0')
      local cap = tonumber(redis.call('HGET', KEYS[5], site) or cap_default)
      if active < cap then
        local due = tonumber(redis.call('HGET', KEYS[4], site) or '0')
        if now == nil then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        if due < now then due = now end
        redis.call('ZADD', KEYS[2], due, site)
      end
    end
    out[#out + 1] = 1
  end
end
return out
