-- push.lua: add one request to the frontier unless its fingerprint was seen.
-- One round trip per request: dupefilter check and queue push are atomic.
-- Times are the Redis server's clock (TIME), so workers' clocks don't matter.
--
-- KEYS[1]  {s}:dupefilter   set of request fingerprints; in Bloom mode the
--                           bitmap {s}:bloom (or its shard {s}:bloom:<i>)
-- KEYS[2]  {s}:wait         zset site -> ms when the site may be served next
-- KEYS[3]  {s}:active       hash site -> requests leased now
-- KEYS[4]  {s}:due          hash site -> ms before which the site is not served
-- KEYS[5]  {s}:conc         hash site -> concurrency override
-- KEYS[6]  {s}:count        string: requests queued (all sites)
-- ARGV[1]  key prefix "{s}:" (per-site keys are built from it; same hash tag)
-- ARGV[2]  fingerprint (raw bytes), or "" to skip the dupefilter
-- ARGV[3]  "1" to queue even if seen (dont_filter), else "0"
-- ARGV[4]  site ("host" or "host:port")
-- ARGV[5]  priority (integer; higher is served first)
-- ARGV[6]  encoded request
-- ARGV[7]  default concurrency per site
-- ARGV[8]  dupefilter mode: "set" (or absent), or "bloom" (BloomDupeFilter)
-- ARGV[9]  bloom: bitmap size in bytes (an absent bitmap is created zeroed,
--          at exactly this size, so Redis allocates it once)
-- ARGV[10] bloom: the request's bit offsets, decimal, separated by spaces;
--          seen when every bit was already set
-- Returns 1 when queued, 0 when filtered as a duplicate.
if ARGV[8] == 'bloom' then
  local size = tonumber(ARGV[9])
  local len = redis.call('STRLEN', KEYS[1])
  if len == 0 then
    redis.call('SETRANGE', KEYS[1], size - 1, '\0')
  elseif len ~= size then
    return redis.error_reply('ERR Bloom filter ' .. KEYS[1] .. ' holds ' .. len ..
      ' bytes but this worker expects ' .. size .. ': FRONTIER_BLOOM_CAPACITY or ' ..
      'FRONTIER_BLOOM_ERROR_RATE differ from those the filter was created with')
  end
  local args = {}
  for o in string.gmatch(ARGV[10], '%d+') do
    local j = #args
    args[j + 1], args[j + 2], args[j + 3], args[j + 4] = 'SET', 'u1', o, '1'
  end
  local added = 0
  for _, old in ipairs(redis.call('BITFIELD', KEYS[1], unpack(args))) do
    if old == 0 then added = 1 end
  end
  if added == 0 and ARGV[3] ~= '1' then return 0 end
elseif ARGV[2] ~= '' then
  local added = redis.call('SADD', KEYS[1], ARGV[2])
  if added == 0 and ARGV[3] ~= '1' then return 0 end
end
local site = ARGV[4]
redis.call('LPUSH', ARGV[1] .. 'q:' .. site .. ':' .. ARGV[5], ARGV[6])
redis.call('ZADD', ARGV[1] .. 'lv:' .. site, -tonumber(ARGV[5]), ARGV[5])
redis.call('INCR', KEYS[6])
if redis.call('ZSCORE', KEYS[2], site) == false then
  local active = tonumber(redis.call('HGET', KEYS[3], site) or '0')
  local cap = tonumber(redis.call('HGET', KEYS[5], site) or ARGV[7])
  if active < cap then
    local due = tonumber(redis.call('HGET', KEYS[4], site) or '0')
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if due < now then due = now end
    redis.call('ZADD', KEYS[2], due, site)
  end
end
return 1
