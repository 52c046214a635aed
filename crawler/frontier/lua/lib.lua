-- lib.lua: helpers shared by the frontier's scripts. It is prepended to
-- commit.lua and lease.lua when they are loaded (crawler/frontier/store.py),
-- so each script stays one atomic call.
--
-- The rules every script follows, so that a bad value or a wrong type never
-- loses work:
-- * Every check that can refuse the call (a key of the wrong type, a counter
--   that is not a number, a lease id that exists already) runs before the
--   first write, and refuses with an error reply that names the key and the
--   value: nothing was written, so the caller may send the call again once
--   the operator has fixed the key.
-- * After the first write nothing raises. A bad override falls back to its
--   default; a bad entry goes to the dead-letter list with the reason; each
--   is reported in the reply's list of problems (key, field, value, what was
--   done), which the worker logs once.
-- * A request is written to its destination before it is removed from its
--   source, or both happen in one step that cannot fail half-way.
-- * The queues' own structures (K.qm's bounds, K.lv's priorities, K.count,
--   K.joined's times) are the frontier's: the scripts trust them and repair
--   nothing. A value there that the frontier never writes (a key edited by
--   hand) is left as it is, the site or queue it belongs to is passed over
--   (its requests wait, none is lost), and the reply names it in `damaged`
--   (kind, field): the worker then runs the repair of `scrapy frontier
--   audit --repair` on that one value (crawler/frontier/audit.py,
--   repair.lua).
-- Times are the Redis server's clock (TIME), in ms.

local problems, reported = {}, {}

-- The frontier's own values met that it never writes: {kind1, field1,
-- kind2, field2, ...} (the reply's `damaged`), each once per call.
local damaged, damaged_seen = {}, {}
local function damage(kind, field)
  local k = kind .. '\t' .. field
  if not damaged_seen[k] then
    damaged_seen[k] = true
    damaged[#damaged + 1] = kind
    damaged[#damaged + 1] = field
  end
end

-- Report `text` once per call.
local function problem(text)
  if not reported[text] then
    reported[text] = true
    problems[#problems + 1] = text
  end
end

-- The time of this call in µs as a string of digits (exact: no Lua number
-- in between), read once per call (by now_ms() or the first make_ready).
local clock_us = nil

local function read_clock(t)
  clock_us = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
end

local function now_ms()
  local t = redis.call('TIME')
  read_clock(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- An error reply (or nil) when one of `spec` ({{key, type}, ...}) holds
-- another type than its own; call it before any write.
local function check_types(spec)
  for _, kt in ipairs(spec) do
    local t = redis.call('TYPE', kt[1])['ok']
    if t ~= 'none' and t ~= kt[2] then
      return redis.error_reply('ERR frontier key ' .. kt[1] .. ' holds a ' .. t ..
        ', not a ' .. kt[2] .. ': nothing was written')
    end
  end
  return nil
end

-- redis.call(command, key, ...) for a read before any write: a key of the
-- wrong type refuses the call with an error that names the key.
local function read(command, key, ...)
  local r = redis.pcall(command, key, ...)
  if type(r) == 'table' and r['err'] then
    error({err = 'ERR frontier key ' .. key .. ': ' .. r['err'] .. ': nothing was written'})
  end
  return r
end

-- An error reply (or nil) when the string `key` holds something other than
-- an integer of at most 15 digits (INCR and DECR fail past 2^63, and Lua's
-- numbers are exact to 2^53); call it before any write.
local function check_counter(key)
  local v = redis.call('GET', key)
  if v and not (#v <= 16 and string.match(v, '^%-?%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$')) then
    return redis.error_reply('ERR frontier key ' .. key .. ' holds ' ..
      string.format('%q', v) .. ', not an integer: nothing was written')
  end
  return nil
end

-- A per-site value of hash `key`, when it matches `pattern`; else `default`
-- (a value that does not match, or a key that is not a hash, is reported as
-- `rule` says). Never raises, so it may be used after writes.
local function hnum(key, site, pattern, default, rule)
  local v = redis.pcall('HGET', key, site)
  if type(v) == 'table' then
    problem(key .. ' is not a hash: ignored (' .. rule .. ')')
    return default
  end
  if not v then return default end
  -- At most 15 digits: a longer number is no count of ms or slots, and would
  -- turn into an inexact or infinite Lua number.
  if #v <= 15 and string.match(v, pattern) then return tonumber(v) end
  problem(key .. ' ' .. site .. ' = ' .. string.format('%q', v) .. ' ignored (' .. rule .. ')')
  return default
end

local INT = '^%-?%d+$'
-- The priorities the frontier takes: -PRIO_MAX to PRIO_MAX (the workers
-- refuse others; store.py's PRIORITY_LIMIT is the same number). A ready
-- score, -priority * TURN + turn, is then below 2^52: an exact double.
local PRIO_MAX = 1000000
-- A queued priority as the workers write it (an integer within +-PRIO_MAX).
local function prio_ok(prio)
  return prio ~= nil and #prio <= 8 and string.match(prio, INT) ~= nil
    and math.abs(tonumber(prio)) <= PRIO_MAX
end
local NAT = '^%d+$'
local POS = '^[1-9]%d*$'

-- `n`, the counter `field` of hash `key` just written; deleted (0) at 0 or below.
local function kept(key, field, n)
  if n <= 0 then
    redis.call('HDEL', key, field)
    return 0
  end
  return n
end

-- Add `by` to the counter `field` of hash `key`; a counter that falls to 0
-- or below is deleted. A counter that is not an integer counts as 0 (and is
-- reported).
local function hadd(key, field, by)
  local n = redis.pcall('HINCRBY', key, field, by)
  if type(n) == 'table' then
    problem(key .. ' ' .. field .. ' is not an integer: counted as 0')
    n = by
    if n > 0 then redis.call('HSET', key, field, n) end
  end
  return kept(key, field, n)
end

-- hadd(key, field, by) `times` times, in one HINCRBY when the counter is
-- an integer that stays in range (else one by one, as hadd does it). It
-- ends as the writes one by one would when `by` < 0, or the counter is 0
-- or more (or absent) before: none of them falls to 0 on the way.
local function hadd_times(key, field, by, times)
  local n = redis.pcall('HINCRBY', key, field, by * times)
  if type(n) == 'table' then
    for _ = 1, times do n = hadd(key, field, by) end
    return n
  end
  return kept(key, field, n)
end

-- The worker (lease holder) of a lease id "<holder>:<n>".
local function holder_of(id)
  return string.match(id, '^(.*):[^:]*$') or id
end

-- "a\tb\trest" -> a, b, rest (nil when there are fewer than two tabs).
local function split3(entry)
  local t1 = string.find(entry, '\t', 1, true)
  if not t1 then return nil end
  local t2 = string.find(entry, '\t', t1 + 1, true)
  if not t2 then return nil end
  return string.sub(entry, 1, t1 - 1), string.sub(entry, t1 + 1, t2 - 1),
         string.sub(entry, t2 + 1)
end

-- A queue entry "#<deliveries>#<request>" (a request delivered before and
-- not acknowledged) -> deliveries, request; a plain request -> 0, request.
local function deliveries_of(entry)
  local d, rest = string.match(entry, '^#(%d%d?%d?%d?%d?%d?)#(.*)$')
  if d then return tonumber(d), rest end
  return 0, entry
end

local function with_deliveries(d, data)
  if d > 0 then return '#' .. d .. '#' .. data end
  return data
end

-- The full URL of a queued request (serializer.py), nil when it cannot be
-- read: "/path\t..." (https on `site`), "!/path\t..." (http on `site`),
-- "scheme:...\t...", or the JSON form {"u": ..., "w": 1} of older entries.
local function url_of(site, data)
  local u, scheme = nil, 'https'
  if string.sub(data, 1, 1) == '{' then
    local ok, req = pcall(cjson.decode, data)
    if not ok or type(req) ~= 'table' or type(req['u']) ~= 'string' then return nil end
    u = req['u']
    if req['w'] == 1 then scheme = 'http' end
  else
    u = string.match(data, '^!(/[^\t]*)')
    if u then
      scheme = 'http'
    else
      u = string.match(data, '^/[^\t]*') or string.match(data, '^%a[%w+.%-]*:[^\t]*')
      if not u then return nil end
    end
  end
  if string.sub(u, 1, 1) ~= '/' then return u end
  return scheme .. '://' .. site .. u
end

-- A request's life cycle (the table, with the keys of each state and the
-- call that moves it on, is crawler/frontier/lifecycle.py's; the scripts
-- decide every transition, the workers read the outcome):
--   queued       in its site's queue (K.qm, K.qc, K.lv), counted in K.count
--   leased       K.leases, K.ldata and K.lslot hold its lease id (lease.lua)
--   fetched      its slot freed: K.lslot no longer (commit.lua's slot)
--   acknowledged its lease keys gone (commit.lua's ack)
--   returned     queued again at the front, that delivery not counted
--                (commit.lua's give; lease.lua: expired, holder alive)
--   suspect      leased on its last chance, alone (lease.lua's `alone`,
--                the reply's alone = 1)
--   dead         a record in K.dead (bury, below; lease.lua: expired,
--                holder dead, at FRONTIER_MAX_DELIVERIES)

-- Append a dead letter for a queued request to list `dead`: the one record
-- shape of crawler/frontier/deadletters.py (every field, null where there
-- is no value). `worker` is the lease holder whose lease it was, or nil.
local function bury(dead, reason, site, prio, data, deliveries, now, worker)
  local null = cjson.null
  local url = null
  if site then url = url_of(site, data) or null end
  local priority = null
  if prio_ok(prio) then priority = tonumber(prio) end
  redis.call('RPUSH', dead, cjson.encode({
    v = 1, url = url, site = site or null, entry = data or null, reason = reason,
    last_error = null, attempts = deliveries, deliveries = deliveries,
    priority = priority, first_priority = null, time = now / 1000, worker = worker or null,
  }))
end

-- The call's keys, bound by name once: KEYS is the shard's key table of
-- crawler/frontier/protocol.py (SHARD_KEYS, then the call's own keys:
-- K.marker; a commit's Bloom bitmaps follow, KEYS[N_KEYS + 1..]), the same
-- list in the same order for every shard script. The block between the
-- BEGIN and END lines is protocol.py's lua_binding() (a test checks it).
-- PAYLOADS: the payload groups of ARGV[2..] in their order, with the
-- fields per record (see open_call).
-- BEGIN protocol (crawler/frontier/protocol.py: lua_binding)
local PROTOCOL = 1
local KEYS = KEYS
local K = {
  wait = KEYS[1],
  leases = KEYS[2],
  ldata = KEYS[3],
  active = KEYS[4],
  due = KEYS[5],
  retries = KEYS[6],
  delay = KEYS[7],
  conc = KEYS[8],
  count = KEYS[9],
  slow = KEYS[10],
  alive = KEYS[11],
  wactive = KEYS[12],
  rdelay = KEYS[13],
  lslot = KEYS[14],
  robots = KEYS[15],
  dead = KEYS[16],
  revisits = KEYS[17],
  rdata = KEYS[18],
  ready = KEYS[19],
  seq = KEYS[20],
  prio = KEYS[21],
  qm = KEYS[22],
  qc = KEYS[23],
  lv = KEYS[24],
  joined = KEYS[25],
  dupefilter = KEYS[26],
  revisit = KEYS[27],
  retryat = KEYS[28],
  robots_down = KEYS[29],
  forget = KEYS[30],
  dead_trimmed = KEYS[31],
  speaks = KEYS[32],
  marker = KEYS[33],
}
local N_KEYS = 33
local PAYLOADS = {
  'ids', 1,
  'claim', 1,
  'push', 6,
  'retry', 4,
  'dead', 1,
  'slot', 1,
  'ack', 1,
  'give', 1,
  'revisit', 4,
  'sites', 1,
}
-- END protocol
-- Besides the keys, K holds K.P (the key prefix "{s}:", for messages
-- only: no key is built from it), and for lease and commit K.cap (default
-- concurrency), K.gate (true when robots.txt is obeyed), K.join (true when
-- join times are kept in K.joined) (policy_open_call) and K.now (ms, set
-- by the script).
K.P = string.sub(K.wait or '', 1, -5)

-- The header of this call (ARGV[1], a JSON object: protocol.py), checked:
-- its protocol version must be this script's (PROTOCOL) and its operation
-- `op`. Returns the header ({v, op, o = options, ops = counts of the
-- payload groups}, with `first`: group -> its first ARGV, for the groups
-- it carries), or nil and an error reply naming the version, before
-- anything is read or written (a rolling upgrade never runs two protocols
-- silently).
local function open_call(op)
  local text = ARGV[1] or ''
  local h = nil
  -- (a JSON object; no pcall: a text that starts as one and is no JSON is
  -- no frontier's, and cjson's error names it all the same)
  if string.byte(text, 1) == 123 and string.byte(text, -1) == 125 then -- '{' '}'
    h = cjson.decode(text)
  end
  if type(h) ~= 'table' or h.v == nil then
    return nil, redis.error_reply('ERR frontier protocol unknown not understood by this ' ..
      'script (speaks ' .. PROTOCOL .. '): ARGV[1] is no frontier header')
  end
  if h.v ~= PROTOCOL then
    return nil, redis.error_reply('ERR frontier protocol ' .. tostring(h.v) ..
      ' not understood by this script (speaks ' .. PROTOCOL .. ')')
  end
  if h.op ~= op then
    return nil, redis.error_reply('ERR frontier call ' .. tostring(h.op) ..
      ' sent to the ' .. op .. ' script: nothing was written')
  end
  if type(h.o) ~= 'table' then h.o = {} end
  local ops = h.ops
  if type(ops) ~= 'table' then ops = {} h.ops = ops end
  local first, i = {}, 2
  for j = 1, #PAYLOADS, 2 do
    local n = ops[PAYLOADS[j]]
    if n then
      first[PAYLOADS[j]] = i
      i = i + n * PAYLOADS[j + 1]
    end
  end
  if i - 1 ~= #ARGV then
    return nil, redis.error_reply('ERR frontier call ' .. op .. ' carries ' .. (#ARGV - 1) ..
      ' payload values, its header counts ' .. (i - 2) .. ': nothing was written')
  end
  h.first = first
  return h
end

-- open_call(op) for a script that paces and caps sites (lease, commit):
-- also fills in K.cap, K.gate and K.join from the header's options (cap,
-- gate, join). Returns the header, or nil and the error reply.
local function policy_open_call(op)
  local h, refused = open_call(op)
  if not h then return nil, refused end
  local o = h.o
  K.cap = tonumber(o.cap)
  K.gate = o.gate == true
  K.join = o.join == true
  return h
end

-- How many records of payload group `name` header `h` carries.
local function count(h, name)
  return h.ops[name] or 0
end

-- The records of payload group `name` of header `h`, one at a time, each
-- as its `w` fields (the group's width in PAYLOADS):
-- for fp, site in records(h, 'push', 6) do ... end
local function records(h, name, w)
  local n = h.ops[name]
  if not n then return function() return nil end end
  local i = h.first[name] - w
  local last = i + n * w
  return function()
    i = i + w
    if i > last then return nil end
    return unpack(ARGV, i, i + w - 1)
  end
end

-- The values of a one-field payload group (lease ids), as a list.
local function values(h, name)
  local out = {}
  local n = h.ops[name]
  if n then
    local at = h.first[name] - 1
    for j = 1, n do out[j] = ARGV[at + j] end
  end
  return out
end

-- Queues in fixed keys. Every key a script touches is one of its KEYS, so
-- a Redis Cluster that moves the shard's slot answers ASK/TRYAGAIN instead
-- of letting the script read half-moved data: no key is built from a
-- site's name. One queue per site and priority, first in, first out,
-- stored in chunks of entries:
-- K.qm  hash "site\tprio" -> "<head> <tail>": the numbers of the queue's
--       first and last chunk (no field: the queue is empty)
-- K.qc  hash "site\tprio\t<n>" -> chunk n: entries one after another, each
--       "<length in bytes>:<bytes>" (a netstring without its comma)
-- K.lv  hash site -> the site's non-empty priorities, highest first,
--       separated by spaces ("9 0 -3")
-- A chunk grows to CHUNK_BYTES, then the next one starts, so a push or a
-- pop copies at most one chunk whatever the queue's length, and an entry
-- costs its length plus a few bytes.
local CHUNK_BYTES = 2048

local function q_set_levels(site, levels)
  if #levels == 0 then
    redis.call('HDEL', K.lv, site)
  else
    redis.call('HSET', K.lv, site, table.concat(levels, ' '))
  end
end

-- The site's non-empty priorities, highest first (strings), and true when
-- K.lv's value is not one the frontier writes (a word that is no
-- priority): then none is returned, nothing is written, and the value is
-- reported as damaged ('lv', site) for the repair (repair.lua) to rebuild
-- from K.qm. Until then the site's requests stay queued, not leased.
local function q_levels(site)
  local v = redis.call('HGET', K.lv, site)
  local out = {}
  if not v then return out end
  for p in string.gmatch(v, '%S+') do
    if not prio_ok(p) then
      damage('lv', site)
      return {}, true
    end
    out[#out + 1] = p
  end
  return out
end

-- The site's best (highest) non-empty priority, or nil.
local function q_best(site)
  return q_levels(site)[1]
end

-- (a damaged K.lv value is left as it is: the repair rebuilds it from
-- K.qm, which holds the new queue)
local function q_add_level(site, prio)
  local levels, broken = q_levels(site)
  if broken then return end
  local p = tonumber(prio)
  for i, l in ipairs(levels) do
    if l == prio then return end
    if tonumber(l) < p then
      table.insert(levels, i, prio)
      q_set_levels(site, levels)
      return
    end
  end
  levels[#levels + 1] = prio
  q_set_levels(site, levels)
end

local function q_drop_level(site, prio)
  local levels, broken = q_levels(site)
  if broken then return end
  for i, l in ipairs(levels) do
    if l == prio then
      table.remove(levels, i)
      q_set_levels(site, levels)
      return
    end
  end
end

-- A chunk number as the scripts write it: an integer of at most 14 digits
-- (Lua writes 10^14 and above as "1e+14"), no leading zero.
local function chunk_no(v)
  if v == '0' then return 0 end
  if #v <= 14 and string.match(v, '^[1-9]%d*$') then return tonumber(v) end
  if #v <= 15 and string.match(v, '^%-[1-9]%d*$') then return tonumber(v) end
  return nil
end

-- "<head> <tail>" -> head, tail (nil when it is not a value the frontier
-- writes).
local function q_bounds(v)
  local h, t = string.match(v, '^(%S+) (%S+)$')
  if not h then return nil end
  h, t = chunk_no(h), chunk_no(t)
  if not h or not t or h > t then return nil end
  return h, t
end

-- The bounds of queue `f` ("site\tprio") for a push: its K.qm value (nil
-- when the queue is empty), head, tail; or nil, nil, nil, true when the
-- value is not one the frontier writes (reported as damaged ('qm', f),
-- left as it is: repair.lua rebuilds it from the queue's chunks).
local function q_tail_of(f)
  local b = redis.call('HGET', K.qm, f)
  if b then
    local head, tail = q_bounds(b)
    if head then return b, head, tail end
    damage('qm', f)
    return nil, nil, nil, true
  end
  return nil, 0, 0
end

-- How long a request meant for a damaged queue waits in K.retries before
-- a lease call tries to queue it again, ms (the worker that got the
-- report repairs the queue meanwhile).
local PARK_MS = 1000

-- Put `data` (queued at `prio` on `site`, its deliveries in it) in
-- K.retries PARK_MS from now, as a due retry would be: its queue is
-- damaged. K.retryat keeps the site from being forgotten meanwhile
-- (leniently: its wrong type is reported).
local function park(site, prio, data)
  local at = K.now + PARK_MS
  redis.call('ZADD', K.retries, at, prio .. '\t' .. site .. '\t' .. data)
  -- (the time of the site's last retry: raised, never lowered)
  if hnum(K.retryat, site, NAT, -1, 'replaced') < at then
    local r = redis.pcall('HSET', K.retryat, site, at)
    if type(r) == 'table' then problem(K.retryat .. ' is not a hash: left alone') end
  end
end

-- Queue `data` on `site` at priority `prio` (front: next out; else last).
-- Returns nil, or the reason it could not be queued (then nothing was
-- written; none today), and true when the queue is damaged (q_tail_of):
-- the request was parked in K.retries instead (park), not queued.
local function q_push(site, prio, data, front)
  local f = site .. '\t' .. prio
  local b, head, tail, broken = q_tail_of(f)
  if broken then
    park(site, prio, data)
    return nil, true
  end
  local n = tail
  if front then n = head end
  local piece = #data .. ':' .. data
  local cur = ''
  if b then cur = redis.call('HGET', K.qc, f .. '\t' .. n) or '' end
  local moved = not b
  if #cur > 0 and #cur + #piece > CHUNK_BYTES then
    if front then head = head - 1; n = head else tail = tail + 1; n = tail end
    cur, moved = '', true
  end
  if front then cur = piece .. cur else cur = cur .. piece end
  redis.call('HSET', K.qc, f .. '\t' .. n, cur)
  if moved then redis.call('HSET', K.qm, f, head .. ' ' .. tail) end
  if not b then q_add_level(site, prio) end
  return nil
end

-- Take the next entry of `site`'s queue at priority `prio`. Returns the
-- entry (nil when the queue is empty: its priority is dropped from K.lv)
-- and whether the queue is empty now. A chunk whose entries cannot be
-- read is given to `bad(chunk, why)` (a dead letter) and dropped. A K.qm
-- value the frontier never writes is left as it is and reported as
-- damaged ('qm', "site\tprio"): nil, true, true (nothing taken; the
-- caller passes the site over until the repair).
local function q_pop(site, prio, bad)
  local f = site .. '\t' .. prio
  local b = redis.call('HGET', K.qm, f)
  if not b then
    q_drop_level(site, prio)
    return nil, true
  end
  local head, tail = q_bounds(b)
  if not head then
    damage('qm', f)
    return nil, true, true
  end
  local first = head
  while true do
    local ck = f .. '\t' .. head
    local cur = redis.call('HGET', K.qc, ck) or ''
    local data, rest = nil, ''
    if cur ~= '' then
      local c = string.find(cur, ':', 1, true)
      local len = c and c <= 11 and tonumber(string.sub(cur, 1, c - 1))
      if len and string.match(string.sub(cur, 1, c - 1), '^%d+$') and c + len <= #cur then
        data, rest = string.sub(cur, c + 1, c + len), string.sub(cur, c + len + 1)
      else
        bad(cur, K.qc .. ' ' .. ck .. ' holds an entry that cannot be read')
      end
    end
    if rest ~= '' then
      redis.call('HSET', K.qc, ck, rest)
    else
      redis.call('HDEL', K.qc, ck)
      if head >= tail then
        redis.call('HDEL', K.qm, f)
        q_drop_level(site, prio)
        return data, true
      end
      head = head + 1
    end
    if data then
      if head ~= first then redis.call('HSET', K.qm, f, head .. ' ' .. tail) end
      return data, false
    end
  end
end

-- Queue `data` on `site` at priority `prio` (front: next out; else back),
-- and count it in K.count and K.prio. Returns nil, or the reason it could not
-- be queued (see q_push); in that case the queue holds nothing new. A
-- request for a damaged queue is parked in K.retries (q_push), not
-- counted.
local function enqueue(site, prio, data, front)
  local why, parked = q_push(site, prio, data, front)
  if why then return why end
  if parked then return nil end
  redis.call('INCR', K.count)
  hadd(K.prio, prio, 1)
  return nil
end

-- Many requests queued at the back in one call (commit.lua's new
-- requests), for fewer writes: each queue's last chunk is read once and
-- appended to in Lua, and K.count and K.prio are added to once per
-- priority, when q_flush() writes it all back. Until then K.qm and K.qc
-- may lag behind for the queues buffered (nothing else may read them:
-- the caller flushes before anything but wake/raise runs); K.lv is
-- written at once, so a site's best priority is known meanwhile. A
-- priority's first request is counted in K.prio at once, as enqueue does
-- it: a value that is not an integer, or is below 0, is set right then
-- (reported in its place among the call's problems), and from 0 or more
-- the rest adds up the same in one write.
local qbuf, qbuf_order, qbuf_prio, qbuf_n = {}, {}, {}, 0

local function enqueue_buffered(site, prio, data)
  local f = site .. '\t' .. prio
  local q = qbuf[f]
  if not q then
    local b, head, tail, broken = q_tail_of(f)
    if broken then
      park(site, prio, data)
      return
    end
    q = {head = head, tail = tail, cur = '', moved = not b, dirty = false}
    if b then q.cur = redis.call('HGET', K.qc, f .. '\t' .. tail) or '' end
    qbuf[f] = q
    qbuf_order[#qbuf_order + 1] = f
    if not b then q_add_level(site, prio) end
  end
  local piece = #data .. ':' .. data
  if #q.cur > 0 and #q.cur + #piece > CHUNK_BYTES then
    if q.dirty then redis.call('HSET', K.qc, f .. '\t' .. q.tail, q.cur) end
    q.tail, q.cur, q.moved = q.tail + 1, '', true
  end
  q.cur, q.dirty = q.cur .. piece, true
  if qbuf_prio[prio] then
    qbuf_prio[prio] = qbuf_prio[prio] + 1
  else
    hadd(K.prio, prio, 1)
    qbuf_prio[prio] = 0
  end
  qbuf_n = qbuf_n + 1
end

-- Write back what enqueue_buffered() queued.
local function q_flush()
  for _, f in ipairs(qbuf_order) do
    local q = qbuf[f]
    if q.dirty then redis.call('HSET', K.qc, f .. '\t' .. q.tail, q.cur) end
    if q.moved then redis.call('HSET', K.qm, f, q.head .. ' ' .. q.tail) end
  end
  if qbuf_n > 0 then redis.call('INCRBY', K.count, qbuf_n) end
  for prio, n in pairs(qbuf_prio) do
    if n > 0 then hadd_times(K.prio, prio, 1, n) end
  end
  qbuf, qbuf_order, qbuf_prio, qbuf_n = {}, {}, {}, 0
end

-- The ready index (K.ready) scores a site by its best queued priority and
-- its turn: -priority * TURN + turn, where turn is K.seq (one more each
-- time a site joins the index, is raised or is served; re-based before it
-- reaches TURN, see save_turns). Priorities are within +-PRIO_MAX
-- (< 2^20), so a score stays below 2^52: an exact double.
local TURN = 4294967296 -- 2^32

-- The priority part of a ready score.
local function prio_of(score)
  return -math.floor(score / TURN)
end

-- The best queued priority of `site` (a number, and the level as stored),
-- or nil when it has none (see q_levels).
local function best_prio(site)
  local best = q_best(site)
  if best then return tonumber(best), best end
  return nil
end

-- The turns given in this call: K.seq is read at the first and written
-- back by save_turns(), which every script calls before it returns.
local last_turn = nil

-- Turns are counted per shard. To compare the sites of different shards
-- (first in, first out among equal priorities across a sharded crawl),
-- K.joined keeps, per site in K.ready, when it took its turn there: the
-- Redis server's clock (TIME) in µs, digits only. A site's field is set by
-- make_ready and deleted when it leaves K.ready (unready). Within a shard
-- the turns give the same order (the clock does not go back); a site in
-- K.ready without a field (queued by a version before K.joined) joined
-- before every site with one: it counts as 0, "long ago". Join times are
-- kept only when the script is told so (K.join: the crawl has several
-- shards; with one, the turns are all it needs). A wrong type of
-- K.joined is reported and join times are then not kept (never an error:
-- it is only a hint for the workers' choice of shard).
local function joined_problem()
  problem(K.joined .. ' is not a hash: join times not kept (first in, first out ' ..
          'across shards does not hold for this shard)')
end

-- Put `site` (due, under its concurrency, not in K.wait) in K.ready at
-- priority `prio`, behind the sites of that priority there already.
local function make_ready(site, prio)
  if not last_turn then last_turn = tonumber(redis.call('GET', K.seq) or '0') end
  last_turn = last_turn + 1
  redis.call('ZADD', K.ready, -prio * TURN + last_turn % TURN, site)
  if not K.join then return end
  if not clock_us then read_clock(redis.call('TIME')) end
  local r = redis.pcall('HSET', K.joined, site, clock_us)
  if type(r) == 'table' then joined_problem() end
end

-- Take `site` out of K.ready (and its join time out of K.joined).
local function unready(site)
  redis.call('ZREM', K.ready, site)
  if not K.join then return end
  local r = redis.pcall('HDEL', K.joined, site)
  if type(r) == 'table' then joined_problem() end
end

-- When `site` (in K.ready) took its turn there, µs (a number): 0 when not
-- known (a site queued by an older version: long ago). A value that is not
-- whole µs (a key edited by hand) counts as 0 too, left as it is and
-- reported as damaged ('joined', site): the repair deletes it. Never
-- raises.
local function joined_of(site)
  if not K.join then return 0 end
  local v = redis.pcall('HGET', K.joined, site)
  if type(v) == 'table' then
    joined_problem()
    return 0
  end
  if not v then return 0 end
  if #v <= 16 and string.match(v, NAT) then return tonumber(v) end
  damage('joined', site)
  return 0
end

-- Turns are re-based long before they could wrap at TURN (where the sites
-- that took their turn just before the wrap would rank behind every later
-- one: starved): once K.seq reaches REBASE_AT, the call's last act renumbers
-- the sites of K.ready 1, 2, ... in their order (priority, then turn), and
-- K.seq becomes their count. Once per 2^31 turns of a shard (a join, raise
-- or lease each), O(N log N) in the sites of K.ready in that one call (3.2 s
-- for a million, 0.25 s for 100,000, measured ad hoc). Entries whose score
-- no frontier writes (see lease.lua's best_due) keep their score.
local REBASE_AT = 2147483648 -- 2^31

local function rebase_turns()
  local all = redis.call('ZRANGE', K.ready, 0, -1, 'WITHSCORES')
  local n, args = 0, {}
  for j = 1, #all, 2 do
    local p = prio_of(tonumber(all[j + 1]))
    if p >= -PRIO_MAX and p <= PRIO_MAX then
      n = n + 1
      args[#args + 1] = -p * TURN + n
      args[#args + 1] = all[j]
      if #args >= 2000 then
        redis.call('ZADD', K.ready, unpack(args))
        args = {}
      end
    end
  end
  if #args > 0 then redis.call('ZADD', K.ready, unpack(args)) end
  last_turn = n
end

local function save_turns()
  if not last_turn then return end
  if last_turn >= REBASE_AT then rebase_turns() end
  redis.call('SET', K.seq, last_turn)
end

-- A site in K.ready with score `score` got a request at priority `prio`:
-- when that is better than its best so far, that request is its best, and
-- the site takes a new turn at its priority (first in, first out).
local function raise(site, score, prio)
  if prio > prio_of(score) then make_ready(site, prio) end
end

-- The concurrency of `site`: 1 while its robots.txt is not known (K.gate),
-- else its override in K.conc or the default. A site's robots.txt is known
-- when K.robots has a field for it: the site (a host), or "\t" .. site (a
-- download slot that is not a host, opened by the workers once the
-- robots.txt of a host it serves is known).
local function cap_of(site)
  if K.gate then
    local known = redis.pcall('HEXISTS', K.robots, site)
    if type(known) == 'table' then
      problem(K.robots .. ' is not a hash: robots.txt counted as unknown')
      return 1
    end
    if known == 0 then known = redis.call('HEXISTS', K.robots, '\t' .. site) end
    if known == 0 then return 1 end
  end
  return hnum(K.conc, site, POS, K.cap, 'concurrency must be an integer >= 1: default used')
end

-- The policy of `site`: its pace and its capacity, computed here only
-- (lease.lua and delay.lua call it; crawler/frontier/policy.py's
-- SitePolicy computes the same from the same values, and
-- tests/test_site_policy.py checks both against one table of cases).
-- P, the options: delay_ms (the default delay, ms), margin (the pacing
-- margin), jitter (the default jitter j), jitters (site -> its own jitter,
-- or nil), now (ms), draw (a function returning a number in [0, 1):
-- math.random in lease.lua). `cap`: the site's concurrency when the caller
-- read it already (cap_of) in this call, false when it does not need it
-- (returned as given), nil to read it here.
-- Returns delay, cap, next_due:
-- * delay, ms: the site's delay (its override in K.delay, else
--   P.delay_ms), at least its robots.txt Crawl-delay (K.rdelay), plus its
--   adaptive slow delay (K.slow), stretched by 1 + margin, floored (values
--   that are not whole ms are reported and left out);
-- * cap: cap_of(site) (1 while its robots.txt is not known under K.gate);
-- * next_due, ms: when its next request may start after one starts now:
--   now + delay times a factor drawn in [1, 1 + j), j the site's jitter (no
--   draw when j or the delay is 0), floored.
local function site_policy(site, P, cap)
  local delay = hnum(K.delay, site, NAT, P.delay_ms, 'delay must be whole ms >= 0: default used')
  delay = math.max(delay, hnum(K.rdelay, site, NAT, 0, 'not whole ms: ignored'))
  delay = delay + hnum(K.slow, site, NAT, 0, 'not whole ms: ignored')
  delay = math.floor(delay * (1 + P.margin))
  if cap == nil then cap = cap_of(site) end
  local gap = delay
  local j = (P.jitters and P.jitters[site]) or P.jitter or 0
  if delay > 0 and j > 0 then gap = math.floor(delay * (1 + j * P.draw())) end
  return delay, cap, P.now + gap
end

-- Make `site` a candidate again if it has queued work and a free slot: in
-- K.ready when it is due, else in K.wait at its due time; drop it from both
-- when it has no work. A site already in K.wait stays there (lease.lua moves
-- it to K.ready when due); one already in K.ready is raised to `prio` when
-- given (a request was just queued at that priority).
-- `active`: the site's slots taken, when the caller knows them.
-- Returns true when the site is settled: a wake with fewer slots taken
-- (and no `prio`) would change nothing until something else writes the
-- site's keys; else false and, when the site is at its concurrency, that
-- concurrency (a wake changes nothing while `active` is at least that).
local function wake(site, active, prio)
  if redis.call('HEXISTS', K.lv, site) == 0 then
    redis.call('ZREM', K.wait, site)
    unready(site)
    return true
  end
  local score = redis.call('ZSCORE', K.ready, site)
  if score then
    if prio then raise(site, tonumber(score), tonumber(prio)) end
    return true
  end
  active = active or hnum(K.active, site, INT, 0, 'not an integer: counted as 0')
  local cap = cap_of(site)
  if active >= cap then return false, cap end
  local due = hnum(K.due, site, INT, 0, 'not an integer: counted as 0')
  if due > K.now then
    redis.call('ZADD', K.wait, 'NX', due, site)
  elseif not redis.call('ZSCORE', K.wait, site) then
    local best = best_prio(site)
    if not best then return false end
    make_ready(site, best)
  end
  return true
end

-- Free the download slot lease `id` holds, if it still holds one; returns
-- the slot's site and its slots taken now (K.lslot keeps the site, so a slot is freed even when the
-- lease's data is unreadable), or nil. A slot taken before K.lslot kept
-- sites (value "1") takes its site from K.ldata.
local function free_slot(id)
  local site = redis.call('HGET', K.lslot, id)
  if not site then return nil end
  redis.call('HDEL', K.lslot, id)
  if site == '1' then
    local _, s = split3(redis.call('HGET', K.ldata, id) or '')
    if not s then return nil end
    site = s
  end
  hadd(K.wactive, holder_of(id) .. '\t' .. site, -1)
  return site, hadd(K.active, site, -1)
end

-- free_slot() and wake() for many lease ids at once, with fewer calls:
-- one HMGET and one HDEL of K.lslot per 1,000 ids, and each slot counter
-- written once (an id given twice is freed once). Ends as free_slot(id)
-- then wake(site, active) for each id in turn did: each site is woken
-- with its slots taken after each of its ids, in the order of the ids (a
-- site that becomes a candidate after its second id takes its turn in
-- K.ready after a site that did at an id between), skipping only the
-- wakes that would change nothing. Returns how many of the ids held a
-- slot.
local function free_slots(ids)
  local freed = {} -- per slot freed, in order: {site, "holder\tsite"}
  local by_site, by_worker, seen = {}, {}, {}
  for j = 1, #ids, 1000 do
    local part = {unpack(ids, j, math.min(j + 999, #ids))}
    local sites = redis.call('HMGET', K.lslot, unpack(part))
    local gone = {}
    for k, id in ipairs(part) do
      local site = sites[k]
      if site and not seen[id] then
        seen[id] = true
        gone[#gone + 1] = id
        if site == '1' then
          local _, s = split3(redis.call('HGET', K.ldata, id) or '')
          site = s
        end
        if site then
          local w = holder_of(id) .. '\t' .. site
          freed[#freed + 1] = {site, w}
          by_site[site] = (by_site[site] or 0) + 1
          by_worker[w] = (by_worker[w] or 0) + 1
        end
      end
    end
    if #gone > 0 then redis.call('HDEL', K.lslot, unpack(gone)) end
  end
  -- Each counter is written at its first slot, all its slots at once:
  -- after a site's j-th slot, it had max(first - (j - 1), 0) taken, where
  -- first is what it had after the first (a counter that is not an
  -- integer is deleted then, as hadd does it).
  local first, nth, settled, cap = {}, {}, {}, {}
  for _, f in ipairs(freed) do
    local site, w = f[1], f[2]
    if by_worker[w] then
      hadd_times(K.wactive, w, -1, by_worker[w])
      by_worker[w] = nil
    end
    local j = (nth[site] or 0) + 1
    nth[site] = j
    if j == 1 then
      local k = by_site[site]
      local n = redis.pcall('HINCRBY', K.active, site, -k)
      if type(n) == 'table' then
        first[site] = hadd(K.active, site, -1)
        if k > 1 then hadd(K.active, site, 1 - k) end
      else
        kept(K.active, site, n)
        first[site] = math.max(n + k - 1, 0)
      end
    end
    local active = math.max(first[site] - (j - 1), 0)
    if not settled[site] and not (cap[site] and active >= cap[site]) then
      settled[site], cap[site] = wake(site, active)
    end
  end
  return #freed
end
