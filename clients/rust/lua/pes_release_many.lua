-- tryReleaseAsync(ids). KEYS = name, channel, timeout zset; ARGV = count, now, publish
-- command, ids. All or nothing: 0 if any id is unknown or expired. Publishes how many.
for i = 4, #ARGV, 1 do
    local expire = redis.call('zscore', KEYS[3], ARGV[i]);
    if expire == false or tonumber(expire) <= tonumber(ARGV[2]) then
        return 0;
    end;
end;
local expiredIds = redis.call('zrangebyscore', KEYS[3], 0, ARGV[2], 'limit', 0, -1);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[3], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[3], KEYS[2], value);
    end;
end;
local keys = {};
for i = 4, #ARGV, 1 do
    table.insert(keys, ARGV[i]);
end;
local removed = redis.call('zrem', KEYS[3], unpack(keys));
redis.call('incrby', KEYS[1], removed);
redis.call(ARGV[3], KEYS[2], removed);
return removed;
