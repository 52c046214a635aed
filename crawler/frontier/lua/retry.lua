-- retry.lua: hold a request in the retry set until its backoff has passed.
-- Any worker's next lease call moves it into its site's queue once due.
--
-- KEYS[1]  {s}:retries  zset "priority\tsite\tencoded request" -> due, ms
-- ARGV[1]  "priority\tsite\tencoded request"
-- ARGV[2]  delay, ms (from the Redis clock's now)
-- Returns the due time, ms.
local t = redis.call('TIME')
local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], due, ARGV[1])
return due
