-- bloom.lua: check, or check and set, the bits of many requests in one Bloom
-- bitmap. Used by BloomDupeFilter.request_seen, add and contains
-- (crawler/frontier/bloom.py); the frontier's push.lua has the same
-- check-and-set inline, for one request, atomic with the queue push.
--
-- KEYS[1]  {s}:bloom (or {s}:bloom:<shard>)   string: the bitmap
-- KEYS[2]  "or" only: {s}:bloom:load:<id>, a bitmap of the filter's size to
--          OR into KEYS[1]; deleted
-- ARGV[1]  "add" (set the bits, report which were set before), "check"
--          (read only) or "or" (BloomDupeFilter.load; returns "")
-- ARGV[2]  bitmap size in bytes; an absent bitmap is created zeroed, at
--          exactly this size, by the first "add", so Redis allocates it once
-- ARGV[3]  number of hashes k
-- ARGV[4]  bit offsets, k per request, decimal, separated by spaces ("" for "or")
--          (strings: Lua's number-to-string conversion would cost more than
--          the bit operations)
-- Returns a string of one byte per request: "1" when every bit of the
-- request was already set (seen, or a false positive), "0" otherwise.
-- Errors when the bitmap exists with another size (workers configured with
-- different FRONTIER_BLOOM_CAPACITY / FRONTIER_BLOOM_ERROR_RATE).
local size = tonumber(ARGV[2])
local k = tonumber(ARGV[3])
local len = redis.call('STRLEN', KEYS[1])
local next_offset = string.gmatch(ARGV[4], '%d+')
local out = {}
if len == 0 then
  if ARGV[1] == 'check' then
    local n = 0
    for _ in next_offset do n = n + 1 end
    return string.rep('0', n / k)
  end
  redis.call('SETRANGE', KEYS[1], size - 1, '\0')
elseif len ~= size then
  return redis.error_reply('ERR Bloom filter ' .. KEYS[1] .. ' holds ' .. len ..
    ' bytes but this worker expects ' .. size .. ': FRONTIER_BLOOM_CAPACITY or ' ..
    'FRONTIER_BLOOM_ERROR_RATE differ from those the filter was created with')
end
if ARGV[1] == 'or' then
  if redis.call('STRLEN', KEYS[2]) ~= size then
    redis.call('DEL', KEYS[2])
    return redis.error_reply('ERR ' .. KEYS[2] .. ' is not a bitmap of ' .. size .. ' bytes')
  end
  redis.call('BITOP', 'OR', KEYS[1], KEYS[1], KEYS[2])
  redis.call('DEL', KEYS[2])
elseif ARGV[1] == 'add' then
  -- One BITFIELD (old values back) per batch of about 1000 bits: one
  -- command to run and to propagate instead of one per bit.
  local per = math.max(1, math.floor(1000 / k))
  local done = false
  while not done do
    local args, m = {}, 0
    for o in next_offset do
      local j = #args
      args[j + 1], args[j + 2], args[j + 3], args[j + 4] = 'SET', 'u1', o, '1'
      if j + 4 == 4 * k * per then break end
    end
    m = #args / (4 * k)
    if m == 0 then break end
    local old = redis.call('BITFIELD', KEYS[1], unpack(args))
    for i = 0, m - 1 do
      local seen = '1'
      for j = i * k + 1, i * k + k do
        if old[j] == 0 then seen = '0' end
      end
      out[#out + 1] = seen
    end
    done = m < per
  end
else
  -- Stop at a request's first clear bit; skip its other offsets by plain
  -- find, without making Lua strings of them.
  local s, find, sub = ARGV[4], string.find, string.sub
  local last, pos = #s, 1
  while pos <= last do
    local seen = '1'
    for _ = 1, k do
      local stop = find(s, ' ', pos, true) or last + 1
      if seen == '1' and redis.call('GETBIT', KEYS[1], sub(s, pos, stop - 1)) == 0 then
        seen = '0'
      end
      pos = stop + 1
    end
    out[#out + 1] = seen
  end
end
return table.concat(out)
