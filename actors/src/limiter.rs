//! The one regional limiter every ZoneActor of a region draws on before it calls the cloud:
//! EC2's request buckets are per account and region, not per zone, so the zones share them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dovetail_cloud::limits::ApiLimits;
use dovetail_core::clock::Clock;

/// EC2's buckets on the plane's clock.
pub struct RegionLimiter {
    limits: Mutex<ApiLimits>,
    clock: Arc<dyn Clock>,
}

impl RegionLimiter {
    pub fn new(limits: ApiLimits, clock: Arc<dyn Clock>) -> Self {
        RegionLimiter { limits: Mutex::new(limits), clock }
    }

    /// Grants one launch call of up to `wanted` instances: how many it may launch now, or how
    /// long to wait when it may launch none.
    pub fn launch(&self, wanted: usize) -> Result<usize, Duration> {
        let now = self.clock.now();
        let mut l = self.limits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        l.mutating.check(now, 1.0)?;
        l.launched_instances.check(now, 1.0)?;
        // As many as the bucket holds whole tokens for, at most `wanted`.
        let whole = (l.launched_instances.available(now) + 1e-9).floor().max(1.0) as usize;
        let n = wanted.clamp(1, whole);
        l.mutating.take(now, 1.0);
        l.launched_instances.take(now, n as f64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dovetail_cloud::limits::Bucket;
    use dovetail_core::clock::ManualClock;

    #[test]
    fn launches_are_cut_to_the_tokens_there_and_wait_when_none_are() {
        let clock = Arc::new(ManualClock::new());
        let limits = ApiLimits { launched_instances: Bucket::new(4.0, 2.0), ..ApiLimits::default() };
        let l = RegionLimiter::new(limits, clock.clone());
        assert_eq!(l.launch(3), Ok(3));
        assert_eq!(l.launch(3), Ok(1), "one token left");
        let wait = l.launch(1).expect_err("empty");
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        clock.advance(Duration::from_secs(1));
        assert_eq!(l.launch(5), Ok(2));
        clock.advance(Duration::from_secs(10));
        assert_eq!(l.launch(3), Ok(3), "refilled to at most the burst");
        assert_eq!(l.launch(9), Ok(1));
    }
}
