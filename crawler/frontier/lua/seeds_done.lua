-- seeds_done.lua: let go of intake batches whose requests are in the
-- frontier: each batch is deleted and unregistered, in one atomic call.
-- Running it twice, or on a batch already returned to the seed list, does
-- nothing more.
--
-- KEYS[1]  {<seed list>}:intake          zset: intake batch key -> ms of its
--                                        registration or last refresh
-- KEYS[2..] {<seed list>}:intake:<holder>:<n>
--                                        lists: the batches to let go of
-- Returns how many of them were still registered.
local n = 0
for i = 2, #KEYS do
  n = n + redis.call('ZREM', KEYS[1], KEYS[i])
  redis.call('DEL', KEYS[i])
end
return n
