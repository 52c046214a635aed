-- seeds_refresh.lua: a live worker's heartbeat for the intake batches it
-- holds: their registration time becomes now (Redis clock), so that no
-- other worker returns them to the seed list while their owner is merely
-- slow. A batch no longer registered (returned to the seed list already,
-- or let go of) is not registered again.
--
-- KEYS[1]  {<seed list>}:intake          zset: intake batch key -> ms of its
--                                        registration or last refresh
-- KEYS[2..] {<seed list>}:intake:<holder>:<n>
--                                        the batches held
-- Returns one flag per batch, in KEYS order: 1 refreshed, 0 not registered.
-- Refused (an error reply, nothing written) when KEYS[1] is not a zset.
local t0 = redis.call('TYPE', KEYS[1])['ok']
if t0 ~= 'none' and t0 ~= 'zset' then
  return redis.error_reply('ERR seed intake key ' .. KEYS[1] .. ' holds a ' .. t0 ..
    ', not a zset: nothing was written')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 2, #KEYS do
  if redis.call('ZSCORE', KEYS[1], KEYS[i]) then
    redis.call('ZADD', KEYS[1], 'XX', now, KEYS[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
