-- countDownAsync. KEYS = name, channel; ARGV = ZERO_COUNT_MESSAGE, publish command. DECR;
-- the key goes at <= 0 (a countDown on no latch creates -1 and deletes it); the zero
-- message only when it reaches exactly 0.
local v = redis.call('decr', KEYS[1]);
if v <= 0 then redis.call('del', KEYS[1]) end;
if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end;
