-- drainPermitsAsync. KEYS = name. Returns the old value; SET 0 drops any TTL.
local value = redis.call('get', KEYS[1]);
if (value == false) then
    return 0;
end;
redis.call('set', KEYS[1], 0);
return value;
