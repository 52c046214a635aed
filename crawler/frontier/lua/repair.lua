-- repair.lua: repair one of a shard's queue values that the frontier never
-- writes (a key edited by hand), in one atomic call. lib.lua is prepended.
-- The hot scripts (lease.lua, commit.lua) repair nothing: they leave such a
-- value as it is, pass its site or queue over and report it (lib.lua's
-- damage); crawler/frontier/audit.py's repair runs this script, for
-- `scrapy frontier audit --repair` and for the worker that got the report.
-- Idempotent: a value that is fine is left as it is (run twice, or after a
-- lost reply, it does nothing more).
--
-- Header options (o, by name): kind, field:
-- * kind "qm", field "site\tprio": when K.qm's bounds of that queue are not
--   "<head> <tail>" as the frontier writes them, they are rebuilt from the
--   queue's chunks in K.qc, so no queued request is stranded: their numbers
--   in order, the chunks renumbered one after another from the lowest when
--   there are gaps (so a pop never walks a gap); with no chunk left the
--   field is deleted. (A field of K.qc whose number the scripts never
--   write, e.g. "007", is left where it is and counted in the reply.) Then
--   the site's K.lv, as for "lv".
-- * kind "lv", field site: K.lv's value for the site is set to the
--   priorities of its queues in K.qm, highest first (deleted when it has
--   none), when it is not that already.
-- * kind "count", field "": when no queue is left in K.qm and K.count
--   counts requests all the same, K.count is set to 0 and K.prio deleted
--   (nothing is queued: the counts of requests lost with chunks that could
--   not be read, or edited by hand).
-- * kind "joined", field site: K.joined's time for the site deleted when it
--   is not whole µs (the scripts read it as 0, long ago, all the same).
-- Then (qm, lv) a site with queued requests in neither K.ready nor K.wait (passed
-- over while its value was damaged) is put in K.wait at its due time
-- (K.due, else 0): the next lease call moves it on as for any due site.
-- Keys (by name, lib.lua's K): K.qm, K.qc, K.lv (the queues), K.wait,
-- K.ready, K.due, K.joined, K.count, K.prio.
-- Returns, by name: repaired, a list of lines (what was wrong and what was
-- done; empty when nothing was).
local H, refused = open_call('repair')
if not H then return refused end
local O = H.o
local kind, field = O.kind, O.field
if type(field) ~= 'string' or
   (kind ~= 'qm' and kind ~= 'lv' and kind ~= 'joined' and kind ~= 'count') then
  return redis.error_reply('ERR frontier repair of ' .. tostring(kind) ..
    ' not known (qm, lv, joined, count): nothing was written')
end
if kind == 'count' then
  local err = check_types({{K.qm, 'hash'}, {K.prio, 'hash'}}) or check_counter(K.count)
  if err then return err end
  local counted = redis.call('GET', K.count)
  if tonumber(counted or '0') ~= 0 and redis.call('HLEN', K.qm) == 0 then
    redis.call('SET', K.count, 0)
    redis.call('DEL', K.prio)
    return {'repaired', {K.count .. ' counted ' .. counted ..
      ' queued requests with every queue empty: set to 0 (and ' .. K.prio .. ' deleted)'}}
  end
  return {'repaired', {}}
end
if kind == 'joined' then
  local err = check_types({{K.joined, 'hash'}})
  if err then return err end
  local v = redis.call('HGET', K.joined, field)
  if v and not (#v <= 16 and string.match(v, NAT)) then
    redis.call('HDEL', K.joined, field)
    return {'repaired', {K.joined .. ' ' .. field .. ' = ' .. string.format('%q', v) ..
      ' is not whole µs: deleted (joined long ago, as the scripts read it)'}}
  end
  return {'repaired', {}}
end
local err = check_types({
  {K.qm, 'hash'}, {K.qc, 'hash'}, {K.lv, 'hash'}, {K.wait, 'zset'}, {K.ready, 'zset'},
})
if err then return err end
local done = {}

local function glob(text)
  return (string.gsub(text, '[%[%]%*%?\\]', '\\%0'))
end

-- The priorities of the site's queues in K.qm, highest first.
local function scan_levels(site)
  local found, seen, cursor = {}, {}, '0'
  repeat
    local r = redis.call('HSCAN', K.qm, cursor, 'MATCH', glob(site) .. '\t*', 'COUNT', 1000)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      local p = string.sub(r[2][i], #site + 2)
      if prio_ok(p) and not seen[p] then
        seen[p] = true
        found[#found + 1] = p
      end
    end
  until cursor == '0'
  table.sort(found, function(a, b) return tonumber(a) > tonumber(b) end)
  return found
end

-- Rebuild queue `f`'s bounds (K.qm value `b`, not one the frontier
-- writes) from its chunks in K.qc.
local function rebuild_bounds(f, b)
  local found, seen, odd, cursor = {}, {}, 0, '0'
  repeat
    local r = redis.call('HSCAN', K.qc, cursor, 'MATCH', glob(f) .. '\t*', 'COUNT', 1000)
    cursor = r[1]
    for i = 1, #r[2], 2 do
      -- (HSCAN may return a field twice: each is counted once)
      local suffix = string.sub(r[2][i], #f + 2)
      if not seen[suffix] then
        seen[suffix] = true
        local n = not string.find(suffix, '\t', 1, true) and chunk_no(suffix)
        if n then found[#found + 1] = n else odd = odd + 1 end
      end
    end
  until cursor == '0'
  local what = K.qm .. ' ' .. f .. ' = ' .. string.format('%q', b) ..
               ' is not "<head> <tail>": '
  if odd > 0 then
    what = what .. odd .. ' chunks with numbers the frontier never writes left in ' ..
           K.qc .. '; '
  end
  if #found == 0 then
    redis.call('HDEL', K.qm, f)
    return what .. 'no chunk of the queue left in ' .. K.qc .. ', dropped'
  end
  table.sort(found)
  local head = found[1]
  -- (ascending, each to the lowest free number: never onto a chunk not
  -- moved yet, which all have higher numbers)
  for i, n in ipairs(found) do
    local to = head + i - 1
    if n ~= to then
      redis.call('HSET', K.qc, f .. '\t' .. to, redis.call('HGET', K.qc, f .. '\t' .. n))
      redis.call('HDEL', K.qc, f .. '\t' .. n)
    end
  end
  redis.call('HSET', K.qm, f, head .. ' ' .. head + #found - 1)
  return what .. 'rebuilt from its chunks in ' .. K.qc .. ' (' .. #found .. ' found)'
end

local site = field
if kind == 'qm' then
  site = string.match(field, '^(.*)\t[^\t]*$')
  if not site then
    return redis.error_reply('ERR frontier repair: ' .. string.format('%q', field) ..
      ' is no queue ("site\\tprio"): nothing was written')
  end
  local b = redis.call('HGET', K.qm, field)
  if b and not q_bounds(b) then done[#done + 1] = rebuild_bounds(field, b) end
end

local v = redis.call('HGET', K.lv, site)
local levels = scan_levels(site)
local want = table.concat(levels, ' ')
if (v or '') ~= want then
  q_set_levels(site, levels)
  done[#done + 1] = K.lv .. ' ' .. site .. ' = ' .. string.format('%q', v or '') ..
    ' is not the priorities of its queues in ' .. K.qm .. ': set to ' ..
    string.format('%q', want)
end

if #levels > 0 and not redis.call('ZSCORE', K.ready, site) and
   not redis.call('ZSCORE', K.wait, site) then
  local due = redis.pcall('HGET', K.due, site)
  if type(due) ~= 'string' or #due > 15 or not string.match(due, NAT) then due = '0' end
  redis.call('ZADD', K.wait, due, site)
end
return {'repaired', done}
