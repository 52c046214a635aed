-- trim_dead.lua: keep one shard's dead-letter list at its newest `keep`
-- entries and count what was trimmed, in one atomic call. Idempotent-safe:
-- it trims the list down to the cap and counts exactly the entries this
-- call removed, so a call sent again (a lost reply) or run by two workers
-- at once trims and counts nothing more. Both keys are the shard's (one
-- hash tag, one cluster slot): the count is not in the crawl-wide
-- {s}:stats, which is in another slot than a shard's list.
--
-- Keys (by name, lib.lua's K): K.dead, list of dead letters (JSON), newest
-- at the right; K.dead_trimmed, string: dead letters trimmed off K.dead so
-- far.
-- Header options (o, by name): keep, most entries kept (integer >= 1).
-- Returns the number of entries trimmed by this call.
-- lib.lua is prepended (check_types). Checks that may refuse the call
-- come first: nothing is written then.
local H, refused = open_call('trim_dead')
if not H then return refused end
local err = check_types({{K.dead, 'list'}, {K.dead_trimmed, 'string'}})
if err then return err end
local keep = tonumber(H.o.keep)
if not keep or keep < 1 or keep ~= math.floor(keep) then
  return redis.error_reply('ERR most dead letters kept must be a whole number >= 1, not ' ..
    tostring(H.o.keep) .. ': nothing was written')
end
local counted = redis.call('GET', K.dead_trimmed)
if counted and not (#counted <= 15 and string.match(counted, '^%d+$')) then
  return redis.error_reply('ERR frontier key ' .. K.dead_trimmed .. ' = ' ..
    string.format('%q', counted) .. ' is not a whole number: nothing was written')
end
local n = redis.call('LLEN', K.dead)
if n <= keep then return 0 end
redis.call('LTRIM', K.dead, -keep, -1)
redis.call('INCRBY', K.dead_trimmed, n - keep)
return n - keep
