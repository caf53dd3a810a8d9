-- trySetPermitsAsync. KEYS = name, channel; ARGV = permits, publish command. Publishes
-- the permits. The Duration variant adds ARGV[3] = ttl ms and sets with PX.
local value = redis.call('get', KEYS[1]);
if (value == false) then
    redis.call('set', KEYS[1], ARGV[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1;
end;
return 0;
