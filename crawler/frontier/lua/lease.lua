-- lease.lua: hand the best due requests to a worker, each under a lease.
-- lib.lua is prepended.
--
-- Before choosing, it returns expired leases to their queues and moves due
-- retries into theirs, a bounded number each call, so any worker does this
-- housekeeping and no separate daemon is needed. A request whose lease
-- expired max_deliveries times (its worker died each time it was handed out: a
-- poison request) goes to the dead-letter list instead, with its count.
-- An expiry whose holder was seen in K.alive at the lease's deadline or
-- after (alive, its extensions missed) is no death: the request goes back
-- to its queue, for any worker, without counting that delivery.
-- Its last delivery is made alone (held_all): a worker that dies takes all
-- it holds with it, and a request leased beside a poison one would count
-- the same deaths.
--
-- Choosing among all due sites, with bounded work however many are due.
-- A site with queued work and a free slot is in one of two indexes:
-- * K.wait, scored by the time it may be served next, while that
--   time is ahead (its delay after a lease, a Crawl-delay, a robots.txt
--   outage);
-- * K.ready once it is due, scored by its best queued request:
--   -priority * 2^32 + turn, where the turn comes from the counter K.seq
--   (one more each time a site joins the index, is raised or is served;
--   counted locally and written back once per call). The top
--   of ready is the highest priority of all due sites; among equal
--   priorities, the site that has waited longest for its turn (joined or
--   was raised earliest, or was served longest ago). A request queued at a
--   better priority than its site's best raises the site with a new turn
--   (commit.lua, and here for expired leases, retries and revisits): its
--   turn is that request's place in line. So when each site has one best
--   request at a time, requests of equal priority are served first in,
--   first out across sites; a site with several takes turns with the
--   others after each one (its next request's place in line is not
--   stored: that would cost bytes per queued request).
-- A site at its concurrency or without work is in neither (commit.lua
-- wakes it when a slot frees or a request is pushed). Each call first
-- moves up to `candidates` sites whose due time has passed, earliest first, from
-- wait to ready (O(log N) each), then leases from the top of ready: a site
-- where this worker holds its fair share (its concurrency divided among
-- the live workers, rounded up) is passed over and stays for the others.
-- The sites passed over are among the ones this worker holds slots of, and
-- at most `candidates` are looked at besides those leased from: the work per call
-- is O((candidates + leases) log N) whatever N, the number of sites. After
-- each lease the site goes back in ready behind the sites of its priority
-- (no delay), in wait (a delay), or leaves both (no work left, or at its
-- concurrency). In a site, a higher priority pops first, and equal
-- priorities pop first in, first out (one list per site and priority).
-- Sites in wait from before ready existed are moved like any other.
--
-- When nothing can be leased, the reply's wait is never 0 unless this call
-- did all the moving or housekeeping it may (more is due at once): with
-- due sites all passed over, or work only on sites at their concurrency,
-- it is the time until the next site in wait comes due, else recheck_ms, and
-- at most a lease's length (the worker also asks again when one of its own
-- downloads ends: that frees its share).
--
-- Lease ids are "<holder>:<n>", where the holder is the worker's id and a
-- nonce of its process, so a worker restarted under the same id never
-- reuses one; an id that exists already refuses the whole call before any
-- write. The caller never sends the same call twice: after a lost reply it
-- reads K.ldata for its ids instead.
--
-- Keys (by name, lib.lua's K: the shard's key table, protocol.py):
-- K.wait     zset site -> ms when the site may be served next
-- K.leases   zset lease id -> deadline, ms
-- K.ldata    hash lease id -> "priority\tsite\t#deliveries#request"
-- K.active   hash site -> download slots taken now
-- K.due      hash site -> ms before which the site is not served
-- K.retries  zset "priority\tsite\trequest" -> due, ms
-- K.delay    hash site -> delay override, ms (integer >= 0)
-- K.conc     hash site -> concurrency override (integer >= 1)
-- K.count    string: requests queued (all sites)
-- K.slow     hash site -> adaptive extra delay, ms
-- K.alive    zset holder -> ms of its last lease or heartbeat (an
--            expired lease of a holder seen at its deadline or after is
--            requeued without counting its delivery)
-- K.speaks   hash holder -> the protocol it speaks (set when it joins K.alive)
-- K.wactive  hash "holder\tsite" -> slots the worker holds
-- K.rdelay   hash site -> robots.txt Crawl-delay, ms
-- K.lslot    hash lease id -> its site, while the lease holds a download
--            slot there (freed when the download ends)
-- K.robots   hash site -> robots.txt as stored by the workers
-- K.dead     list of dead letters (JSON)
-- K.revisits zset fingerprint -> ms when its revisit is due
-- K.rdata    hash fingerprint -> "priority\tsite\trequest"
-- K.ready    zset site -> -best priority * 2^32 + turn: due sites under
--            their concurrency
-- K.seq      string: the last turn given (a counter)
-- K.prio     hash priority -> requests queued at it (all sites)
-- K.qm, K.qc, K.lv: the queues (see lib.lua)
-- K.joined   hash site -> µs (Redis TIME) when the site took its turn in
--            K.ready (see lib.lua's make_ready)
-- Header options (o, by name):
-- max_deliveries  most deliveries without acknowledgement
--                 (FRONTIER_MAX_DELIVERIES); 0: no limit
-- lease_ms        lease duration, ms
-- delay_ms        default delay per site, ms
-- cap             default concurrency per site
-- candidates      most due sites moved from wait to ready per call, and
--                 most sites passed over or found stale in ready per call
-- housekeeping    most expired leases, due retries and due revisits
--                 handled per call (each)
-- holder          the holder (lease ids are "<holder>:<n>")
-- recheck_ms      ms to wait before asking again when all queued work is on
--                 sites at their concurrency or where this worker holds its
--                 share, and no site is in wait (at most a lease's length)
-- margin          pacing margin: a site's delay is stretched by this
--                 fraction, so that jitter between lease and request never
--                 brings two requests closer than the delay
-- gate            true when robots.txt is obeyed: a site whose robots.txt is
--                 not known yet is served one request at a time
-- held            download slots the worker holds now, as it counts them (at
--                 most that many sites are passed over for its fair share,
--                 on top of candidates); 0 when it does not count them
-- least           the best priority due on the crawl's other shards as the
--                 worker knows it, or absent: after its first lease, the
--                 call leases only from sites whose best priority is at
--                 least that (so a batch does not take this shard's lower
--                 priorities before another shard's better ones)
-- least_us        when the first site at that priority on the other shards
--                 (their heads) joined their ready index, µs, as the worker
--                 knows it, or absent: after its first lease, the call
--                 leases a site of priority `least` only when it joined
--                 K.ready at that time or before (first in, first out
--                 across shards)
-- join            true to keep join times in K.joined (a crawl of several
--                 shards; else none kept, none read: the head's is 0)
-- held_all        leases the worker holds now on all the crawl's shards, as
--                 it counts them: a request whose next death would
--                 dead-letter it (its last chance: delivered at least once,
--                 and once short of max_deliveries) is leased only when this
--                 is 0, as the call's only lease, so that it dies alone if it
--                 is the poison; else it is put back at the front of its
--                 queue, its site passed over, and the reply says so (the
--                 worker then leases nothing until it holds nothing);
--                 absent: the caller does not count them, no request is
--                 held back
-- drained_for     the site of a last chance this worker drained for (a
--                 reply's `passed`), or absent: when held_all is 0 and that
--                 site is due, the call looks at it first, ahead of better
--                 priorities, and leases its request alone if it is still a
--                 last chance (it was in line when it was passed over; else
--                 a worker that drained for it would meet better work first,
--                 lease it, meet the last chance beside it and drain again,
--                 for as long as better work is queued); a site whose head
--                 is no last chance any more keeps its turn
-- jitter          the default jitter j of a site's delay
--                 (DOWNLOAD_DELAY_JITTER, 0: none): each lease of a site sets
--                 its next due time its pace times a factor drawn uniformly
--                 in [1, 1 + j) later, so the delay stays the floor for all
--                 workers (Scrapy: [1 - j, 1 + j) per worker)
-- jitters         sites with a jitter of their own (DOWNLOAD_SLOTS' jitter),
--                 site -> jitter, or absent
-- seed            a random integer from the caller, seeding math.random
--                 (Redis seeds it the same for every call)
-- Payload: ids, the lease ids, one per request wanted.
-- Returns, by name ({name, value, ...}: protocol.py's fields): wait, expired, retried, dead,
-- problems, leases, best, head, passed. leases is {data1, site1,
-- deliveries1, ..., dataN, siteN, deliveriesN}: the first N lease ids were
-- used, for those requests (deliveries counts this one); when none was,
-- wait is the ms until a site, a retry or a revisit is due, or -1 when
-- nothing is queued. (Revisits not due are not queued: they do not count
-- as work.) expired and retried count the housekeeping done, dead the
-- requests the housekeeping dead-lettered (not the unreadable chunks met
-- while leasing: they are in problems); problems lists the bad values met, a line of
-- text each. best is the best priority among the sites due now after the
-- call (the top of K.ready), or "" when none is, and head when the site on
-- top joined K.ready (µs, K.joined; "0" when not known: long ago; "" when
-- none is due), so a worker of a sharded crawl can ask the shard with the
-- best work, the longest due, next; passed is the site of a request whose
-- last chance was passed over because the worker held leases (held_all;
-- the first one met), else ""; alone (with leases) is 1 when the call's
-- only lease is a last chance leased alone (lifecycle.py's suspect), else
-- 0; damaged lists the frontier's own values met that it never writes
-- ({kind, field, ...}: lib.lua's damage), left as they are for the
-- worker's repair. A call without lease ids leases nothing: it
-- moves due sites and does its housekeeping, and tells that priority and
-- the wait (a peek).
local H, refused = policy_open_call('lease')
if not H then return refused end
local O = H.o
local leases, ldata, retries, dead = K.leases, K.ldata, K.retries, K.dead
local max_deliveries = tonumber(O.max_deliveries) or 0
local batch = tonumber(O.housekeeping)
local holder = O.holder
local lease_ms = tonumber(O.lease_ms)

-- Checks that may refuse the call: before any write. K.leases, K.ldata,
-- K.retries, K.count and K.alive are checked by the reads below, which
-- refuse the call on a wrong type before any write. The overrides and
-- politeness hashes, K.delay, K.conc, K.slow, K.rdelay, K.robots, are read
-- leniently: a wrong type there is reported and ignored.
local err = check_types({
  {K.wait, 'zset'}, {K.active, 'hash'}, {K.due, 'hash'}, {K.wactive, 'hash'},
  {K.lslot, 'hash'}, {K.dead, 'list'}, {K.rdata, 'hash'}, {K.ready, 'zset'},
  {K.prio, 'hash'}, {K.qm, 'hash'}, {K.qc, 'hash'}, {K.lv, 'hash'}, {K.speaks, 'hash'},
}) or check_counter(K.count) or check_counter(K.seq)
if err then return err end
local ids = values(H, 'ids')

-- The options of the site policy (lib.lua's site_policy): the pace a
-- lease sets for its site, times a factor drawn in [1, 1 + jitter)
-- (options delay_ms, margin, jitter, jitters, seed). P.now is set below.
math.randomseed(tonumber(O.seed) or 0)
local P = {delay_ms = tonumber(O.delay_ms), margin = tonumber(O.margin),
           jitter = tonumber(O.jitter) or 0,
           jitters = type(O.jitters) == 'table' and O.jitters or nil, draw = math.random}
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
P.now = now
local expired = read('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, batch)
local due_retries = read('ZRANGEBYSCORE', retries, '-inf', now, 'LIMIT', 0, batch)
-- (one cheap read when there are no revisits: an empty key)
local due_revisits = read('ZRANGEBYSCORE', K.revisits, '-inf', now, 'LIMIT', 0, batch)
-- (when this worker was seen before this call, for holder_alive)
local seen_before = tonumber(read('ZSCORE', K.alive, holder))

-- This worker is alive; workers silent for a lease's length are not.
redis.call('ZADD', K.alive, now, holder)
-- (a holder new to K.alive records its protocol, as alive.lua does: its
-- opening call may have been lost before it ran)
if not seen_before then redis.call('HSET', K.speaks, holder, PROTOCOL) end
redis.call('ZREMRANGEBYSCORE', K.alive, '-inf', now - lease_ms)
local live = math.max(1, redis.call('ZCARD', K.alive))
local buried = 0

-- Whether the holder of lease `id` ("<holder>:<n>") was alive when the
-- lease expired: seen (a lease call, a heartbeat) at its deadline or after,
-- this call aside. Such a lease (its extensions late or missed, a worker
-- that lives on) is no death: it is not counted. A worker that died was
-- last seen before the deadline of every lease it held (each heartbeat
-- extends them past itself), whatever the lease length of the caller.
local function holder_alive(id, deadline)
  local h = string.match(id, '^(.*):%d+$')
  if not h or not deadline then return false end
  local seen = seen_before
  if h ~= holder then seen = tonumber(redis.call('ZSCORE', K.alive, h)) end
  return seen ~= nil and seen >= deadline
end
-- 1. Expired leases go back to the front of their queue, with their count
-- of deliveries; past the limit, to the dead-letter list. A lease whose
-- holder is alive (holder_alive) goes back with one delivery less: that
-- one did not end in a death, and is not counted. Requeued in
-- reverse, so that they keep their order at the front.
for i = #expired, 1, -1 do
  local id = expired[i]
  local entry = redis.call('HGET', ldata, id)
  if entry then
    local prio, site, rest = split3(entry)
    local d, data = 0, entry
    if prio then d, data = deliveries_of(rest) end
    if prio and d > 0 and holder_alive(id, tonumber(redis.call('ZSCORE', leases, id))) then
      d = d - 1
    end
    local why = nil
    if not prio_ok(prio) then
      why = 'malformed lease data'
      problem(ldata .. ' ' .. id .. ' is malformed: request dead-lettered')
    elseif max_deliveries > 0 and d >= max_deliveries then
      why = 'delivered ' .. d .. ' times without acknowledgement ' ..
            '(FRONTIER_MAX_DELIVERIES=' .. max_deliveries .. '): its worker died each time'
    else
      local bad = enqueue(site, prio, with_deliveries(d, data), true)
      if bad then
        why = 'could not be requeued: ' .. bad
        problem(bad .. ': request dead-lettered')
      end
    end
    if why then
      bury(dead, why, site, prio, data, d, now, holder_of(id))
      buried = buried + 1
    end
    local freed_site = free_slot(id)
    if site then wake(site, nil, not why and prio or nil) end
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
    local bad = enqueue(site, prio, data, false)
    if bad then
      why = 'could not be queued: ' .. bad
      problem(bad .. ': ' .. what .. ' dead-lettered')
    else
      wake(site, nil, prio)
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
-- fingerprint is in it); their entry leaves K.revisits and K.rdata (the
-- next fetch schedules the next revisit). An entry that cannot be read is
-- dead-lettered with the reason.
for _, fp in ipairs(due_revisits) do
  local entry = redis.call('HGET', K.rdata, fp)
  if not entry then
    problem(K.revisits .. ' holds a fingerprint without an entry in ' .. K.rdata ..
            ': dropped')
  else
    requeue(entry, 'revisit', K.rdata)
  end
  redis.call('ZREM', K.revisits, fp)
  redis.call('HDEL', K.rdata, fp)
end

-- 3. Due sites move from K.wait to K.ready, the earliest due first, up to
-- `candidates` per call (more than a call leases, so the index keeps up with the
-- sites that lease calls put in K.wait; a due site waits its turn, never
-- longer). A site without work, or at its concurrency (lowered while the
-- crawl runs, or still gated on robots.txt), leaves K.wait: commit.lua
-- wakes it when a push or a freed slot makes it a candidate again.
local move_max = tonumber(O.candidates)
local due_sites = redis.call('ZRANGEBYSCORE', K.wait, '-inf', now, 'LIMIT', 0, move_max)
for _, site in ipairs(due_sites) do
  redis.call('ZREM', K.wait, site)
  local best = best_prio(site)
  if best and hnum(K.active, site, INT, 0, 'not an integer: counted as 0') < cap_of(site) then
    make_ready(site, best)
  end
end

-- 4. Lease, one request per lease id, each from the top of K.ready: the
-- site whose best queued request has the highest priority, first in turn
-- among equals. A site where this worker holds its fair share is passed
-- over (it stays for the other workers); at most candidates + held sites
-- are passed over or found stale per call, on top of the ones leased from.
-- What the call learns of a site (its concurrency, slots, pace, best
-- level) is kept for its next request in the same call: nothing else
-- writes them meanwhile.
local out = {} -- data, site and deliveries of each lease
-- (the reply's `dead` counts the housekeeping's dead letters, those of
-- steps 1 to 2b, not the unreadable chunks step 4 buries)
local dead_housekept = buried
local n = 0
local a = 1
local held_all = tonumber(O.held_all) -- (nil: not counted; nothing held back)
local alone = false -- this call leased a request's last chance
local passed_last = '' -- the site of a last chance put back: the worker holds leases
-- (the site this worker drained for: looked at first, once)
local drained_for = held_all == 0 and O.drained_for ~= '' and O.drained_for or nil
local least = tonumber(O.least)
local least_us = least and tonumber(O.least_us)
local pos = 0 -- sites at the top of K.ready passed over in this call
local looks_max = move_max + math.max(0, tonumber(O.held) or 0)
local looks = looks_max + #ids
local known = {}
-- What the leases took, written after the loop (one call each): lease
-- deadlines, slots and data, and the counters.
local taken = {n = 0, prio = {}, sites = {}, leases = {}, slots = {}, data = {}}
while a <= #ids and looks > 0 and not alone do
  local top, hinted = nil, false
  if drained_for then
    local score = redis.call('ZSCORE', K.ready, drained_for)
    if score then top, hinted = {drained_for, score}, true end
    drained_for = nil
  end
  -- (a site looked at out of its turn keeps its place: pos is restored)
  local pos_before = pos
  if not top then top = redis.call('ZRANGE', K.ready, pos, pos, 'WITHSCORES') end
  if #top == 0 then break end
  -- (another shard has better work due, or work of this priority that
  -- joined its ready index earlier: this call's leases end here)
  if n > 0 and least then
    local p = prio_of(tonumber(top[2]))
    if p < least or (p == least and least_us and joined_of(top[1]) > least_us) then break end
  end
  looks = looks - 1
  local site, id = top[1], ids[a]
  local s = known[site]
  if not s then
    local cap = cap_of(site)
    s = {cap = cap, share = math.ceil(cap / live),
         active = hnum(K.active, site, INT, 0, 'not an integer: counted as 0')}
    known[site] = s
  end
  if s.active < s.cap and not s.mine then
    s.mine = hnum(K.wactive, holder .. '\t' .. site, INT, 0, 'not an integer: counted as 0')
  end
  if s.active < s.cap and s.mine >= s.share then
    -- this worker has its share of the site; others may take the rest
    pos = pos + 1
  else
    local level, member, not_before = nil, nil, 0
    if s.active < s.cap then
      if s.level then
        level, member = s.level, s.member
      else
        level, member = best_prio(site)
      end
      -- (a site this call served without a delay is due)
      if not s.due then
        not_before = hnum(K.due, site, INT, 0, 'not an integer: counted as 0')
      end
    end
    s.level = nil
    if not level then
      -- no work, or at its concurrency: commit.lua wakes it
      unready(site)
    elseif not_before > now then
      -- its due time was pushed back meanwhile (robots.txt's Crawl-delay)
      unready(site)
      redis.call('ZADD', K.wait, not_before, site)
    else
      local entry, empty, broken = q_pop(site, member, function(chunk, why)
        problem(why .. ': dead-lettered')
        bury(dead, why, site, member, chunk, 0, now)
        buried = buried + 1
      end)
      local last = nil
      if entry and held_all and max_deliveries > 1 then
        local d0 = deliveries_of(entry)
        last = d0 >= 1 and d0 + 1 >= max_deliveries
      end
      if hinted and entry and not last then
        -- the last chance this worker drained for went to another worker
        -- (or is gone): the site keeps its turn, nothing is taken out of it
        q_push(site, member, entry, true)
        s.level, s.member = level, member
      elseif last and (n > 0 or held_all > 0) then
        -- A last chance, and the worker holds other requests: put it back
        -- where it was (nothing was counted yet) and pass the site over;
        -- the worker drains, then asks with nothing held.
        q_push(site, member, entry, true)
        s.level, s.member = level, member
        if passed_last == '' then passed_last = site end
        pos = pos + 1
      elseif broken then
        -- its queue's K.qm value is damaged (reported): the site is passed
        -- over, its requests kept, until the repair wakes it
        unready(site)
      elseif not entry then
        -- a level without entries (a chunk that could not be read): it is
        -- forgotten, and the site ranked
        -- again by its best level left (its score still named the level
        -- forgotten: its lower priorities would jump the line, and pass
        -- `least`); look again
        s.level, s.member = best_prio(site)
        if s.level then
          make_ready(site, s.level)
        else
          unready(site)
        end
      else
        if not empty then s.level, s.member = level, member end
        -- (the counters are written once per call, after the loop: nothing
        -- in it reads them but this site's, known here. Each counter's
        -- first change of the call is written at once, as hadd does it: a
        -- value that is not an integer, or is below 0, is set right then,
        -- so the slots counted for the site's next request, and the
        -- problems reported, are those of one write per lease; from there
        -- on the counter is 0 or more and the rest adds up the same at once)
        taken.n = taken.n + 1
        if taken.prio[member] then
          taken.prio[member] = taken.prio[member] + 1
        else
          hadd(K.prio, member, -1)
          taken.prio[member] = 0
        end
        local d, data = deliveries_of(entry)
        d = d + 1
        if s.taken then
          s.taken = s.taken + 1
          s.active = s.active + 1
          s.mine = s.mine + 1
        else
          s.taken = 0
          taken.sites[#taken.sites + 1] = site
          s.active = hadd(K.active, site, 1)
          s.mine = hadd(K.wactive, holder .. '\t' .. site, 1)
        end
        -- (the site's policy, read at its first lease of the call; a site
        -- leased again in the same call has no delay: it was due at once)
        local due = now
        if not s.pace then s.pace, s.cap, due = site_policy(site, P, s.cap) end
        redis.call('HSET', K.due, site, due)
        s.due = due <= now
        if not s.level then s.level, s.member = best_prio(site) end
        local best = s.level
        if best and s.active < s.cap and s.due then
          make_ready(site, best) -- behind the sites of its priority
        else
          unready(site)
          if best and s.active < s.cap then redis.call('ZADD', K.wait, due, site) end
        end
        local z, h = taken.leases, taken.slots
        z[#z + 1], z[#z + 2] = now + lease_ms, id
        h[#h + 1], h[#h + 2] = id, site
        h = taken.data
        h[#h + 1], h[#h + 2] = id, member .. '\t' .. site .. '\t#' .. d .. '#' .. data
        out[#out + 1] = data
        out[#out + 1] = site
        out[#out + 1] = d
        n = n + 1
        a = a + 1
        alone = last
      end
    end
  end
  if hinted then pos = pos_before end
end
if n > 0 then
  -- (in parts: unpack is bounded by Lua's stack)
  for j = 1, 2 * n, 2000 do
    local last = math.min(j + 1999, 2 * n)
    redis.call('ZADD', leases, unpack(taken.leases, j, last))
    redis.call('HSET', K.lslot, unpack(taken.slots, j, last))
    redis.call('HSET', ldata, unpack(taken.data, j, last))
  end
  redis.call('DECRBY', K.count, n)
  -- (the first lease of each priority and site was counted in the loop)
  for prio, k in pairs(taken.prio) do
    if k > 0 then hadd(K.prio, prio, -k) end
  end
  for _, site in ipairs(taken.sites) do
    local k = known[site].taken
    if k > 0 then
      hadd(K.active, site, k)
      hadd(K.wactive, holder .. '\t' .. site, k)
    end
  end
end
save_turns()

-- The best priority due now and when the site on top joined K.ready (µs),
-- appended to the reply ("", "" when no site is due). A site on top of
-- K.ready with a score no frontier writes (a priority past +-PRIO_MAX,
-- an infinite one: a key edited by hand) is reported and ranked again by
-- its queued work (or leaves K.ready without any), up to `candidates` of them.
local function best_due()
  for _ = 0, move_max do
    local top = redis.call('ZRANGE', K.ready, 0, 0, 'WITHSCORES')
    if #top == 0 then return '', '' end
    local p = prio_of(tonumber(top[2]))
    if p >= -PRIO_MAX and p <= PRIO_MAX then
      return tostring(p), string.format('%d', joined_of(top[1]))
    end
    problem(K.ready .. ' ' .. top[1] .. ' has the score ' .. top[2] ..
            ', not a frontier score: ranked again')
    local best = best_prio(top[1])
    if best then make_ready(top[1], best) else unready(top[1]) end
    save_turns()
  end
  return '', ''
end

if n > 0 then
  local best, head = best_due()
  return {'expired', #expired, 'retried', #due_retries, 'dead', dead_housekept,
          'problems', problems, 'leases', out, 'best', best, 'head', head,
          'passed', passed_last, 'alone', alone and 1 or 0, 'damaged', damaged}
end

-- Nothing leased: how long until it is worth asking again. Never 0 unless
-- this call moved or housekept all it could (more is due at once).
local wait = -1
-- (K.count as it counts the requests queued: none when it is off)
local counted = tonumber(redis.call('GET', K.count) or '0')
if counted ~= 0 and redis.call('HLEN', K.qm) == 0 then
  -- No queue holds anything, yet K.count counts requests (a key edited by
  -- hand, entries of chunks that could not be read): reported as damaged,
  -- for the repair to count them again (idle workers tell the crawl is
  -- done by that count); this call takes it for 0.
  damage('count', '')
  counted = 0
end
-- The next site in K.wait this worker may lease from when it comes due:
-- sites where it holds its fair share are passed over (it asks again at
-- once when one of its downloads ends), else a worker holding its share of
-- every site under a delay would wake as each of them comes due, many times
-- a second. At most candidates + held are looked at (the sites passed over
-- are among those it holds slots of); past them, the next one's time.
local nxt = redis.call('ZRANGE', K.wait, 0, looks_max, 'WITHSCORES')
for j = 1, #nxt, 2 do
  local site = nxt[j]
  local s = known[site]
  local share = s and s.share or math.ceil(cap_of(site) / live)
  local mine = s and s.mine or
    hnum(K.wactive, holder .. '\t' .. site, INT, 0, 'not an integer: counted as 0')
  if mine < share or j + 1 > 2 * looks_max then
    wait = math.max(0, tonumber(nxt[j + 1]) - now)
    break
  end
end
if redis.call('ZCARD', K.ready) > 0 or
   (wait < 0 and counted > 0) then
  -- Due sites where this worker holds its share, or work only on sites at
  -- their concurrency: a slot frees when a download ends (the worker
  -- leases again at once when it is one of its own) or the next site in
  -- K.wait comes due; ask again by then, within a lease's length.
  if wait < 0 then wait = tonumber(O.recheck_ms) end
  wait = math.min(wait, lease_ms)
end
for _, later in ipairs({retries, K.revisits}) do
  local rnext = redis.call('ZRANGE', later, 0, 0, 'WITHSCORES')
  if #rnext > 0 then
    local rwait = math.max(0, tonumber(rnext[2]) - now)
    if wait < 0 or rwait < wait then wait = rwait end
  end
end
if wait == 0 and #due_sites < move_max and #due_retries < batch and #due_revisits < batch then
  wait = 1
end
local best, head = best_due()
return {'wait', wait, 'expired', #expired, 'retried', #due_retries, 'dead', dead_housekept,
        'problems', problems, 'leases', out, 'best', best, 'head', head,
        'passed', passed_last, 'damaged', damaged}
