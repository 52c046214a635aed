-- forget_sites.lua: delete the per-site state of sites that have had no
-- work for a while, and advance the housekeeping cursor over {s}:due, in
-- one atomic call: the check and the deletes see the same state, so a site
-- that got work in between is never touched.
--
-- A site is idle when it is in neither K.wait nor K.ready, has no queued
-- request (no field in K.lv), no download slot taken (K.active: no field,
-- or one of 0 or less), and both its due time (K.due) and the due time of
-- its last retry (K.retryat: a site whose only work waits in the retry set
-- has work) are more than `after_ms` ago. While a due retry waits in
-- K.retries (no lease call moved it yet: the workers are paused, say, or
-- behind), no site with a field in K.retryat is idle: its retry may be
-- that one. Its fields in K.due, K.active, K.slow, K.rdelay, K.robots,
-- K.robots_down, K.joined and K.retryat are then deleted, and the field
-- "\t<site>" of K.robots (a download slot's robots.txt gate) too (a field
-- of K.joined is deleted when its site leaves K.ready: one left behind,
-- e.g. by a hand edit of K.ready, goes with the site).
-- The operator's overrides ({s}:delay, {s}:conc, {s}:revisit) are kept.
--
-- Keys (by name, lib.lua's K):
-- K.due          hash site -> ms before which it is not served
-- K.wait         zset sites with work and a free slot
-- K.ready        zset due sites (absent on frontiers without it)
-- K.active       hash site -> download slots taken now
-- K.slow         hash site -> adaptive extra delay, ms
-- K.rdelay       hash site -> robots.txt Crawl-delay, ms
-- K.robots       hash site -> robots.txt
-- K.robots_down  hash site -> robots.txt unreachable state
-- K.forget       string: the HSCAN cursor over K.due
-- K.lv           hash site -> its non-empty priorities (a site with queued
--                requests has a field)
-- K.joined       hash site -> µs when it took its turn in K.ready
-- K.retryat      hash site -> ms when its last retry is due (commit.lua)
-- K.retries      zset "priority\tsite\trequest" -> due, ms
-- Header options (o, by name): cursor, the cursor (text) to store for the next
-- run (0: start over); after_ms, ms without work after which a site is
-- forgotten.
-- Payload: sites, the sites to look at (from HSCAN of K.due).
-- Returns, by name ({name, value, ...}: protocol.py's fields): forgotten
-- (how many sites were forgotten) and problems (one line per bad value
-- met; the site is then left alone).
-- lib.lua is prepended (check_types). Checks that may refuse the call
-- come first: nothing is written then.
local H, refused = open_call('forget_sites')
if not H then return refused end
local spec = {
  {K.due, 'hash'}, {K.wait, 'zset'}, {K.ready, 'zset'}, {K.active, 'hash'},
  {K.forget, 'string'}, {K.lv, 'hash'},
}
local err = check_types(spec)
if err then return err end
local after = tonumber(H.o.after_ms)
if not after or after < 0 then
  return redis.error_reply('ERR forget-after must be ms >= 0, not ' .. tostring(H.o.after_ms))
end
-- The per-site hashes of workers' figures are read leniently: one of
-- another type is skipped (and reported), as lease.lua reads it.
local lenient, problems, lenient_robots = {}, {}, false
for _, key in ipairs({K.slow, K.rdelay, K.robots, K.robots_down, K.joined, K.retryat}) do
  local t = redis.call('TYPE', key)['ok']
  if t == 'none' or t == 'hash' then
    lenient[#lenient + 1] = key
    if key == K.robots then lenient_robots = true end
  else
    problems[#problems + 1] = key .. ' holds a ' .. t .. ', not a hash: left alone'
  end
end
local retryat_read = redis.call('TYPE', K.retryat)['ok'] == 'hash'
local now = now_ms()
-- A due retry not moved yet: every site with a retry time keeps its state.
local unmoved = false
local rt = redis.call('TYPE', K.retries)['ok']
if rt == 'zset' then
  unmoved = #redis.call('ZRANGEBYSCORE', K.retries, '-inf', now, 'LIMIT', 0, 1) > 0
elseif rt ~= 'none' then
  problems[#problems + 1] = K.retries .. ' holds a ' .. rt .. ', not a zset: not read'
end
local INT = '^%-?%d+$'
local forgotten = 0
for site in records(H, 'sites', 1) do
  local due = redis.call('HGET', K.due, site)
  local active = redis.call('HGET', K.active, site)
  local idle = due ~= false
    and redis.call('ZSCORE', K.wait, site) == false
    and redis.call('ZSCORE', K.ready, site) == false
    and redis.call('HEXISTS', K.lv, site) == 0
  if idle and not (#due <= 15 and string.match(due, INT)) then
    problems[#problems + 1] = K.due .. ' ' .. site .. ' = ' .. string.format('%q', due) ..
      ' is not whole ms: counted as 0'
    due = '0'
  end
  -- (K.retryat read only when of the right type: one of another type is
  -- reported above and counts as no retry)
  local retry = idle and retryat_read and redis.call('HGET', K.retryat, site)
  if retry and not (#retry <= 15 and string.match(retry, INT)) then
    problems[#problems + 1] = K.retryat .. ' ' .. site .. ' = ' .. string.format('%q', retry) ..
      ' is not whole ms: counted as 0'
    retry = '0'
  end
  if retry and unmoved then
    idle = false
  elseif retry and tonumber(retry) > tonumber(due) then
    due = retry
  end
  if idle and active and not (#active <= 15 and string.match(active, INT)) then
    problems[#problems + 1] = K.active .. ' ' .. site .. ' = ' ..
      string.format('%q', active) .. ' is not an integer: site left alone'
    idle = false
  end
  if idle and (not active or tonumber(active) <= 0) and tonumber(due) < now - after then
    redis.call('HDEL', K.due, site)
    redis.call('HDEL', K.active, site)
    for _, key in ipairs(lenient) do redis.call('HDEL', key, site) end
    -- (a download slot's robots.txt gate: lib.lua's cap_of)
    if lenient_robots then redis.call('HDEL', K.robots, '\t' .. site) end
    forgotten = forgotten + 1
  end
end
redis.call('SET', K.forget, tostring(H.o.cursor or '0'))
return {'forgotten', forgotten, 'problems', problems}
