-- extend.lua: push the deadlines of held leases past now (a heartbeat).
-- Leases that already expired and went back to the queue are not revived.
--
-- KEYS[1]  {s}:leases   zset lease id -> deadline, ms (Redis clock)
-- ARGV[1]  lease duration, ms
-- ARGV[2..] lease ids; a duration of 0 gives them back at once (they expire
--           now, and the next lease call requeues them)
-- Returns how many leases were updated.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[1])
if tonumber(ARGV[1]) == 0 then deadline = 0 end
local n = 0
for i = 2, #ARGV do
  n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', deadline, ARGV[i])
end
return n
