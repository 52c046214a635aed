-- release.lua: a leased request's download has ended: free its site's slot.
-- The lease itself stays until ack.lua (its response is still being
-- processed), so a killed worker's request is still crawled again; but the
-- site's concurrency counts downloads, not item storage.
--
-- KEYS[1]  {s}:wait     zset site -> ms when the site may be served next
-- KEYS[2]  {s}:ldata    hash lease id -> "priority\tsite\tencoded request"
-- KEYS[3]  {s}:active   hash site -> download slots taken now
-- KEYS[4]  {s}:due      hash site -> ms before which the site is not served
-- KEYS[5]  {s}:conc     hash site -> concurrency override
-- KEYS[6]  {s}:wactive  hash "worker\tsite" -> slots the worker holds
-- KEYS[7]  {s}:lslot    hash lease id -> 1 while the lease holds a slot
-- KEYS[8]  {s}:robots   hash site -> robots.txt as stored by the workers
-- ARGV[1]  key prefix "{s}:"
-- ARGV[2]  default concurrency per site
-- ARGV[3]  "1" when robots.txt is obeyed (concurrency 1 until it is known)
-- ARGV[4..] lease ids
-- Returns the number of slots freed.
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local freed = 0
for i = 4, #ARGV do
  local id = ARGV[i]
  if redis.call('HDEL', KEYS[7], id) == 1 then
    local entry = redis.call('HGET', KEYS[2], id)
    if entry then
      freed = freed + 1
      local t1 = string.find(entry, '\t', 1, true)
      local t2 = string.find(entry, '\t', t1 + 1, true)
      local site = string.sub(entry, t1 + 1, t2 - 1)
      local worker = string.match(id, '^(.*):[^:]*$')
      local wkey = worker .. '\t' .. site
      if tonumber(redis.call('HINCRBY', KEYS[6], wkey, -1)) <= 0 then
        redis.call('HDEL', KEYS[6], wkey)
      end
      local active = tonumber(redis.call('HINCRBY', KEYS[3], site, -1))
      if active <= 0 then redis.call('HDEL', KEYS[3], site); active = 0 end
      if redis.call('EXISTS', P .. 'lv:' .. site) == 1 then
        local cap = tonumber(redis.call('HGET', KEYS[5], site) or ARGV[2])
        if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[8], site) == 0 then cap = 1 end
        if active < cap then
          local due = tonumber(redis.call('HGET', KEYS[4], site) or '0')
          if due < now then due = now end
          redis.call('ZADD', KEYS[1], 'NX', due, site)
        end
      end
    end
  end
end
return freed
