-- releaseIfExistsAsync. Same KEYS/ARGV; 0 without touching a missing key.
if redis.call('exists', KEYS[1]) == 0 then
    return 0
end
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], value)
return 1
