-- seeds_reclaim.lua: return the seeds of one intake batch to the seed list,
-- at the end seeds are taken from and in their original order (so they are
-- taken next, oldest first), and unregister the batch; all in one atomic
-- call, and only while the batch is registered and (unless ARGV[1] is
-- "any") older than ARGV[1] ms: of two workers reclaiming the same batch at
-- once, one moves its seeds and the other finds it gone, and a batch its
-- owner refreshed in the meantime stays where it is.
--
-- KEYS[1]  {<seed list>}:intake          zset: intake batch key -> ms of its
--                                        registration or last refresh
-- KEYS[2]  {<seed list>}:intake:<holder>:<n>
--                                        list: the batch, oldest seed at the
--                                        left
-- KEYS[3]  <spider>:start_urls           list: the seed list (taken from the
--                                        right)
-- ARGV[1]  least age of the registration, ms (integer >= 0), or "any" (the
--          owner returns its own batch)
-- ARGV[2]  the prefix every batch key has ("{<seed list>}:intake:")
-- ARGV[3]  "set" when KEYS[3] is a set (REDIS_START_URLS_AS_SET: the seeds
--          are added back to it); else a list
-- Returns the number of seeds returned (>= 0; the batch is then gone), or
-- -1 when the batch is not registered, -2 when it was refreshed less than
-- ARGV[1] ms ago (nothing done), -3 when KEYS[2] holds something other than
-- a list (unregistered; the value is left in place).
-- Refused (an error reply, nothing written) when KEYS[2] does not start with
-- ARGV[2], or KEYS[1] or KEYS[3] holds another type.
local prefix = ARGV[2]
if prefix == '' or string.sub(KEYS[2], 1, #prefix) ~= prefix or KEYS[2] == KEYS[3] then
  return redis.error_reply('ERR ' .. KEYS[2] .. ' is not an intake batch key (prefix ' ..
    prefix .. '): nothing was written')
end
local as_set = ARGV[3] == 'set'
for _, kt in ipairs({{KEYS[1], 'zset'}, {KEYS[3], as_set and 'set' or 'list'}}) do
  local t = redis.call('TYPE', kt[1])['ok']
  if t ~= 'none' and t ~= kt[2] then
    return redis.error_reply('ERR seed intake key ' .. kt[1] .. ' holds a ' .. t ..
      ', not a ' .. kt[2] .. ': nothing was written')
  end
end
local score = redis.call('ZSCORE', KEYS[1], KEYS[2])
if not score then return -1 end
if ARGV[1] ~= 'any' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(score) > now - tonumber(ARGV[1]) then return -2 end
end
local kind = redis.call('TYPE', KEYS[2])['ok']
if kind ~= 'none' and kind ~= 'list' then
  redis.call('ZREM', KEYS[1], KEYS[2])
  return -3
end
-- Newest first onto the right end: the oldest ends rightmost, taken first.
-- Unregistered last: had a move failed, the rest would stay findable.
local n = 0
if as_set then
  for _, seed in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
    redis.call('SADD', KEYS[3], seed)
    n = n + 1
  end
  redis.call('DEL', KEYS[2])
else
  while redis.call('LMOVE', KEYS[2], KEYS[3], 'RIGHT', 'RIGHT') do n = n + 1 end
end
redis.call('ZREM', KEYS[1], KEYS[2])
return n
