// rlock-spring's Micrometer auto-configuration: when Micrometer is on the class path, the
// auto-configured RlockClient's counters as meters. Its own auto-configuration, after the
// client's, so that the client bean is known when its condition is read.
package io.rlock.spring;

import io.micrometer.core.instrument.binder.MeterBinder;
import io.rlock.RlockClient;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.context.annotation.Bean;

@AutoConfiguration(after = RlockAutoConfiguration.class)
@ConditionalOnClass({MeterBinder.class, RlockClient.class})
public class RlockMetricsAutoConfiguration {
    /** Boot's metrics support binds every MeterBinder bean to the application's registries. */
    @Bean
    @ConditionalOnMissingBean
    @ConditionalOnBean(RlockClient.class)
    public RlockMeterBinder rlockMeterBinder(RlockClient client) {
        return new RlockMeterBinder(client);
    }
}
