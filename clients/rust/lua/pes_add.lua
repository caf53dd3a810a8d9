-- addPermitsAsync. KEYS = name, channel; ARGV = delta, publish command. Publishes the
-- delta (not the new value), only when it is positive.
local value = redis.call('get', KEYS[1]);
if (value == false) then
    value = 0;
end;
redis.call('set', KEYS[1], tonumber(value) + tonumber(ARGV[1]));
if tonumber(ARGV[1]) > 0 then
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
end;
