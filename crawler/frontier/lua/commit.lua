-- commit.lua: a worker's writes to the frontier, all in one atomic call:
-- new requests (each unless its fingerprint was seen), retries, dead
-- letters, freed download slots, acknowledged leases and leases given back.
-- lib.lua is prepended. Sent once per outbox flush; a reply lost on the way
-- back is found out through the commit marker (KEYS[14]), never by sending
-- the call again blindly.
--
-- KEYS[1]  {s}:dupefilter   set of request fingerprints
-- KEYS[2]  {s}:wait         zset site -> ms when the site may be served next
-- KEYS[3]  {s}:active       hash site -> download slots taken now
-- KEYS[4]  {s}:due          hash site -> ms before which the site is not served
-- KEYS[5]  {s}:conc         hash site -> concurrency override (integer >= 1)
-- KEYS[6]  {s}:count        string: requests queued (all sites)
-- KEYS[7]  {s}:leases       zset lease id -> deadline, ms
-- KEYS[8]  {s}:ldata        hash lease id -> "priority\tsite\t#deliveries#request"
-- KEYS[9]  {s}:wactive      hash "holder\tsite" -> slots the worker holds
-- KEYS[10] {s}:lslot        hash lease id -> its site, while it holds a slot
-- KEYS[11] {s}:robots       hash site -> robots.txt as stored by the workers
-- KEYS[12] {s}:retries      zset "priority\tsite\trequest" -> due, ms
-- KEYS[13] {s}:dead         list of dead letters (JSON)
-- KEYS[14] {s}:sent:<holder> string: the sequence number of the holder's
--                           last commit (the commit marker)
-- KEYS[15] {s}:revisits     zset fingerprint -> ms when its revisit is due
-- KEYS[16] {s}:rdata        hash fingerprint -> "priority\tsite\trequest"
-- KEYS[17] {s}:revisit      hash site -> revisit interval override, ms
--                           (integer >= 0; 0: the site is not revisited)
-- KEYS[18] {s}:ready        zset due sites under their concurrency, scored
--                           by their best queued request (see lease.lua)
-- KEYS[19] {s}:seq          string: the last turn given in KEYS[18]
-- KEYS[20] {s}:prio         hash priority -> requests queued at it (all sites)
-- KEYS[21] {s}:qm           hash "site\tpriority" -> "<head> <tail>" chunk numbers
-- KEYS[22] {s}:qc           hash "site\tpriority\t<n>" -> chunk n of that queue
-- KEYS[23] {s}:lv           hash site -> its non-empty priorities, highest first
--                           (KEYS[21..23]: the queues, see lib.lua)
-- KEYS[24] {s}:joined       hash site -> µs when it took its turn in KEYS[18]
--                           (see lib.lua's make_ready)
-- KEYS[25] {s}:retryat      hash site -> ms when its last retry is due (so
--                           housekeeping does not forget a site whose only
--                           work waits in KEYS[12]: forget_sites.lua)
-- KEYS[26..] the Bloom filter's bitmaps the pushes' specs name (Bloom mode)
-- ARGV[1]  key prefix "{s}:" (per-site keys are built from it; same hash tag)
-- ARGV[2]  default concurrency per site
-- ARGV[3]  dupefilter mode: "set", or "bloom" (BloomDupeFilter)
-- ARGV[4]  bloom: bitmap size in bytes (an absent bitmap is created zeroed at
--          this size); else ""
-- ARGV[5]  "1" when robots.txt is obeyed (a site is served one request at a
--          time until its robots.txt is known)
-- ARGV[6]  commit sequence number to store in KEYS[14], or "" for none
-- ARGV[7]  how long the marker lasts, ms
-- ARGV[8]  a dead letter (exact list entry) to take out of KEYS[13] first, or
--          "": when it is no longer there, nothing is written (requeue and
--          purge never both act on one dead letter)
-- ARGV[9..14] how many of each group follow: pushes, retries, dead letters,
--          slots, acks, givebacks
-- ARGV[15] default revisit interval, ms (FRONTIER_REVISIT_AFTER)
-- ARGV[16] how many revisits follow the other groups
-- ARGV[17] "1" to keep join times in KEYS[24] (a crawl of several shards),
--          else "0"; then the groups, in that order:
--   push (6 each): fingerprint (raw bytes, "" skips the dupefilter), "1" to
--          queue even if seen (dont_filter) else "0", site, priority, encoded
--          request, bloom spec ("<i> <offsets>": the bitmap is KEYS[i], i >= 26;
--          decimal offsets
--          separated by spaces; "" in set mode)
--   retry (4 each): priority, site, encoded request, delay ms
--   dead (1 each): the dead letter, JSON
--   slot (1 each): lease id whose download ended (its slot is freed, the
--          lease stays until acked)
--   ack (1 each): lease id whose request was handled (lease ended, slot freed)
--   giveback (1 each): lease id not handled, given back: its request returns
--          to the front of its queue, not counted as a failed delivery
--   revisit (4 each): fingerprint (raw bytes), site, priority, encoded
--          request (its validators in its meta): due again the site's
--          interval (KEYS[17], else ARGV[15]) from now, replacing any
--          revisit of that fingerprint; an interval of 0 removes it. Its
--          entry skips the dupefilter when it comes due (lease.lua).
-- Returns {pushed, slots freed, acks ended, given back, problems, claimed,
-- joined}: pushed has per push 1 (queued) or 0 (filtered as seen); problems
-- lists the bad values met (each a line of text); claimed is 0 when ARGV[8]
-- was not in the list (then nothing else was done); joined is the time of
-- the call, µs of the Redis clock, when join times are kept (ARGV[17]; a
-- site the call put in KEYS[18] joined then), else "" (so a worker that
-- pushed a better priority than it knew on this shard learns when that
-- site joined, for first in, first out across shards).
K.P = ARGV[1]
K.cap = tonumber(ARGV[2])
K.gate = ARGV[5] == '1'
K.join = ARGV[17] == '1'
K.wait, K.active, K.due, K.conc, K.count = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
K.wactive, K.lslot, K.robots, K.ldata = KEYS[9], KEYS[10], KEYS[11], KEYS[8]
K.ready, K.seq, K.prio = KEYS[18], KEYS[19], KEYS[20]
K.qm, K.qc, K.lv, K.joined = KEYS[21], KEYS[22], KEYS[23], KEYS[24]
local leases, ldata, retries, dead = KEYS[7], KEYS[8], KEYS[12], KEYS[13]
local bloom = ARGV[3] == 'bloom'
local size = tonumber(ARGV[4])
local n_push, n_retry, n_dead = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local n_slot, n_ack, n_give = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local revisit_ms, n_revisit = tonumber(ARGV[15]), tonumber(ARGV[16])
local first = 18

-- Checks that may refuse the call: before any write. (KEYS[4], KEYS[5] and
-- KEYS[11] are only read, leniently: a wrong type there is reported and
-- ignored.)
-- Only the keys this call writes are checked (GET checks the counter's
-- type too; SET replaces the marker whatever it holds).
local spec = {}
if n_push > 0 and not bloom then spec[#spec + 1] = {KEYS[1], 'set'} end
if n_push + n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {KEYS[2], 'zset'}
  spec[#spec + 1] = {KEYS[18], 'zset'}
end
if n_push + n_give > 0 then spec[#spec + 1] = {KEYS[20], 'hash'} end
if n_push + n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {KEYS[21], 'hash'}
  spec[#spec + 1] = {KEYS[22], 'hash'}
  spec[#spec + 1] = {KEYS[23], 'hash'}
end
if n_slot + n_ack + n_give > 0 then
  spec[#spec + 1] = {KEYS[3], 'hash'}
  spec[#spec + 1] = {KEYS[7], 'zset'}
  spec[#spec + 1] = {KEYS[8], 'hash'}
  spec[#spec + 1] = {KEYS[9], 'hash'}
  spec[#spec + 1] = {KEYS[10], 'hash'}
end
if n_retry > 0 then spec[#spec + 1] = {KEYS[12], 'zset'} end
if n_revisit > 0 then
  spec[#spec + 1] = {KEYS[15], 'zset'}
  spec[#spec + 1] = {KEYS[16], 'hash'}
end
if n_push + n_dead + n_give > 0 or ARGV[8] ~= '' then spec[#spec + 1] = {KEYS[13], 'list'} end
local err = check_types(spec) or check_counter(KEYS[6]) or check_counter(KEYS[19])
if err then return err end
-- Bloom mode: every bitmap is checked (and created) before anything is
-- written, so a size mismatch fails the whole call.
local bitmaps = {}
if bloom then
  for i = first, first + 6 * n_push - 1, 6 do
    local spec = ARGV[i + 5]
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
if ARGV[8] ~= '' and redis.call('LREM', dead, 1, ARGV[8]) == 0 then
  return {{}, 0, 0, 0, {}, 0, ''}
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
local i = first
for _ = 1, n_push do
  local fp, dont_filter, site, prio, data, spec = ARGV[i], ARGV[i + 1], ARGV[i + 2],
                                                  ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  i = i + 6
  local added = 1
  if bloom and spec ~= '' then
    added = bloom_add(spec)
  elseif fp ~= '' then
    added = redis.call('SADD', KEYS[1], fp)
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

-- Retries wait in the retry set until their backoff has passed. KEYS[25]
-- keeps the latest time a retry of each site is due: the site has work
-- until then, though none is queued. Read leniently (a wrong type or a bad
-- value is reported; the retry is written all the same).
local retryat = KEYS[25]
if n_retry > 0 then
  local t = redis.call('TYPE', retryat)['ok']
  if t ~= 'none' and t ~= 'hash' then
    problem(retryat .. ' holds a ' .. t .. ', not a hash: left alone')
    retryat = nil
  end
end
for _ = 1, n_retry do
  local site, at = ARGV[i + 1], K.now + tonumber(ARGV[i + 3])
  redis.call('ZADD', retries, at, ARGV[i] .. '\t' .. site .. '\t' .. ARGV[i + 2])
  if retryat and hnum(retryat, site, NAT, -1, 'replaced') < at then
    redis.call('HSET', retryat, site, at)
  end
  i = i + 4
end

for _ = 1, n_dead do
  redis.call('RPUSH', dead, ARGV[i])
  i = i + 1
end

-- Freed slots and acks: each group's slots freed at once, their sites
-- woken (free_slots).
local function take_ids(count)
  local ids = {}
  for j = 1, count do ids[j] = ARGV[i + j - 1] end
  i = i + count
  return ids
end
local freed = free_slots(take_ids(n_slot))

-- An acknowledged lease ends: its data and deadline go (a deadline without
-- data is dropped too: nothing is left to requeue).
local ack_ids = take_ids(n_ack)
free_slots(ack_ids)
local ended = 0
for j = 1, #ack_ids, 1000 do
  local part = {unpack(ack_ids, j, math.min(j + 999, #ack_ids))}
  ended = ended + redis.call('HDEL', ldata, unpack(part))
  redis.call('ZREM', leases, unpack(part))
end

local given = 0
for _ = 1, n_give do
  local id = ARGV[i]
  i = i + 1
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
      bury(dead, 'could not be given back: ' .. why, site, prio, data, d, K.now)
    end
    redis.call('HDEL', ldata, id)
    redis.call('ZREM', leases, id)
    local freed_site = free_slot(id)
    if site then wake(site, nil, not why and prio or nil) end
    if freed_site and freed_site ~= site then wake(freed_site) end
  end
end

-- Revisits: one entry per fingerprint, the newest fetch's.
for _ = 1, n_revisit do
  local fp, site, prio, data = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  local after = hnum(KEYS[17], site, NAT, revisit_ms,
                     'revisit interval must be whole ms >= 0: default used')
  if after > 0 then
    redis.call('ZADD', KEYS[15], K.now + after, fp)
    redis.call('HSET', KEYS[16], fp, prio .. '\t' .. site .. '\t' .. data)
  else
    redis.call('ZREM', KEYS[15], fp)
    redis.call('HDEL', KEYS[16], fp)
  end
end

if ARGV[6] ~= '' then
  redis.call('SET', KEYS[14], ARGV[6], 'PX', tonumber(ARGV[7]))
end
save_turns()
local joined = ''
if K.join then joined = clock_us end
return {pushed, freed, ended, given, problems, 1, joined}
