-- tryAcquireAsync0. KEYS = name; ARGV = permits. 1 taken, 0 not enough (or no key).
local value = redis.call('get', KEYS[1]);
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
    local val = redis.call('decrby', KEYS[1], ARGV[1]);
    return 1;
end;
return 0;
