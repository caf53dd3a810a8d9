//! Jitter for retry delays and owner ids' client part.
//!
//! A tiny xorshift generator is enough here: the jitter only needs to spread clients
//! that failed together, not to be unpredictable, so no `rand` dependency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A lock-free xorshift64* generator shared by all threads of one client.
#[derive(Debug)]
pub(crate) struct Jitter(AtomicU64);

impl Jitter {
    /// Seeded from a fresh v4 uuid, so two clients started together diverge.
    pub(crate) fn new() -> Self {
        let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
        Self::seeded(hi ^ lo)
    }

    pub(crate) fn seeded(seed: u64) -> Self {
        // Zero is xorshift's only fixed point.
        Jitter(AtomicU64::new(seed | 1))
    }

    fn next(&self) -> u64 {
        // A racing update may lose a step; for jitter that is harmless.
        let mut x = self.0.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0.store(x, Ordering::Relaxed);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A duration drawn uniformly from `[0, max]`.
    pub(crate) fn up_to(&self, max: Duration) -> Duration {
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next() % (nanos.saturating_add(1).max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_stays_within_bounds() {
        let j = Jitter::seeded(42);
        for _ in 0..1000 {
            assert!(j.up_to(Duration::from_millis(10)) <= Duration::from_millis(10));
        }
        assert_eq!(j.up_to(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn it_survives_a_zero_seed() {
        let j = Jitter::seeded(0);
        assert_ne!(j.next(), j.next());
    }
}
