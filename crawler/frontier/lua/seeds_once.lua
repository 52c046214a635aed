-- seeds_once.lua: push a spider's start_urls into the seed list once per
-- crawl: only the first worker whose call sets the marker pushes them, in
-- the same atomic call, so they are taken as every other seed is.
--
-- KEYS[1]  <spider>:start_urls            list (or set): the seed list
-- KEYS[2]  {<seed list>}:start_urls_seeded
--                                         string: the marker, set once (the
--                                         time, ms of the Redis clock)
-- ARGV[1]  "set" when KEYS[1] is a set (REDIS_START_URLS_AS_SET); else a list
-- ARGV[2..] the start URLs, in the spider's order (LPUSH-ed: the first is
--          taken first)
-- Returns the number of URLs pushed, or -1 when the marker was set already
-- (nothing written).
-- Refused (an error reply, nothing written) when KEYS[1] holds another type.
local kind = ARGV[1] == 'set' and 'set' or 'list'
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= kind then
  return redis.error_reply('ERR seed key ' .. KEYS[1] .. ' holds a ' .. t .. ', not a ' ..
    kind .. ': nothing was written')
end
local now = redis.call('TIME')
if not redis.call('SET', KEYS[2], now[1] .. string.format('%03d', math.floor(now[2] / 1000)),
                  'NX') then
  return -1
end
for i = 2, #ARGV do
  if kind == 'set' then
    redis.call('SADD', KEYS[1], ARGV[i])
  else
    redis.call('LPUSH', KEYS[1], ARGV[i])
  end
end
return #ARGV - 1
