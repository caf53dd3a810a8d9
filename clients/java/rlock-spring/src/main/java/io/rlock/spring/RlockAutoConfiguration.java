// rlock-spring's Spring Boot auto-configuration: with the rlock-spring jar on the class path
// and a RedisConnectionFactory in the context (Boot's own, Lettuce or Jedis), an RlockClient
// on that factory and a LockRegistry on the client (RlockMetricsAutoConfiguration adds the
// Micrometer meters). Each bean backs off when the application defines its own.
package io.rlock.spring;

import io.rlock.RlockClient;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.integration.support.locks.LockRegistry;

@AutoConfiguration(afterName = {
        // Boot 4's Redis auto-configuration, and Boot 3's.
        "org.springframework.boot.data.redis.autoconfigure.DataRedisAutoConfiguration",
        "org.springframework.boot.autoconfigure.data.redis.RedisAutoConfiguration"})
@ConditionalOnClass({RlockClient.class, RedisConnectionFactory.class})
@ConditionalOnProperty(prefix = "rlock", name = "enabled", havingValue = "true", matchIfMissing = true)
@EnableConfigurationProperties(RlockProperties.class)
public class RlockAutoConfiguration {
    /** The client, on the application's connection factory ({@link SpringClients}); closed with the context. */
    @Bean(destroyMethod = "close")
    @ConditionalOnMissingBean
    @ConditionalOnBean(RedisConnectionFactory.class)
    public RlockClient rlockClient(RedisConnectionFactory factory, RlockProperties properties) {
        return SpringClients.create(factory, properties.toOptions());
    }

    @Bean
    @ConditionalOnMissingBean(LockRegistry.class)
    @ConditionalOnBean(RlockClient.class)
    public RlockLockRegistry rlockLockRegistry(RlockClient client, RlockProperties properties) {
        return new RlockLockRegistry(client, properties.getRegistry().getKey(), properties.getRegistry().getExpireAfter());
    }
}
