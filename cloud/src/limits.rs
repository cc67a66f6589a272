//! EC2's request throttling: token buckets per account and region (not per zone), with the
//! sizes of `performance-anchors.md` 2.1 by default. The sim cloud throttles with them; the
//! control plane paces its own calls with the same buckets, so it rarely meets a throttle.

use std::time::Duration;

/// A token bucket: holds up to `max` tokens, refills `refill_per_s` per second.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    pub max: f64,
    pub refill_per_s: f64,
    tokens: f64,
    at: Duration,
}

impl Bucket {
    /// A full bucket.
    pub fn new(max: f64, refill_per_s: f64) -> Self {
        Bucket { max, refill_per_s, tokens: max, at: Duration::ZERO }
    }

    fn refill(&mut self, now: Duration) {
        if now > self.at {
            self.tokens = (self.tokens + (now - self.at).as_secs_f64() * self.refill_per_s).min(self.max);
            self.at = now;
        }
    }

    /// Whether `n` tokens are there now; when not, how long until they are.
    pub fn check(&mut self, now: Duration, n: f64) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens + 1e-9 >= n {
            return Ok(());
        }
        if self.refill_per_s <= 0.0 || n > self.max {
            return Err(Duration::from_secs(3600));
        }
        Err(Duration::from_secs_f64((n - self.tokens) / self.refill_per_s))
    }

    /// The tokens there at `now`.
    pub fn available(&mut self, now: Duration) -> f64 {
        self.refill(now);
        self.tokens
    }

    /// Takes `n` tokens (after a successful `check`).
    pub fn take(&mut self, now: Duration, n: f64) {
        self.refill(now);
        self.tokens -= n;
    }
}

/// EC2's buckets for one account and region.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiLimits {
    /// Mutating actions (CreateFleet, TerminateInstances calls, CreateTags): 50, 5/s.
    pub mutating: Bucket,
    /// Non-mutating actions (Describe*): 100, 20/s.
    pub non_mutating: Bucket,
    /// Instances launched: 1,000, 2/s.
    pub launched_instances: Bucket,
    /// Instances terminated: 1,000, 20/s.
    pub terminated_instances: Bucket,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            mutating: Bucket::new(50.0, 5.0),
            non_mutating: Bucket::new(100.0, 20.0),
            launched_instances: Bucket::new(1000.0, 2.0),
            terminated_instances: Bucket::new(1000.0, 20.0),
        }
    }
}

impl ApiLimits {
    /// Every bucket `factor` times larger and faster (load tests that say so).
    pub fn raised(factor: f64) -> Self {
        let d = ApiLimits::default();
        let scale = |b: Bucket| Bucket::new(b.max * factor, b.refill_per_s * factor);
        ApiLimits {
            mutating: scale(d.mutating),
            non_mutating: scale(d.non_mutating),
            launched_instances: scale(d.launched_instances),
            terminated_instances: scale(d.terminated_instances),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills() {
        let mut b = Bucket::new(2.0, 1.0);
        let t0 = Duration::ZERO;
        assert!(b.check(t0, 2.0).is_ok());
        b.take(t0, 2.0);
        let wait = b.check(t0, 1.0).unwrap_err();
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-6);
        assert!(b.check(Duration::from_millis(1500), 1.0).is_ok());
        assert!(b.check(Duration::from_secs(100), 3.0).is_err(), "never more than max");
    }
}
