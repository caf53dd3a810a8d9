-- forceUnlockAsync: KEYS = lock, channel; ARGV = message.
if (redis.call('del', KEYS[1]) == 1) then
    redis.call('publish', KEYS[2], ARGV[1]);
    return 1
else
    return 0
end
