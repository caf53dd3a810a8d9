-- tryReleaseAsync(id). KEYS = name, channel, timeout zset; ARGV = id bytes, 1, now,
-- publish command. No reclaim. An expired but not yet reclaimed permit is returned to the
-- pool (and the new count published) but the reply is 0, as for an unknown id.
local expire = redis.call('zscore', KEYS[3], ARGV[1]);
local removed = redis.call('zrem', KEYS[3], ARGV[1]);
if tonumber(removed) ~= 1 then
    return 0;
end;
local value = redis.call('incrby', KEYS[1], ARGV[2]);
redis.call(ARGV[4], KEYS[2], value);
if tonumber(expire) <= tonumber(ARGV[3]) then
    return 0;
end;
return 1;
