-- extend.lua: push the deadlines of held leases past now (a heartbeat).
-- Leases that already expired and went back to the queue are not revived.
-- lib.lua is prepended.
--
-- Keys (by name, lib.lua's K): K.leases, zset lease id -> deadline, ms
-- (Redis clock).
-- Header options (o, by name): lease_ms, the lease duration, ms; 0 gives
-- the leases back at once (they expire now, and the next lease call
-- requeues them).
-- Payload: ids, the lease ids.
-- Returns how many leases were updated.
local H, refused = open_call('extend')
if not H then return refused end
local lease_ms = tonumber(H.o.lease_ms)
local deadline = now_ms() + lease_ms
if lease_ms == 0 then deadline = 0 end
local n = 0
for id in records(H, 'ids', 1) do
  n = n + redis.call('ZADD', K.leases, 'XX', 'CH', deadline, id)
end
return n
