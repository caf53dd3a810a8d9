-- ReadLockTask's watchdog, for one lock. KEYS = name, key prefix (pairs, one per lock);
-- ARGV = lease ms, then per lock: number of reader fields, the fields.
local result = {}
local argIdx = 2
for i = 1, #KEYS, 2 do
    local anyAlive = false;
    local lockNamesCount = tonumber(ARGV[argIdx]);
    argIdx = argIdx + 1;
    for k = 1, lockNamesCount do
        local counter = redis.call('hget', KEYS[i], ARGV[argIdx]);
        if (counter ~= false) then
            anyAlive = true;
            for c=counter, 1, -1 do
                redis.call('pexpire', KEYS[i+1] .. ':' .. ARGV[argIdx] .. ':rwlock_timeout:' .. c, ARGV[1]);
            end;
        end;
        argIdx = argIdx + 1;
    end;
    if (anyAlive) then
        redis.call('pexpire', KEYS[i], ARGV[1]);
        table.insert(result, 1);
    else
        table.insert(result, 0);
    end;
end;
return result;
