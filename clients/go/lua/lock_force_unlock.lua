-- forceUnlockAsync: KEYS = lock, channel; ARGV = message, publish.
if (redis.call('del', KEYS[1]) == 1) then
    redis.call(ARGV[2], KEYS[2], ARGV[1]);
    return 1
else
    return 0
end
