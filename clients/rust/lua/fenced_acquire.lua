-- RedissonFencedLock's override of the plain tryLockInnerAsync (lock(), tryLock()): the
-- same rule, the token still incremented, nil/PTTL reply. KEYS = name, token key.
if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then
    redis.call('incr', KEYS[2]);
    redis.call('hincrby', KEYS[1], ARGV[2], 1);
    redis.call('pexpire', KEYS[1], ARGV[1]);
    return nil;
end;
return redis.call('pttl', KEYS[1]);
