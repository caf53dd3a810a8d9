-- releaseAsync. KEYS = name, channel; ARGV = permits, publish command. Creates the key.
local value = redis.call('incrby', KEYS[1], ARGV[1]);
redis.call(ARGV[2], KEYS[2], value);
