-- acquiredPermitsAsync: ZCOUNT after the reclaim.
--
-- The reclaim prefix shared by availablePermits, getPermits, acquiredPermits,
-- updateLeaseTime and getLeaseTime. KEYS = name, timeout zset, channel. ARGV[now_arg] =
-- now, ARGV[pub_arg] = publish command.
local expiredIds = redis.call('zrangebyscore', KEYS[2], 0, ARGV[1], 'limit', 0, -1);
if #expiredIds > 0 then
    redis.call('zrem', KEYS[2], unpack(expiredIds));
    local value = redis.call('incrby', KEYS[1], #expiredIds);
    if tonumber(value) > 0 then
        redis.call(ARGV[2], KEYS[3], value);
    end;
    
end;

local acquired = redis.call('zcount', KEYS[2], 0, '+inf');
return acquired == false and 0 or acquired;
