-- getLeaseTimeAsync. ARGV = id bytes, NON_EXPIRABLE, now, publish command. -1 without a
-- lease, the remaining ms, or 0 for an unknown permit (Java then throws).
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
    return tonumber(value) == tonumber(ARGV[2]) and -1 or tonumber(value) - tonumber(ARGV[3]);
end;
return 0;
