-- ack.lua: end leases whose request was processed (or finally failed).
-- Frees each lease's download slot on its site if release.lua has not, and
-- makes the site a candidate again. A lease that already expired (and went
-- back to the queue) is ignored.
--
-- KEYS[1]  {s}:wait     zset site -> ms when the site may be served next
-- KEYS[2]  {s}:leases   zset lease id -> deadline, ms
-- KEYS[3]  {s}:ldata    hash lease id -> "priority\tsite\tencoded request"
-- KEYS[4]  {s}:active   hash site -> requests leased now
-- KEYS[5]  {s}:due      hash site -> ms before which the site is not served
-- KEYS[6]  {s}:conc     hash site -> concurrency override
-- KEYS[7]  {s}:wactive  hash "worker\tsite" -> requests the worker has leased
-- KEYS[8]  {s}:lslot    hash lease id -> 1 while the lease holds a download slot
-- ARGV[1]  key prefix "{s}:"
-- ARGV[2]  default concurrency per site
-- ARGV[3..] lease ids
-- Returns the number of leases ended.
local P = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ended = 0

-- Make `site` a candidate again if it has work and room.
local function wake(site, active)
  if redis.call('EXISTS', P .. 'lv:' .. site) == 1 then
    local cap = tonumber(redis.call('HGET', KEYS[6], site) or ARGV[2])
    if active < cap then
      local due = tonumber(redis.call('HGET', KEYS[5], site) or '0')
      if due < now then due = now end
      redis.call('ZADD', KEYS[1], 'NX', due, site)
    end
  end
end

for i = 3, #ARGV do
  local id = ARGV[i]
  local entry = redis.call('HGET', KEYS[3], id)
  if entry then
    ended = ended + 1
    redis.call('HDEL', KEYS[3], id)
    redis.call('ZREM', KEYS[2], id)
    local t1 = string.find(entry, '\t', 1, true)
    local t2 = string.find(entry, '\t', t1 + 1, true)
    local site = string.sub(entry, t1 + 1, t2 - 1)
    -- Only a lease that still held its download slot changes the site's
    -- room; release.lua woke the site when it freed the slot.
    if redis.call('HDEL', KEYS[8], id) == 1 then
      local worker = string.match(id, '^(.*):[^:]*$')
      local wkey = worker .. '\t' .. site
      if tonumber(redis.call('HINCRBY', KEYS[7], wkey, -1)) <= 0 then
        redis.call('HDEL', KEYS[7], wkey)
      end
      local active = tonumber(redis.call('HINCRBY', KEYS[4], site, -1))
      if active <= 0 then redis.call('HDEL', KEYS[4], site); active = 0 end
      wake(site, active)
    end
  end
end
return ended
