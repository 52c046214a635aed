-- alive.lua: count a worker as live, so that it has its fair share of every
-- site (lease.lua divides a site's concurrency among live workers) from the
-- moment it opens, not only from its first lease: otherwise the first
-- worker to lease a batch takes a whole site.
--
-- KEYS[1]  {s}:alive    zset worker id -> ms of its last lease or heartbeat
-- ARGV[1]  the worker's id
-- Times are the Redis server's clock (TIME), ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now, ARGV[1])
return now
