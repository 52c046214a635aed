-- forget_workers.lua: remove the records of dead workers from the worker
-- registry: those whose last heartbeat is older than ARGV[1] seconds. Each
-- record is read and judged inside this one atomic call, so a worker that
-- came back (a new heartbeat since the caller looked) is kept.
--
-- KEYS[1]  {s}:workers  hash worker id -> JSON heartbeat record
--                       ({"last_heartbeat": <Unix time, s>, ...})
-- ARGV[1]  seconds after its last heartbeat that a record is removed
-- ARGV[2..] worker ids the caller found stale
-- Returns {removed, problems}: how many records were removed, and one line
-- per record left alone because it could not be read.
-- Times: the Redis server's clock (TIME), seconds.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'hash' then
  return redis.error_reply('ERR frontier key ' .. KEYS[1] .. ' holds a ' .. t ..
    ', not a hash: nothing was written')
end
local after = tonumber(ARGV[1])
if not after or after < 0 then
  return redis.error_reply('ERR forget-after must be seconds >= 0, not ' .. tostring(ARGV[1]))
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local removed, problems = 0, {}
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local ok, record = pcall(cjson.decode, raw)
    local beat = ok and type(record) == 'table' and tonumber(record['last_heartbeat'])
    if not beat then
      problems[#problems + 1] = KEYS[1] .. ' ' .. ARGV[i] ..
        ' has no readable last_heartbeat: kept'
    elseif beat < now - after then
      removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
    end
  end
end
return {removed, problems}
