-- alive.lua: count a worker as live, so that it has its fair share of every
-- site (lease.lua divides a site's concurrency among live workers) from the
-- moment it opens, not only from its first lease: otherwise the first
-- worker to lease a batch takes a whole site. lib.lua is prepended.
--
-- Keys (by name, lib.lua's K): K.alive, zset worker id -> ms of its last
-- lease or heartbeat.
-- Header options (o, by name): holder, the worker's id.
-- Returns the time, ms. Times are the Redis server's clock (TIME), ms.
local H, refused = open_call('alive')
if not H then return refused end
local now = now_ms()
redis.call('ZADD', K.alive, now, H.o.holder)
return now
