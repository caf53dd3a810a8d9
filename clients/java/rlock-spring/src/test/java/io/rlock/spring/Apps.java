// Test support (rlock-spring and rlock-shedlock tests): Spring Boot application contexts on
// a real module-loaded server, with either driver behind Boot's own RedisConnectionFactory,
// and connection factories made by hand for the transport's own tests.
package io.rlock.spring;

import org.springframework.boot.Banner;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.RedisStandaloneConfiguration;
import org.springframework.data.redis.connection.jedis.JedisConnectionFactory;
import org.springframework.data.redis.connection.lettuce.LettuceConnectionFactory;

import java.util.ArrayList;
import java.util.List;

public final class Apps {
    private Apps() {}

    /** The drivers a Spring application may have behind its RedisConnectionFactory. */
    public enum Driver { LETTUCE, JEDIS }

    /**
     * Starts `app` (a Boot application class) against 127.0.0.1:`port` with `driver`, no
     * web server, quiet logs; `props` are more `key=value` properties.
     */
    public static ConfigurableApplicationContext start(Class<?> app, int port, Driver driver, String... props) {
        List<String> p = new ArrayList<>(List.of(
                "spring.data.redis.host=127.0.0.1",
                "spring.data.redis.port=" + port,
                "spring.data.redis.client-type=" + driver.name().toLowerCase(java.util.Locale.ROOT),
                "logging.level.root=WARN",
                "spring.main.log-startup-info=false"));
        p.addAll(List.of(props));
        return new SpringApplicationBuilder(app).web(WebApplicationType.NONE).bannerMode(Banner.Mode.OFF)
                .properties(p.toArray(new String[0])).run();
    }

    /** A connection factory made by hand (started; destroy it after). */
    public static RedisConnectionFactory factory(Driver driver, int port) {
        RedisStandaloneConfiguration c = new RedisStandaloneConfiguration("127.0.0.1", port);
        if (driver == Driver.JEDIS) {
            JedisConnectionFactory f = new JedisConnectionFactory(c);
            f.afterPropertiesSet();
            f.start();
            return f;
        }
        LettuceConnectionFactory f = new LettuceConnectionFactory(c);
        f.afterPropertiesSet();
        f.start();
        return f;
    }

    public static void destroy(RedisConnectionFactory f) {
        try {
            ((org.springframework.beans.factory.DisposableBean) f).destroy();
        } catch (Exception e) {
            throw new IllegalStateException(e);
        }
    }
}
