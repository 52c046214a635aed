-- delay.lua: set or remove a site's delay override (`scrapy frontier delay`),
-- and move the time its next request may start by the change of its pace,
-- so that the new delay counts from the site's last request: a site waiting
-- out a long delay that is lowered or removed is served when the new delay
-- allows, not when the old one would have; a raised delay holds it longer
-- at once. lib.lua is prepended.
--
-- The pace is lease.lua's, lib.lua's site_policy: the delay (the
-- override, else the option default_ms), at least the site's robots.txt
-- Crawl-delay, plus its adaptive slow delay, stretched by the margin. A due time in the past
-- moves too (it was the last request plus the old pace); a new one still in
-- the past changes nothing that matters, and one moved earlier is never
-- before now. A site in K.wait gets the new time as its score; one in the
-- ready index that is no longer due goes back to wait at its next lease
-- call (lease.lua reads K.due before it serves a site). Idempotent: sent
-- again, the override is the same and the pace does not change.
--
-- Keys (by name, lib.lua's K): K.delay (site -> delay override, ms), K.due
-- (site -> ms before which it is not served), K.wait (site -> ms when it
-- may be served next), K.rdelay (site -> robots.txt Crawl-delay, ms),
-- K.slow (site -> adaptive extra delay, ms).
-- Header options (o, by name): site; delay_ms, the new override, whole ms
-- >= 0, or absent to remove it; default_ms, the default delay, ms
-- (FRONTIER_DELAY); margin, the pacing margin (FRONTIER_DELAY_MARGIN).
-- Returns, by name ({name, value, ...}: protocol.py's fields): removed (1 when an override was removed; 0 when the
-- site had none, or one was set), moved (the ms the site's next request
-- moved by; negative: sooner; 0: not moved), problems (the bad values met,
-- a line of text each: key, site, value, what was done).
-- Refused before any write when a key has the wrong type or delay_ms is
-- not whole ms.
local H, refused = open_call('delay')
if not H then return refused end
local O = H.o
local site, default, margin = O.site, tonumber(O.default_ms), tonumber(O.margin)
local new = O.delay_ms ~= nil and string.format('%d', O.delay_ms) or ''
local err = check_types({
  {K.delay, 'hash'}, {K.due, 'hash'}, {K.wait, 'zset'},
})
if err then return err end
if new ~= '' and not (type(O.delay_ms) == 'number' and O.delay_ms >= 0 and
                      O.delay_ms == math.floor(O.delay_ms) and #new <= 15) then
  return redis.error_reply('ERR delay ' .. string.format('%q', tostring(O.delay_ms)) ..
    ' is not whole ms >= 0: nothing was written')
end

-- (the site's pace: lib.lua's site_policy, without jitter; its
-- concurrency is not needed)
local P = {delay_ms = default, margin = margin, jitter = 0, now = 0}
local function pace()
  local delay = site_policy(site, P, false)
  return delay
end

local before = pace()
local removed = 0
if new == '' then
  removed = redis.call('HDEL', K.delay, site)
else
  redis.call('HSET', K.delay, site, new)
end
local after = pace()

local moved = 0
local due = hnum(K.due, site, INT, nil, 'not an integer: left as it is')
if due and after ~= before then
  local now = now_ms()
  local next_due = due + after - before
  if after < before then next_due = math.max(next_due, math.min(due, now)) end
  if next_due > now or due > now then
    redis.call('HSET', K.due, site, next_due)
    if redis.call('ZSCORE', K.wait, site) then
      redis.call('ZADD', K.wait, 'XX', next_due, site)
    end
    moved = next_due - due
  end
end
return {'removed', removed, 'moved', moved, 'problems', problems}
