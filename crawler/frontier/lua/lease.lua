-- lease.lua: hand the best due requests to a worker, each under a lease.
-- lib.lua is prepended.
--
-- Before choosing, it returns expired leases to their queues and moves due
-- retries into theirs, a bounded number each call, so any worker does this
-- housekeeping and no separate daemon is needed. A request whose lease
-- expired ARGV[2] times (its worker died each time it was handed out: a
-- poison request) goes to the dead-letter list instead, with its count.
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
-- Lease ids are "<holder>:<n>", where the holder is the worker's id and a
-- nonce of its process, so a worker restarted under the same id never
-- reuses one; an id that exists already refuses the whole call before any
-- write. The caller never sends the same call twice: after a lost reply it
-- reads KEYS[3] for its ids instead.
--
-- KEYS[1]  {s}:wait     zset site -> ms when the site may be served next
-- KEYS[2]  {s}:leases   zset lease id -> deadline, ms
-- KEYS[3]  {s}:ldata    hash lease id -> "priority\tsite\t#deliveries#request"
-- KEYS[4]  {s}:active   hash site -> download slots taken now
-- KEYS[5]  {s}:due      hash site -> ms before which the site is not served
-- KEYS[6]  {s}:retries  zset "priority\tsite\trequest" -> due, ms
-- KEYS[7]  {s}:delay    hash site -> delay override, ms (integer >= 0)
-- KEYS[8]  {s}:conc     hash site -> concurrency override (integer >= 1)
-- KEYS[9]  {s}:count    string: requests queued (all sites)
-- KEYS[10] {s}:slow     hash site -> adaptive extra delay, ms
-- KEYS[11] {s}:alive    zset holder -> ms of its last lease or heartbeat
-- KEYS[12] {s}:wactive  hash "holder\tsite" -> slots the worker holds
-- KEYS[13] {s}:rdelay   hash site -> robots.txt Crawl-delay, ms
-- KEYS[14] {s}:lslot    hash lease id -> its site, while the lease holds a
--                       download slot there (freed when the download ends)
-- KEYS[15] {s}:robots   hash site -> robots.txt as stored by the workers
-- KEYS[16] {s}:dead     list of dead letters (JSON)
-- KEYS[17] {s}:revisits zset fingerprint -> ms when its revisit is due
-- KEYS[18] {s}:rdata    hash fingerprint -> "priority\tsite\trequest"
-- ARGV[1]  key prefix "{s}:"
-- ARGV[2]  most deliveries without acknowledgement (FRONTIER_MAX_DELIVERIES);
--          0: no limit
-- ARGV[3]  lease duration, ms
-- ARGV[4]  default delay per site, ms
-- ARGV[5]  default concurrency per site
-- ARGV[6]  most candidate sites compared per call
-- ARGV[7]  most expired leases, due retries and due revisits handled per
--          call (each)
-- ARGV[8]  the holder (lease ids are "<holder>:<n>")
-- ARGV[9]  ms to wait before asking again when all queued work is on sites
--          at their concurrency
-- ARGV[10] pacing margin: a site's delay is stretched by this fraction, so
--          that jitter between lease and request never brings two requests
--          closer than the delay
-- ARGV[11] "1" when robots.txt is obeyed: a site whose robots.txt is not
--          known yet is served one request at a time
-- ARGV[12..] lease ids, one per request wanted
-- Returns {n, wait, expired, retried, dead, problems, data1, site1,
-- deliveries1, ..., dataN, siteN, deliveriesN}: the first n lease ids were
-- used, for those requests (deliveries counts this one); when n is 0, wait
-- is the ms until a site, a retry or a revisit is due, or -1 when nothing
-- is queued. (Revisits not due are not queued: they do not count as work.)
-- expired and retried count the housekeeping done, dead the requests it
-- dead-lettered; problems lists the bad values met, a line of text each.
K.P = ARGV[1]
K.cap = tonumber(ARGV[5])
K.gate = ARGV[11] == '1'
K.wait, K.active, K.due, K.conc, K.count = KEYS[1], KEYS[4], KEYS[5], KEYS[8], KEYS[9]
K.wactive, K.lslot, K.robots, K.ldata = KEYS[12], KEYS[14], KEYS[15], KEYS[3]
local leases, ldata, retries, dead = KEYS[2], KEYS[3], KEYS[6], KEYS[16]
local max_deliveries = tonumber(ARGV[2])
local batch = tonumber(ARGV[7])
local holder = ARGV[8]
local lease_ms = tonumber(ARGV[3])

-- Checks that may refuse the call: before any write. KEYS[2], [3], [6] and
-- [9], [11] are checked by the reads below, which refuse the call on a wrong
-- type before any write. The overrides and politeness
-- hashes, KEYS[7], [8], [10], [13], [15], are read leniently: a wrong type
-- there is reported and ignored.
local err = check_types({
  {KEYS[1], 'zset'}, {KEYS[4], 'hash'}, {KEYS[5], 'hash'}, {KEYS[12], 'hash'},
  {KEYS[14], 'hash'}, {KEYS[16], 'list'}, {KEYS[18], 'hash'},
}) or check_counter(KEYS[9])
if err then return err end
local ids = {unpack(ARGV, 12)}
if #ids > 0 then
  local in_data = read('HMGET', ldata, unpack(ids))
  local in_leases = read('ZMSCORE', leases, unpack(ids))
  for j, id in ipairs(ids) do
    if in_data[j] or in_leases[j] then
      return redis.error_reply('ERR lease id ' .. id .. ' exists already in ' .. ldata ..
        ': refused (nothing was written)')
    end
  end
end

K.now = now_ms()
local now = K.now
local expired = read('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, batch)
local due_retries = read('ZRANGEBYSCORE', retries, '-inf', now, 'LIMIT', 0, batch)
-- (one cheap read when there are no revisits: an empty key)
local due_revisits = read('ZRANGEBYSCORE', KEYS[17], '-inf', now, 'LIMIT', 0, batch)
read('ZSCORE', KEYS[11], holder)

-- This worker is alive; workers silent for a lease's length are not.
redis.call('ZADD', KEYS[11], now, holder)
redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now - lease_ms)
local live = math.max(1, redis.call('ZCARD', KEYS[11]))
local buried = 0

-- 1. Expired leases go back to the front of their queue, with their count
-- of deliveries; past the limit, to the dead-letter list. Requeued in
-- reverse, so that they keep their order at the front.
for i = #expired, 1, -1 do
  local id = expired[i]
  local entry = redis.call('HGET', ldata, id)
  if entry then
    local prio, site, rest = split3(entry)
    local d, data = 0, entry
    if prio then d, data = deliveries_of(rest) end
    local why = nil
    if not prio_ok(prio) then
      why = 'malformed lease data'
      problem(ldata .. ' ' .. id .. ' is malformed: request dead-lettered')
    elseif max_deliveries > 0 and d >= max_deliveries then
      why = 'delivered ' .. d .. ' times without acknowledgement ' ..
            '(FRONTIER_MAX_DELIVERIES=' .. max_deliveries .. '): its worker died each time'
    else
      local bad = enqueue(K.P, K.count, site, prio, with_deliveries(d, data), true)
      if bad then
        why = 'could not be requeued: ' .. bad
        problem(bad .. ': request dead-lettered')
      end
    end
    if why then
      bury(dead, why, site, prio, data, d, now)
      buried = buried + 1
    end
    local freed_site = free_slot(id)
    if site then wake(site) end
    if freed_site and freed_site ~= site then wake(freed_site) end
  end
  redis.call('HDEL', ldata, id)
  redis.call('ZREM', leases, id)
end

-- 2. Due retries join the back of their queue. `entry` is
-- "priority\tsite\trequest" read from `where`; `what` names it ("retry",
-- "revisit") in the dead letter of an entry that cannot be queued.
local function requeue(entry, what, where)
  local prio, site, data = split3(entry)
  local why = nil
  if not prio_ok(prio) then
    why = 'malformed ' .. what .. ' entry'
    problem(where .. ' holds a malformed entry: dead-lettered')
  else
    local bad = enqueue(K.P, K.count, site, prio, data, false)
    if bad then
      why = 'could not be queued: ' .. bad
      problem(bad .. ': ' .. what .. ' dead-lettered')
    else
      wake(site)
    end
  end
  if why then
    bury(dead, why, site, prio, data or entry, 0, now)
    buried = buried + 1
  end
end

for _, entry in ipairs(due_retries) do
  requeue(entry, 'retry', retries)
  redis.call('ZREM', retries, entry)
end

-- 2b. Due revisits join the back of their queue, past the dupefilter (their
-- fingerprint is in it); their entry leaves KEYS[17] and KEYS[18] (the
-- next fetch schedules the next revisit). An entry that cannot be read is
-- dead-lettered with the reason.
for _, fp in ipairs(due_revisits) do
  local entry = redis.call('HGET', KEYS[18], fp)
  if not entry then
    problem(KEYS[17] .. ' holds a fingerprint without an entry in ' .. KEYS[18] ..
            ': dropped')
  else
    requeue(entry, 'revisit', KEYS[18])
  end
  redis.call('ZREM', KEYS[17], fp)
  redis.call('HDEL', KEYS[18], fp)
end

-- 3. Due sites, in due order, with what choosing among them needs.
local function best_level(site)
  local head = redis.pcall('ZRANGE', K.P .. 'lv:' .. site, 0, 0, 'WITHSCORES')
  if type(head) == 'table' and head['err'] then
    problem(K.P .. 'lv:' .. site .. ' is not a sorted set: site skipped')
    return {}
  end
  return head
end

local cands = {}
for _, site in ipairs(redis.call('ZRANGEBYSCORE', K.wait, '-inf', now, 'LIMIT', 0,
                                 tonumber(ARGV[6]))) do
  local head = best_level(site)
  if #head == 0 then
    redis.call('ZREM', K.wait, site)
  else
    local cap = cap_of(site)
    if hnum(K.active, site, INT, 0, 'not an integer: counted as 0') >= cap then
      -- At its concurrency (lowered while the crawl runs, or still gated
      -- on robots.txt): commit.lua wakes it when a slot frees.
      redis.call('ZREM', K.wait, site)
    else
      local share = math.ceil(cap / live)
      local mine = hnum(K.wactive, holder .. '\t' .. site, INT, 0, 'not an integer: counted as 0')
      if mine < share then
        cands[#cands + 1] = {site = site, level = head[1], score = tonumber(head[2]),
                             cap = cap, mine = mine, share = share}
      end
      -- else this worker has its share of the site; others may take the rest
    end
  end
end

-- 4. Lease, one request per lease id, each from the candidate whose best
-- queued priority is highest (ties: earliest due); a site stays a candidate
-- while it is still due, under its concurrency and this worker's share.
local out = {0, 0, #expired, #due_retries, buried, problems}
local n = 0
local a = 12
while a <= #ARGV do
  local bi = nil
  for ci, c in ipairs(cands) do
    if bi == nil or c.score < cands[bi].score then bi = ci end
  end
  if bi == nil then break end
  local c = cands[bi]
  local site, level, id = c.site, c.level, ARGV[a]
  local qkey = K.P .. 'q:' .. site .. ':' .. level
  local entry = redis.pcall('RPOP', qkey)
  local head = nil
  if type(entry) == 'table' then
    problem(qkey .. ' is not a list: site skipped')
    table.remove(cands, bi)
  elseif not entry then
    -- a level without entries (removed by hand): forget it, try the next
    redis.call('ZREM', K.P .. 'lv:' .. site, level)
    head = best_level(site)
    if #head == 0 then
      redis.call('ZREM', K.wait, site)
      table.remove(cands, bi)
    else
      c.level, c.score = head[1], tonumber(head[2])
    end
  else
    if redis.call('LLEN', qkey) == 0 then
      redis.call('ZREM', K.P .. 'lv:' .. site, level)
      head = best_level(site)
    end
    redis.call('DECR', K.count)
    local d, data = deliveries_of(entry)
    d = d + 1
    local active = hadd(K.active, site, 1)
    hadd(K.wactive, holder .. '\t' .. site, 1)
    local delay = hnum(KEYS[7], site, NAT, tonumber(ARGV[4]),
                       'delay must be whole ms >= 0: default used')
    delay = math.max(delay, hnum(KEYS[13], site, NAT, 0, 'not whole ms: ignored'))
    delay = delay + hnum(KEYS[10], site, NAT, 0, 'not whole ms: ignored')
    local due = now + math.floor(delay * (1 + tonumber(ARGV[10])))
    redis.call('HSET', K.due, site, due)
    local more = head == nil or #head > 0
    if active < c.cap and more then
      redis.call('ZADD', K.wait, due, site)
    else
      redis.call('ZREM', K.wait, site)
    end
    redis.call('ZADD', leases, now + lease_ms, id)
    redis.call('HSET', K.lslot, id, site)
    redis.call('HSET', ldata, id, level .. '\t' .. site .. '\t#' .. d .. '#' .. data)
    out[#out + 1] = data
    out[#out + 1] = site
    out[#out + 1] = d
    n = n + 1
    a = a + 1
    c.mine = c.mine + 1
    if due > now or active >= c.cap or not more or c.mine >= c.share then
      table.remove(cands, bi)
    elseif head ~= nil then
      c.level, c.score = head[1], tonumber(head[2])
    end
  end
end
out[1] = n
if n > 0 then return out end

local wait = -1
local nxt = redis.call('ZRANGE', K.wait, 0, 0, 'WITHSCORES')
if #nxt > 0 then wait = math.max(0, tonumber(nxt[2]) - now) end
if wait < 0 and tonumber(redis.call('GET', K.count) or '0') > 0 then
  -- work is queued on sites at their concurrency: look again soon
  wait = tonumber(ARGV[9])
end
for _, later in ipairs({retries, KEYS[17]}) do
  local rnext = redis.call('ZRANGE', later, 0, 0, 'WITHSCORES')
  if #rnext > 0 then
    local rwait = math.max(0, tonumber(rnext[2]) - now)
    if wait < 0 or rwait < wait then wait = rwait end
  end
end
out[2] = wait
return out
