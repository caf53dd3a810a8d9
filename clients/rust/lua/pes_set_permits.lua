-- setPermitsAsync. KEYS = name, channel, timeout zset; ARGV = permits, publish command.
-- Makes available + acquired equal `permits`; publishes the permits when it changed.
local available = redis.call('get', KEYS[1]);
if (available == false) then
    redis.call('set', KEYS[1], ARGV[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return;
end;
local acquired = redis.call('zcount', KEYS[3], 0, '+inf');
local maximum = (acquired == false and 0 or acquired) + tonumber(available);
if (maximum == tonumber(ARGV[1])) then
    return;
end;
redis.call('incrby', KEYS[1], tonumber(ARGV[1]) - maximum);
redis.call(ARGV[2], KEYS[2], ARGV[1]);
