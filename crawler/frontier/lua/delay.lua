-- delay.lua: set or remove a site's delay override (`scrapy frontier delay`),
-- and move the time its next request may start by the change of its pace,
-- so that the new delay counts from the site's last request: a site waiting
-- out a long delay that is lowered or removed is served when the new delay
-- allows, not when the old one would have; a raised delay holds it longer
-- at once. lib.lua is prepended.
--
-- The pace is lease.lua's: the delay (the override, else ARGV[3]), at least
-- the site's robots.txt Crawl-delay, plus its adaptive slow delay, stretched
-- by the margin ARGV[4]. A due time in the past moves too (it was the last
-- request plus the old pace); a new one still in the past changes nothing
-- that matters, and one moved earlier is never before now. A site in
-- KEYS[3] (wait) gets the new time as its score; one in the ready index
-- that is no longer due goes back to wait at its next lease call (lease.lua
-- reads KEYS[2] before it serves a site). Idempotent: sent again, the
-- override is the same and the pace does not change.
--
-- KEYS[1] {s}:delay   hash site -> delay override, ms
-- KEYS[2] {s}:due     hash site -> ms before which the site is not served
-- KEYS[3] {s}:wait    zset site -> ms when the site may be served next
-- KEYS[4] {s}:rdelay  hash site -> robots.txt Crawl-delay, ms
-- KEYS[5] {s}:slow    hash site -> adaptive extra delay, ms
-- ARGV[1] the site
-- ARGV[2] the new override, whole ms >= 0, or "" to remove it
-- ARGV[3] the default delay, ms (FRONTIER_DELAY)
-- ARGV[4] pacing margin (FRONTIER_DELAY_MARGIN)
-- Returns {removed, moved, problems}: removed is 1 when an override was
-- removed (0 when the site had none; 0 when one was set), moved the ms the
-- site's next request moved by (negative: sooner; 0: not moved), problems
-- the bad values met (a line of text each: key, site, value, what was done).
-- Refused before any write when a key has the wrong type or ARGV[2] is not
-- whole ms.
local site, default, margin = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local err = check_types({
  {KEYS[1], 'hash'}, {KEYS[2], 'hash'}, {KEYS[3], 'zset'},
})
if err then return err end
if ARGV[2] ~= '' and not (#ARGV[2] <= 15 and string.match(ARGV[2], NAT)) then
  return redis.error_reply('ERR delay ' .. string.format('%q', ARGV[2]) ..
    ' is not whole ms >= 0: nothing was written')
end

local function pace(delay)
  delay = math.max(delay, hnum(KEYS[4], site, NAT, 0, 'not whole ms: ignored'))
  delay = delay + hnum(KEYS[5], site, NAT, 0, 'not whole ms: ignored')
  return math.floor(delay * (1 + margin))
end

local before = pace(hnum(KEYS[1], site, NAT, default, 'delay must be whole ms >= 0: default used'))
local removed = 0
if ARGV[2] == '' then
  removed = redis.call('HDEL', KEYS[1], site)
else
  redis.call('HSET', KEYS[1], site, ARGV[2])
end
local after = pace(hnum(KEYS[1], site, NAT, default, 'delay must be whole ms >= 0: default used'))

local moved = 0
local due = hnum(KEYS[2], site, INT, nil, 'not an integer: left as it is')
if due and after ~= before then
  local now = now_ms()
  local next_due = due + after - before
  if after < before then next_due = math.max(next_due, math.min(due, now)) end
  if next_due > now or due > now then
    redis.call('HSET', KEYS[2], site, next_due)
    if redis.call('ZSCORE', KEYS[3], site) then
      redis.call('ZADD', KEYS[3], 'XX', next_due, site)
    end
    moved = next_due - due
  end
end
return {removed, moved, problems}
