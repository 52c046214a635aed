-- lease.lua: hand the best due requests to a worker, each under a lease.
--
-- Before choosing, it returns expired leases to their queues and moves due
-- retries into theirs, a bounded number each call, so any worker does this
-- housekeeping and no separate daemon is needed.
--
-- A site is a candidate when its due time has passed, it has fewer leases
-- than its concurrency, and this worker holds fewer than its fair share of
-- them (the concurrency divided among the live workers, rounded up). Each
-- request goes to the candidate, among the first ARGV[6] in due order,
-- whose best queued priority is highest (ties: earliest due); a site stays
-- a candidate for the next request of the same call only while it still
-- is one (a site with a delay is not due again at once). In a site, a
-- higher priority pops first, and equal priorities pop first in, first out
-- (one list per site and priority).
--
-- KEYS[1]  {s}:wait     zset site -> ms when the site may be served next
-- KEYS[2]  {s}:leases   zset lease id -> deadline, ms
-- KEYS[3]  {s}:ldata    hash lease id -> "priority\tsite\tencoded request"
-- KEYS[4]  {s}:active   hash site -> requests leased now
-- KEYS[5]  {s}:due      hash site -> ms before which the site is not served
-- KEYS[6]  {s}:retries  zset "priority\tsite\tencoded request" -> due, ms
-- KEYS[7]  {s}:delay    hash site -> delay override, ms (settings, live edits)
-- KEYS[8]  {s}:conc     hash site -> concurrency override
-- KEYS[9]  {s}:count    string: requests queued (all sites)
-- KEYS[10] {s}:slow     hash site -> adaptive extra delay, ms
-- KEYS[11] {s}:alive    zset worker id -> ms of its last lease or heartbeat
-- KEYS[12] {s}:wactive  hash "worker\tsite" -> requests the worker has leased
-- KEYS[13] {s}:rdelay   hash site -> robots.txt Crawl-delay, ms
-- KEYS[14] {s}:lslot    hash lease id -> 1 while the lease holds a download
--                       slot of its site (released when the download ends)
-- KEYS[15] {s}:robots   hash site -> robots.txt as stored by the workers
-- ARGV[1]  key prefix "{s}:"
-- ARGV[2]  unused (kept so that the arguments keep their numbers)
-- ARGV[3]  lease duration, ms
-- ARGV[4]  default delay per site, ms
-- ARGV[5]  default concurrency per site
-- ARGV[6]  most candidate sites compared per call
-- ARGV[7]  most expired leases and due retries handled per call
-- ARGV[8]  the worker's id (lease ids are "<worker id>:<n>")
-- ARGV[9]  ms to wait before asking again when all queued work is on sites
--          at their concurrency
-- ARGV[10] pacing margin: a site's delay is stretched by this fraction, so
--          that jitter between lease and request never brings two requests
--          closer than the delay
-- ARGV[11] "1" when robots.txt is obeyed: a site whose robots.txt is not
--          known yet is served one request at a time
-- ARGV[12..] lease ids, one per request wanted ("<worker id>:<n>")
-- Times are the Redis server's clock (TIME), ms.
-- Returns {n, wait, expired, retried, data1, site1, ..., dataN, siteN}: the
-- first n lease ids were used, for those requests; when n is 0, wait is the
-- ms until a site or a retry is due, or -1 when nothing is queued.
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap_default = tonumber(ARGV[5])
local batch = tonumber(ARGV[7])
local worker = ARGV[8]
local lease_ms = tonumber(ARGV[3])

-- This worker is alive; workers silent for a lease's length are not.
redis.call('ZADD', KEYS[11], now, worker)
redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now - lease_ms)
local live = math.max(1, redis.call('ZCARD', KEYS[11]))

local function worker_of(id)
  local last = 0
  local i = string.find(id, ':', 1, true)
  while i do last = i; i = string.find(id, ':', i + 1, true) end
  return string.sub(id, 1, last - 1)
end

local robots = ARGV[11] == '1'
local function cap_of(site)
  if robots and redis.call('HEXISTS', KEYS[15], site) == 0 then return 1 end
  return tonumber(redis.call('HGET', KEYS[8], site) or cap_default)
end

-- Make `site` a candidate again if it has work and room.
local function wake(site)
  if redis.call('EXISTS', P .. 'lv:' .. site) == 0 then
    redis.call('ZREM', KEYS[1], site)
    return
  end
  local active = tonumber(redis.call('HGET', KEYS[4], site) or '0')
  if active < cap_of(site) then
    local due = tonumber(redis.call('HGET', KEYS[5], site) or '0')
    if due < now then due = now end
    redis.call('ZADD', KEYS[1], 'NX', due, site)
  end
end

local function enqueue_front(prio, site, data)
  redis.call('RPUSH', P .. 'q:' .. site .. ':' .. prio, data)
  redis.call('ZADD', P .. 'lv:' .. site, -tonumber(prio), prio)
  redis.call('INCR', KEYS[9])
end

local function enqueue_back(prio, site, data)
  redis.call('LPUSH', P .. 'q:' .. site .. ':' .. prio, data)
  redis.call('ZADD', P .. 'lv:' .. site, -tonumber(prio), prio)
  redis.call('INCR', KEYS[9])
end

local function split(entry)
  local t1 = string.find(entry, '\t', 1, true)
  local t2 = string.find(entry, '\t', t1 + 1, true)
  return string.sub(entry, 1, t1 - 1), string.sub(entry, t1 + 1, t2 - 1),
         string.sub(entry, t2 + 1)
end

-- 1. Expired leases go back to the front of their queue.
-- Requeued in reverse, so that they keep their order at the front.
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, batch)
for i = #expired, 1, -1 do
  local id = expired[i]
  local entry = redis.call('HGET', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if entry then
    local prio, site, data = split(entry)
    if redis.call('HDEL', KEYS[14], id) == 1 then
      if tonumber(redis.call('HINCRBY', KEYS[4], site, -1)) <= 0 then
        redis.call('HDEL', KEYS[4], site)
      end
      local wkey = worker_of(id) .. '\t' .. site
      if tonumber(redis.call('HINCRBY', KEYS[12], wkey, -1)) <= 0 then
        redis.call('HDEL', KEYS[12], wkey)
      end
    end
    enqueue_front(prio, site, data)
    wake(site)
  end
end

-- 2. Due retries join the back of their queue.
local retries = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, batch)
for _, entry in ipairs(retries) do
  redis.call('ZREM', KEYS[6], entry)
  local prio, site, data = split(entry)
  enqueue_back(prio, site, data)
  wake(site)
end

-- 3. Due sites, in due order, with what choosing among them needs.
local cands = {}
for _, site in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0,
                                 tonumber(ARGV[6]))) do
  local head = redis.call('ZRANGE', P .. 'lv:' .. site, 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', KEYS[1], site)
  else
    local cap = cap_of(site)
    if tonumber(redis.call('HGET', KEYS[4], site) or '0') >= cap then
      -- At its concurrency (lowered while the crawl runs, or still gated
      -- on robots.txt): release.lua and ack.lua wake it when a slot frees.
      redis.call('ZREM', KEYS[1], site)
    else
      local mine = tonumber(redis.call('HGET', KEYS[12], worker .. '\t' .. site) or '0')
      if mine < math.ceil(cap / live) then
        cands[#cands + 1] = {site = site, level = head[1], score = tonumber(head[2]),
                             cap = cap, mine = mine, share = math.ceil(cap / live)}
      end
      -- else this worker has its share of the site; others may take the rest
    end
  end
end

-- 4. Lease, one request per lease id, each from the candidate whose best
-- queued priority is highest (ties: earliest due); a site stays a candidate
-- while it is still due, under its concurrency and this worker's share.
local out = {0, 0, #expired, #retries}
local n = 0
for a = 12, #ARGV do
  local bi = nil
  for i, c in ipairs(cands) do
    if bi == nil or c.score < cands[bi].score then bi = i end
  end
  if bi == nil then break end
  local c = cands[bi]
  local best, best_level, id = c.site, c.level, ARGV[a]
  local qkey = P .. 'q:' .. best .. ':' .. best_level
  local data = redis.call('RPOP', qkey)
  local head = nil
  if redis.call('LLEN', qkey) == 0 then
    redis.call('ZREM', P .. 'lv:' .. best, best_level)
    head = redis.call('ZRANGE', P .. 'lv:' .. best, 0, 0, 'WITHSCORES')
  end
  redis.call('DECR', KEYS[9])
  local active = tonumber(redis.call('HINCRBY', KEYS[4], best, 1))
  redis.call('HINCRBY', KEYS[12], worker .. '\t' .. best, 1)
  local delay = tonumber(redis.call('HGET', KEYS[7], best) or ARGV[4])
  delay = math.max(delay, tonumber(redis.call('HGET', KEYS[13], best) or '0'))
  delay = delay + tonumber(redis.call('HGET', KEYS[10], best) or '0')
  local due = now + math.floor(delay * (1 + tonumber(ARGV[10])))
  redis.call('HSET', KEYS[5], best, due)
  local more = head == nil or #head > 0
  if active < c.cap and more then
    redis.call('ZADD', KEYS[1], due, best)
  else
    redis.call('ZREM', KEYS[1], best)
  end
  redis.call('ZADD', KEYS[2], now + lease_ms, id)
  redis.call('HSET', KEYS[14], id, 1)
  redis.call('HSET', KEYS[3], id, best_level .. '\t' .. best .. '\t' .. data)
  out[#out + 1] = data
  out[#out + 1] = best
  n = n + 1
  c.mine = c.mine + 1
  if due > now or active >= c.cap or not more or c.mine >= c.share then
    table.remove(cands, bi)
  elseif head ~= nil then
    c.level, c.score = head[1], tonumber(head[2])
  end
end
out[1] = n
if n > 0 then return out end

local wait = -1
local nxt = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #nxt > 0 then wait = math.max(0, tonumber(nxt[2]) - now) end
if wait < 0 and tonumber(redis.call('GET', KEYS[9]) or '0') > 0 then
  -- work is queued on sites at their concurrency: look again soon
  wait = tonumber(ARGV[9])
end
local rnext = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
if #rnext > 0 then
  local rwait = math.max(0, tonumber(rnext[2]) - now)
  if wait < 0 or rwait < wait then wait = rwait end
end
out[2] = wait
return out
