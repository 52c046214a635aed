-- trim_dead.lua: keep one shard's dead-letter list at its newest ARGV[1]
-- entries and count what was trimmed, in one atomic call. Idempotent-safe:
-- it trims the list down to the cap and counts exactly the entries this
-- call removed, so a call sent again (a lost reply) or run by two workers
-- at once trims and counts nothing more. Both keys are the shard's (one
-- hash tag, one cluster slot): the count is not in the crawl-wide
-- {s}:stats, which is in another slot than a shard's list.
--
-- KEYS[1]  {s}:dead          list of dead letters (JSON), newest at the right
-- KEYS[2]  {s}:dead:trimmed  string: dead letters trimmed off KEYS[1] so far
-- ARGV[1]  most entries kept (integer >= 1)
-- Returns the number of entries trimmed by this call.
-- lib.lua is prepended (check_types). Checks that may refuse the call
-- come first: nothing is written then.
local err = check_types({{KEYS[1], 'list'}, {KEYS[2], 'string'}})
if err then return err end
local keep = tonumber(ARGV[1])
if not keep or keep < 1 or keep ~= math.floor(keep) then
  return redis.error_reply('ERR most dead letters kept must be a whole number >= 1, not ' ..
    tostring(ARGV[1]) .. ': nothing was written')
end
local counted = redis.call('GET', KEYS[2])
if counted and not (#counted <= 15 and string.match(counted, '^%d+$')) then
  return redis.error_reply('ERR frontier key ' .. KEYS[2] .. ' = ' ..
    string.format('%q', counted) .. ' is not a whole number: nothing was written')
end
local n = redis.call('LLEN', KEYS[1])
if n <= keep then return 0 end
redis.call('LTRIM', KEYS[1], -keep, -1)
redis.call('INCRBY', KEYS[2], n - keep)
return n - keep
