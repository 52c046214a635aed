-- forget_sites.lua: delete the per-site state of sites that have had no
-- work for a while, and advance the housekeeping cursor over {s}:due, in
-- one atomic call: the check and the deletes see the same state, so a site
-- that got work in between is never touched.
--
-- A site is idle when it is in neither KEYS[2] nor KEYS[3], has no queued
-- request (no field in KEYS[10]), no download slot taken (KEYS[4]: no field,
-- or one of 0 or less), and both its due time (KEYS[1]) and the due time of
-- its last retry (KEYS[12]: a site whose only work waits in the retry set
-- has work) are more than ARGV[2] ms ago. While a due retry waits in
-- KEYS[13] (no lease call moved it yet: the workers are paused, say, or
-- behind), no site with a field in KEYS[12] is idle: its retry may be that
-- one. Its fields in KEYS[1], [4], [5], [6], [7], [8], [11] and [12] are
-- then deleted, and the field "\t<site>" of KEYS[7] (a download slot's
-- robots.txt gate) too (a field of KEYS[11] is deleted when its site leaves KEYS[3]: one
-- left behind, e.g. by a hand edit of KEYS[3], goes with the site).
-- The operator's overrides ({s}:delay, {s}:conc, {s}:revisit) are kept.
--
-- KEYS[1]  {s}:due          hash site -> ms before which it is not served
-- KEYS[2]  {s}:wait         zset sites with work and a free slot
-- KEYS[3]  {s}:ready        zset due sites (absent on frontiers without it)
-- KEYS[4]  {s}:active       hash site -> download slots taken now
-- KEYS[5]  {s}:slow         hash site -> adaptive extra delay, ms
-- KEYS[6]  {s}:rdelay       hash site -> robots.txt Crawl-delay, ms
-- KEYS[7]  {s}:robots       hash site -> robots.txt
-- KEYS[8]  {s}:robots:down  hash site -> robots.txt unreachable state
-- KEYS[9]  {s}:forget       string: the HSCAN cursor over KEYS[1]
-- KEYS[10] {s}:lv           hash site -> its non-empty priorities (a site
--                           with queued requests has a field)
-- KEYS[11] {s}:joined       hash site -> µs when it took its turn in KEYS[3]
-- KEYS[12] {s}:retryat      hash site -> ms when its last retry is due
--                           (commit.lua)
-- KEYS[13] {s}:retries      zset "priority\tsite\trequest" -> due, ms
-- ARGV[1]  the cursor to store for the next run ("0": start over)
-- ARGV[2]  ms without work after which a site is forgotten
-- ARGV[3..] the sites to look at (from HSCAN of KEYS[1])
-- Returns {forgotten, problems}: how many sites were forgotten, and one line
-- per bad value met (the site is then left alone).
-- lib.lua is prepended (check_types). Checks that may refuse the call
-- come first: nothing is written then.
local spec = {
  {KEYS[1], 'hash'}, {KEYS[2], 'zset'}, {KEYS[3], 'zset'}, {KEYS[4], 'hash'},
  {KEYS[9], 'string'}, {KEYS[10], 'hash'},
}
local err = check_types(spec)
if err then return err end
local after = tonumber(ARGV[2])
if not after or after < 0 then
  return redis.error_reply('ERR forget-after must be ms >= 0, not ' .. tostring(ARGV[2]))
end
-- The per-site hashes of workers' figures are read leniently: one of
-- another type is skipped (and reported), as lease.lua reads it.
local lenient, problems, lenient_robots = {}, {}, false
for _, i in ipairs({5, 6, 7, 8, 11, 12}) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t == 'none' or t == 'hash' then
    lenient[#lenient + 1] = KEYS[i]
    if i == 7 then lenient_robots = true end
  else
    problems[#problems + 1] = KEYS[i] .. ' holds a ' .. t .. ', not a hash: left alone'
  end
end
local retryat_read = redis.call('TYPE', KEYS[12])['ok'] == 'hash'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- A due retry not moved yet: every site with a retry time keeps its state.
local unmoved = false
local rt = redis.call('TYPE', KEYS[13])['ok']
if rt == 'zset' then
  unmoved = #redis.call('ZRANGEBYSCORE', KEYS[13], '-inf', now, 'LIMIT', 0, 1) > 0
elseif rt ~= 'none' then
  problems[#problems + 1] = KEYS[13] .. ' holds a ' .. rt .. ', not a zset: not read'
end
local INT = '^%-?%d+$'
local forgotten = 0
for i = 3, #ARGV do
  local site = ARGV[i]
  local due = redis.call('HGET', KEYS[1], site)
  local active = redis.call('HGET', KEYS[4], site)
  local idle = due ~= false
    and redis.call('ZSCORE', KEYS[2], site) == false
    and redis.call('ZSCORE', KEYS[3], site) == false
    and redis.call('HEXISTS', KEYS[10], site) == 0
  if idle and not (#due <= 15 and string.match(due, INT)) then
    problems[#problems + 1] = KEYS[1] .. ' ' .. site .. ' = ' .. string.format('%q', due) ..
      ' is not whole ms: counted as 0'
    due = '0'
  end
  -- (KEYS[12] read only when of the right type: one of another type is
  -- reported above and counts as no retry)
  local retry = idle and retryat_read and redis.call('HGET', KEYS[12], site)
  if retry and not (#retry <= 15 and string.match(retry, INT)) then
    problems[#problems + 1] = KEYS[12] .. ' ' .. site .. ' = ' .. string.format('%q', retry) ..
      ' is not whole ms: counted as 0'
    retry = '0'
  end
  if retry and unmoved then
    idle = false
  elseif retry and tonumber(retry) > tonumber(due) then
    due = retry
  end
  if idle and active and not (#active <= 15 and string.match(active, INT)) then
    problems[#problems + 1] = KEYS[4] .. ' ' .. site .. ' = ' ..
      string.format('%q', active) .. ' is not an integer: site left alone'
    idle = false
  end
  if idle and (not active or tonumber(active) <= 0) and tonumber(due) < now - after then
    redis.call('HDEL', KEYS[1], site)
    redis.call('HDEL', KEYS[4], site)
    for _, key in ipairs(lenient) do redis.call('HDEL', key, site) end
    -- (a download slot's robots.txt gate: lib.lua's cap_of)
    if lenient_robots then redis.call('HDEL', KEYS[7], '\t' .. site) end
    forgotten = forgotten + 1
  end
end
redis.call('SET', KEYS[9], ARGV[1])
return {forgotten, problems}
