-- RedissonWriteLock.forceUnlockAsync. KEYS = name, rw channel; ARGV = READ_UNLOCK_MESSAGE, publish.
if (redis.call('hget', KEYS[1], 'mode') == 'write') then
    redis.call('del', KEYS[1]);
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1;
end;
return 0;
