-- alive.lua: count a worker as live, so that it has its fair share of every
-- site (lease.lua divides a site's concurrency among live workers) from the
-- moment it opens, not only from its first lease: otherwise the first
-- worker to lease a batch takes a whole site; and record the protocol it
-- speaks. lib.lua is prepended.
--
-- Keys (by name, lib.lua's K): K.alive, zset worker id -> ms of its last
-- lease or heartbeat; K.speaks, hash worker id -> the protocol it speaks.
-- Header options (o, by name): holder, the worker's id; check (at open):
-- refuse, writing nothing, while another worker seen in K.alive within
-- live_ms (ms) speaks another protocol or none (a worker of a version
-- before the named protocol): a rolling upgrade never mixes protocols.
-- Returns the time, ms. Times are the Redis server's clock (TIME), ms.
local H, refused = open_call('alive')
if not H then return refused end
-- (both keys are written: a wrong type refuses the call before any write)
local err = check_types({{K.alive, 'zset'}, {K.speaks, 'hash'}})
if err then return err end
local now = now_ms()
local holder = H.o.holder
if H.o.check then
  local live_ms = tonumber(H.o.live_ms) or 0
  local live = redis.call('ZRANGEBYSCORE', K.alive, '(' .. (now - live_ms), '+inf', 'WITHSCORES')
  for i = 1, #live, 2 do
    local w = live[i]
    if w ~= holder then
      local v = redis.call('HGET', K.speaks, w)
      if v ~= tostring(PROTOCOL) then
        local ago = math.floor((now - tonumber(live[i + 1])) / 1000)
        return redis.error_reply('ERR frontier protocol mixed: worker ' .. w .. ' speaks ' ..
          (v or 'none') .. ', seen ' .. ago .. ' s ago (this script speaks ' .. PROTOCOL .. ')')
      end
    end
  end
  -- (workers silent for a lease's length are no longer live, as lease.lua
  -- has it, nor recorded)
  redis.call('ZREMRANGEBYSCORE', K.alive, '-inf', now - live_ms)
  for _, w in ipairs(redis.call('HKEYS', K.speaks)) do
    if not redis.call('ZSCORE', K.alive, w) then redis.call('HDEL', K.speaks, w) end
  end
end
redis.call('ZADD', K.alive, now, holder)
redis.call('HSET', K.speaks, holder, PROTOCOL)
return now
