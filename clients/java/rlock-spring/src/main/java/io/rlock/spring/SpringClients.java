// Which rlock client an application's RedisConnectionFactory gets (rlock-spring): the one
// choice the auto-configuration, ShedLock applications and hand-made beans share, so a
// cluster factory never ends up behind the one-server transport.
package io.rlock.spring;

import io.lettuce.core.cluster.RedisClusterClient;
import io.rlock.RlockClient;
import io.rlock.RlockOptions;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;

import java.util.Objects;

/** Makes the {@link RlockClient} for an application's connection factory. */
public final class SpringClients {
    private SpringClients() {}

    /**
     * The client on `factory`, closed by the caller (it closes nothing of the factory's):
     * <ul>
     *   <li>a Lettuce factory in cluster mode: the client rides on the factory's own Lettuce
     *       cluster client (every primitive routed to its slot's master, waits on the slot's
     *       node, slot moves followed), as {@code RlockClient.create(RedisClusterClient, ...)};
     *   <li>a Jedis factory in cluster mode: refused, since Spring gives no per-node
     *       connection or sharded subscription through Jedis, and waits would be wrong;
     *   <li>any other factory (one server, Lettuce or Jedis; a Sentinel or static
     *       master/replica Lettuce factory): {@link SpringTransport} on the factory.
     * </ul>
     */
    public static RlockClient create(RedisConnectionFactory factory, RlockOptions options) {
        Objects.requireNonNull(factory, "factory");
        if (factory instanceof LettuceConnectionFactory lettuce && lettuce.isClusterAware()) {
            return RlockClient.create((RedisClusterClient) lettuce.getRequiredNativeClient(), options);
        }
        if (jedisCluster(factory)) {
            throw new IllegalStateException("rlock-spring cannot run on a Jedis connection factory in cluster mode:"
                    + " Spring Data Redis gives no per-node connection or sharded subscription through Jedis."
                    + " Use a Lettuce factory (spring.data.redis.client-type=lettuce), or define an RlockClient bean"
                    + " yourself with RlockClient.createCluster(...)");
        }
        return RlockClient.create(new SpringTransport(factory), options);
    }

    /** Whether `factory` is Jedis's in cluster mode (Jedis is optional: matched by name). */
    private static boolean jedisCluster(RedisConnectionFactory factory) {
        if (!factory.getClass().getName().equals("org.springframework.data.redis.connection.jedis.JedisConnectionFactory")) {
            return false;
        }
        try {
            return (Boolean) factory.getClass().getMethod("isRedisClusterAware").invoke(factory);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException("cannot ask the Jedis factory whether it is in cluster mode", e);
        }
    }
}
