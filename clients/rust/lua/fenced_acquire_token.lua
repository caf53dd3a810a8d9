-- RedissonFencedLock.tryLockInnerAsync(leaseTime, unit, threadId), behind lockAndGetToken
-- and tryLockAndGetToken. KEYS = name, token key; ARGV = lease ms, owner field.
-- Reply {-1, token} when acquired or re-entered, {pttl, -1} when held by another.
if (redis.call('exists', KEYS[1]) == 0 or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then
    local token = redis.call('incr', KEYS[2]);
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return {-1, token};
end;
return {redis.call('pttl', KEYS[1]), -1};
