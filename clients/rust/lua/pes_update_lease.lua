-- updateLeaseTimeAsync. ARGV = id bytes, new expiry (absolute or NON_EXPIRABLE), now,
-- publish command. 1 when the (unexpired) permit exists.
--
-- The reclaim prefix shared by availablePermits, getPermits, acquiredPermits,
-- updateLeaseTime and getLeaseTime. KEYS = name, timeout zset, channel. ARGV[now_arg] =
-- now, ARGV[pub_arg] = publish command.
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[3], 'limit', 0, -1);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[4], KEYS[3], value);
    end;
    
end;

local value = redis.call('zscore', KEYS[2], ARGV[1]);
if (value ~= false) then
    redis.call('zadd', KEYS[2], ARGV[2], ARGV[1]);
    return 1;
end;
return 0;
