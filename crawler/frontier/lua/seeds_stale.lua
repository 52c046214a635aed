-- seeds_stale.lua: the intake batches whose owner has neither registered
-- nor refreshed them for ARGV[1] ms (Redis clock): their owner died, or
-- lost Redis for that long. Read only; seeds_reclaim.lua returns each one's
-- seeds and checks again, atomically, that it is still stale.
--
-- KEYS[1]  {<seed list>}:intake          zset: intake batch key -> ms of its
--                                        registration or last refresh
-- ARGV[1]  least age, ms (integer >= 0)
-- ARGV[2]  most batch keys returned (integer >= 1)
-- Returns the batch keys, most recently refreshed first (ties: in reverse
-- order of their names, so a holder's later batches come first).
-- Refused (an error reply) when KEYS[1] is not a zset.
local t0 = redis.call('TYPE', KEYS[1])['ok']
if t0 ~= 'none' and t0 ~= 'zset' then
  return redis.error_reply('ERR seed intake key ' .. KEYS[1] .. ' holds a ' .. t0 ..
    ', not a zset')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZREVRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[1]), '-inf',
                  'LIMIT', 0, tonumber(ARGV[2]))
