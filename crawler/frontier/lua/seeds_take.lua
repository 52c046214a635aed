-- seeds_take.lua: move up to ARGV[1] seeds, oldest first, from the seed list
-- into a new intake batch, registered in the same call. The seeds never
-- leave Redis: the batch holds them until the requests made from them are
-- in the frontier (seeds_done.lua), or until a worker returns them to the
-- seed list (seeds_reclaim.lua) because their owner died.
--
-- Idempotent per batch key: when KEYS[3] already holds seeds (an earlier
-- call with this key ran but its reply was lost), they are returned again,
-- and no seed is taken. A batch key is never used for two different takes.
-- When no seed was taken, nothing stays registered.
--
-- KEYS[1]  <spider>:start_urls           list: the seed list (LPUSH-ed; taken
--                                        from the right, oldest first)
-- KEYS[2]  {<seed list>}:intake          zset: intake batch key -> ms (Redis
--                                        clock) it was registered or last
--                                        refreshed by its owner
-- KEYS[3]  {<seed list>}:intake:<holder>:<n>
--                                        list: the new batch, oldest seed at
--                                        the left
-- ARGV[1]  most seeds to take (integer >= 1)
-- ARGV[2]  "set" when KEYS[1] is a set (REDIS_START_URLS_AS_SET: members
--          move, in no set order, with SRANDMEMBER and SREM); else a list
-- Returns {reused, seed1, ..., seedN}: reused is 1 when the seeds are those
-- an earlier call with this batch key took, 0 when they were taken now; no
-- seed: nothing was taken (and KEYS[3] is not registered).
-- Refused (an error reply, nothing written) when a key holds another type or
-- ARGV[1] is not a positive integer.
local as_set = ARGV[2] == 'set'
for _, kt in ipairs({{KEYS[1], as_set and 'set' or 'list'}, {KEYS[2], 'zset'},
                     {KEYS[3], 'list'}}) do
  local t = redis.call('TYPE', kt[1])['ok']
  if t ~= 'none' and t ~= kt[2] then
    return redis.error_reply('ERR seed intake key ' .. kt[1] .. ' holds a ' .. t ..
      ', not a ' .. kt[2] .. ': nothing was written')
  end
end
local most = tonumber(ARGV[1])
if not most or most < 1 or most ~= math.floor(most) then
  return redis.error_reply('ERR seeds_take.lua: most seeds must be an integer >= 1, got ' ..
    tostring(ARGV[1]) .. ': nothing was written')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZADD', KEYS[2], now, KEYS[3])
local out = {0}
local held = redis.call('LRANGE', KEYS[3], 0, -1)
if #held > 0 then
  out[1] = 1
  for _, seed in ipairs(held) do out[#out + 1] = seed end
  return out
end
if as_set then
  for _, seed in ipairs(redis.call('SRANDMEMBER', KEYS[1], most)) do
    redis.call('SREM', KEYS[1], seed)
    redis.call('RPUSH', KEYS[3], seed)
    out[#out + 1] = seed
  end
else
  for _ = 1, most do
    local seed = redis.call('LMOVE', KEYS[1], KEYS[3], 'RIGHT', 'RIGHT')
    if not seed then break end
    out[#out + 1] = seed
  end
end
if #out == 1 then redis.call('ZREM', KEYS[2], KEYS[3]) end
return out
