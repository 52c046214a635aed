-- commit.lua: a worker's writes to the frontier, all in one atomic call:
-- new requests (each unless its fingerprint was seen), retries, dead
-- letters, freed download slots, acknowledged leases and leases given back.
-- lib.lua is prepended. Sent once per outbox flush; a reply lost on the way
-- back is found out through the commit marker (K.marker), never by sending
-- the call again blindly.
--
-- Keys (by name, lib.lua's K: the shard's key table, protocol.py):
-- K.dupefilter  set of request fingerprints
-- K.wait        zset site -> ms when the site may be served next
-- K.active      hash site -> download slots taken now
-- K.due         hash site -> ms before which the site is not served
-- K.conc        hash site -> concurrency override (integer >= 1)
-- K.count       string: requests queued (all sites)
-- K.leases      zset lease id -> deadline, ms
-- K.ldata       hash lease id -> "priority\tsite\t#deliveries#request"
-- K.wactive     hash "holder\tsite" -> slots the worker holds
-- K.lslot       hash lease id -> its site, while it holds a slot
-- K.robots      hash site -> robots.txt as stored by the workers
-- K.retries     zset "priority\tsite\trequest" -> due, ms
-- K.dead        list of dead letters (JSON)
-- K.marker      {s}:sent:<holder>, string: the sequence number of the
--               holder's last commit (the commit marker)
-- K.revisits    zset fingerprint -> ms when its revisit is due
-- K.rdata       hash fingerprint -> "priority\tsite\trequest"
-- K.revisit     hash site -> revisit interval override, ms (integer >= 0;
--               0: the site is not revisited)
-- K.ready       zset due sites under their concurrency, scored by their
--               best queued request (see lease.lua)
-- K.seq         string: the last turn given in K.ready
-- K.prio        hash priority -> requests queued at it (all sites)
-- K.qm, K.qc, K.lv: the queues (see lib.lua)
-- K.joined      hash site -> µs when it took its turn in K.ready (see
--               lib.lua's make_ready)
-- K.retryat     hash site -> ms when its last retry is due (so housekeeping
--               does not forget a site whose only work waits in K.retries:
--               forget_sites.lua)
-- KEYS[N_KEYS + 1..] the Bloom filter's bitmaps the pushes' specs name
-- Header options (o, by name):
-- cap         default concurrency per site
-- bloom       bitmap size in bytes (an absent bitmap is created zeroed at
--             this size) in Bloom mode (BloomDupeFilter); absent: the set
--             K.dupefilter
-- gate        true when robots.txt is obeyed (a site is served one request
--             at a time until its robots.txt is known)
-- seq         commit sequence number to store in K.marker, or absent
-- marker_ms   how long the marker lasts, ms
-- revisit_ms  default revisit interval, ms (FRONTIER_REVISIT_AFTER)
-- join        true to keep join times in K.joined (a crawl of several
--             shards)
-- Payload groups, in this order (each may be absent):
--   claim (1): a dead letter (exact list entry) to take out of K.dead
--          first: when it is no longer there, nothing is written (requeue
--          and purge never both act on one dead letter)
--   push (6 each): fingerprint (raw bytes, "" skips the dupefilter), "1" to
--          queue even if seen (dont_filter) else "0", site, priority, encoded
--          request, bloom spec ("<i> <offsets>": the bitmap is KEYS[i],
--          i > N_KEYS; decimal offsets separated by spaces; "" in set mode)
--   retry (4 each): priority, site, encoded request, delay ms
--   dead (1 each): the dead letter, JSON
--   slot (1 each): lease id whose download ended (its slot is freed, the
--          lease stays until acked)
--   ack (1 each): lease id whose request was handled (lease ended, slot freed)
--   give (1 each): lease id not handled, given back: its request returns
--          to the front of its queue, not counted as a failed delivery
--   revisit (4 each): fingerprint (raw bytes), site, priority, encoded
--          request (its validators in its meta): due again the site's
--          interval (K.revisit, else revisit_ms) from now, replacing any
--          revisit of that fingerprint; an interval of 0 removes it. Its
--          entry skips the dupefilter when it comes due (lease.lua).
-- Returns, by name ({name, value, ...}: protocol.py's fields): pushed, freed (slots freed), acked
-- (acks that ended a lease), given (given back), problems, claimed, joined,
-- damaged (the frontier's own values met that it never writes, left as
-- they are for the worker's repair: lib.lua's damage):
-- pushed has per push 1 (queued) or 0 (filtered as seen); problems lists
-- the bad values met (each a line of text); claimed is 0 when the claim was
-- not in the list (then nothing else was done); joined is the time of the
-- call, µs of the Redis clock, when join times are kept (a site the call
-- put in K.ready joined then), else "" (so a worker that pushed a better
-- priority than it knew on this shard learns when that site joined, for
-- first in, first out across shards).
local H, refused = policy_open_call('commit')
if not H then return refused end
local O = H.o
local leases, ldata, retries, dead = K.leases, K.ldata, K.retries, K.dead
local size = tonumber(O.bloom)
local bloom = size ~= nil
local n_push, n_retry, n_dead = count(H, 'push'), count(H, 'retry'), count(H, 'dead')
local n_slot, n_ack, n_give = count(H, 'slot'), count(H, 'ack'), count(H, 'give')
local n_revisit = count(H, 'revisit')
local revisit_ms = tonumber(O.revisit_ms) or 0
local claim = values(H, 'claim')[1] or ''

-- Checks that may refuse the call: before any write. (K.due, K.conc and
-- K.robots are only read, leniently: a wrong type there is reported and
-- ignored.)
-- Only the keys this call writes are checked (GET checks the counter's
-- type too; SET replaces the marker whatever it holds).
local spec = {}
if n_push > 0 and not bloom then spec[#spec + 1] = {K.dupefilter, 'set'} end
if n_push + n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {K.wait, 'zset'}
  spec[#spec + 1] = {K.ready, 'zset'}
end
if n_push + n_give > 0 then
  spec[#spec + 1] = {K.prio, 'hash'}
  -- (a request for a damaged queue is parked there: lib.lua's park)
  spec[#spec + 1] = {K.retries, 'zset'}
end
if n_push + n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {K.qm, 'hash'}
  spec[#spec + 1] = {K.qc, 'hash'}
  spec[#spec + 1] = {K.lv, 'hash'}
end
if n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {K.active, 'hash'}
  spec[#spec + 1] = {K.leases, 'zset'}
  spec[#spec + 1] = {K.ldata, 'hash'}
  spec[#spec + 1] = {K.wactive, 'hash'}
  spec[#spec + 1] = {K.lslot, 'hash'}
end
if n_retry > 0 and n_push + n_give == 0 then spec[#spec + 1] = {K.retries, 'zset'} end
if n_revisit > 0 then
  spec[#spec + 1] = {K.revisits, 'zset'}
  spec[#spec + 1] = {K.rdata, 'hash'}
end
if n_push + n_dead + n_give > 0 or claim ~= '' then spec[#spec + 1] = {K.dead, 'list'} end
local err = check_types(spec) or check_counter(K.count) or check_counter(K.seq)
if err then return err end
-- Bloom mode: every bitmap is checked (and created) before anything is
-- written, so a size mismatch fails the whole call.
local bitmaps = {}
if bloom then
  for _, _, _, _, _, spec in records(H, 'push', 6) do
    if spec ~= '' then
      local key = KEYS[tonumber(string.sub(spec, 1, string.find(spec, ' ', 1, true) - 1))]
      if not bitmaps[key] then
        bitmaps[key] = true
        local kind = redis.call('TYPE', key)['ok']
        if kind ~= 'none' and kind ~= 'string' then
          return redis.error_reply('ERR frontier key ' .. key .. ' holds a ' .. kind ..
            ', not a string: nothing was written')
        end
        local len = redis.call('STRLEN', key)
        if len ~= 0 and len ~= size then
          return redis.error_reply('ERR Bloom filter ' .. key .. ' holds ' .. len ..
            ' bytes but this worker expects ' .. size .. ': FRONTIER_BLOOM_CAPACITY ' ..
            'or FRONTIER_BLOOM_ERROR_RATE differ from those the filter was created with')
        end
      end
    end
  end
end

-- A dead letter being requeued: take it out first, or do nothing.
if claim ~= '' and redis.call('LREM', dead, 1, claim) == 0 then
  return {'claimed', 0}
end

K.now = now_ms()
for key in pairs(bitmaps) do
  if redis.call('STRLEN', key) == 0 then redis.call('SETRANGE', key, size - 1, '\0') end
end

-- 1 when the bits of spec ("key offsets") were not all set before.
local function bloom_add(spec)
  local sp = string.find(spec, ' ', 1, true)
  local key = KEYS[tonumber(string.sub(spec, 1, sp - 1))]
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

-- New requests.
local pushed = {}
for fp, dont_filter, site, prio, data, spec in records(H, 'push', 6) do
  local added = 1
  if bloom and spec ~= '' then
    added = bloom_add(spec)
  elseif fp ~= '' then
    added = redis.call('SADD', K.dupefilter, fp)
  end
  if added == 0 and dont_filter ~= '1' then
    pushed[#pushed + 1] = 0
  else
    enqueue_buffered(site, prio, data)
    -- (wake, with its cheapest checks first: most pushes are on sites
    -- in one of the two indexes already)
    local score = redis.call('ZSCORE', K.ready, site)
    if score then
      raise(site, tonumber(score), tonumber(prio))
    elseif redis.call('ZSCORE', K.wait, site) == false then
      wake(site, nil, prio)
    end
    pushed[#pushed + 1] = 1
  end
end
q_flush()

-- Retries wait in the retry set until their backoff has passed. K.retryat
-- keeps the latest time a retry of each site is due: the site has work
-- until then, though none is queued. Read leniently (a wrong type or a bad
-- value is reported; the retry is written all the same).
local retryat = K.retryat
if n_retry > 0 then
  local t = redis.call('TYPE', retryat)['ok']
  if t ~= 'none' and t ~= 'hash' then
    problem(retryat .. ' holds a ' .. t .. ', not a hash: left alone')
    retryat = nil
  end
end
for prio, site, data, delay_ms in records(H, 'retry', 4) do
  local at = K.now + tonumber(delay_ms)
  redis.call('ZADD', retries, at, prio .. '\t' .. site .. '\t' .. data)
  if retryat and hnum(retryat, site, NAT, -1, 'replaced') < at then
    redis.call('HSET', retryat, site, at)
  end
end

for record in records(H, 'dead', 1) do
  redis.call('RPUSH', dead, record)
end

-- Freed slots and acks: each group's slots freed at once, their sites
-- woken (free_slots).
local freed = free_slots(values(H, 'slot'))

-- An acknowledged lease ends: its data and deadline go (a deadline without
-- data is dropped too: nothing is left to requeue).
local ack_ids = values(H, 'ack')
free_slots(ack_ids)
local ended = 0
for j = 1, #ack_ids, 1000 do
  local part = {unpack(ack_ids, j, math.min(j + 999, #ack_ids))}
  ended = ended + redis.call('HDEL', ldata, unpack(part))
  redis.call('ZREM', leases, unpack(part))
end

local given = 0
for id in records(H, 'give', 1) do
  local entry = redis.call('HGET', ldata, id)
  if entry then
    given = given + 1
    local prio, site, rest = split3(entry)
    local d, data = 0, entry
    if prio then d, data = deliveries_of(rest) end
    -- Not a failed delivery: it goes back with the count it came with.
    local why = 'malformed lease data'
    if prio_ok(prio) then
      why = enqueue(site, prio, with_deliveries(math.max(0, d - 1), data), true)
    end
    if why then
      problem(ldata .. ' ' .. id .. ': ' .. why .. ': request dead-lettered')
      bury(dead, 'could not be given back: ' .. why, site, prio, data, d, K.now, holder_of(id))
    end
    redis.call('HDEL', ldata, id)
    redis.call('ZREM', leases, id)
    local freed_site = free_slot(id)
    if site then wake(site, nil, not why and prio or nil) end
    if freed_site and freed_site ~= site then wake(freed_site) end
  end
end

-- Revisits: one entry per fingerprint, the newest fetch's.
for fp, site, prio, data in records(H, 'revisit', 4) do
  local after = hnum(K.revisit, site, NAT, revisit_ms,
                     'revisit interval must be whole ms >= 0: default used')
  if after > 0 then
    redis.call('ZADD', K.revisits, K.now + after, fp)
    redis.call('HSET', K.rdata, fp, prio .. '\t' .. site .. '\t' .. data)
  else
    redis.call('ZREM', K.revisits, fp)
    redis.call('HDEL', K.rdata, fp)
  end
end

if O.seq ~= nil then
  redis.call('SET', K.marker, string.format('%d', O.seq), 'PX', tonumber(O.marker_ms))
end
save_turns()
local joined = ''
if K.join then joined = clock_us end
return {'pushed', pushed, 'freed', freed, 'acked', ended, 'given', given,
        'problems', problems, 'claimed', 1, 'joined', joined, 'damaged', damaged}
