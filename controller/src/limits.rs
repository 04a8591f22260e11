//! Abuse limits per caller: a token bucket of calls per minute for each identity (the
//! certificate's name under mTLS, else the agent_id the call claims). Pure: the clock is an
//! argument. Memory is bounded: buckets idle long enough to be full again are forgotten
//! when the table is full, and a caller beyond the table's size is let through (a fleet
//! never has that many callers at once; refusing would punish the honest ones).

use std::collections::HashMap;

const MINUTE_NS: u64 = 60_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ns: u64,
}

/// Calls per minute for each key, with a burst of one minute's worth.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    max_keys: usize,
    buckets: HashMap<String, Bucket>,
    /// Keys let through untracked because the table was full (logged by the caller).
    pub untracked: u64,
}

impl RateLimiter {
    /// `per_minute` 0: no limit.
    pub fn new(per_minute: u32, max_keys: usize) -> Self {
        RateLimiter {
            per_minute,
            max_keys: max_keys.max(1),
            buckets: HashMap::new(),
            untracked: 0,
        }
    }

    /// Takes one call for `key` at `now_ns`; Err: refused, with the nanoseconds until the
    /// next call would be taken.
    pub fn try_take(&mut self, key: &str, now_ns: u64) -> Result<(), u64> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let cap = self.per_minute as f64;
        let per_ns = cap / MINUTE_NS as f64;
        if !self.buckets.contains_key(key) && self.buckets.len() >= self.max_keys {
            // Buckets a minute idle are full again: the same as no bucket.
            self.buckets
                .retain(|_, b| now_ns.saturating_sub(b.at_ns) < MINUTE_NS);
            if self.buckets.len() >= self.max_keys {
                self.untracked += 1;
                return Ok(());
            }
        }
        let b = self.buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: cap,
            at_ns: now_ns,
        });
        let elapsed = now_ns.saturating_sub(b.at_ns) as f64;
        b.tokens = (b.tokens + elapsed * per_ns).min(cap);
        b.at_ns = b.at_ns.max(now_ns);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - b.tokens) / per_ns).ceil() as u64)
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_minute_of_calls_then_one_per_refill() {
        let mut l = RateLimiter::new(60, 100);
        for _ in 0..60 {
            assert!(l.try_take("a", 10 * S).is_ok());
        }
        let wait = l.try_take("a", 10 * S).unwrap_err();
        assert!((S - 1_000..=S).contains(&wait), "{wait}");
        // Another caller is not affected.
        assert!(l.try_take("b", 10 * S).is_ok());
        // One call a second comes back.
        assert!(l.try_take("a", 11 * S).is_ok());
        assert!(l.try_take("a", 11 * S).is_err());
        assert!(RateLimiter::new(0, 1).try_take("x", 0).is_ok());
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut l = RateLimiter::new(1, 2);
        assert!(l.try_take("a", 0).is_ok());
        assert!(l.try_take("b", 0).is_ok());
        // Full and nobody idle: let through, untracked.
        assert!(l.try_take("c", S).is_ok());
        assert_eq!((l.tracked(), l.untracked), (2, 1));
        // A minute later the idle buckets make room.
        assert!(l.try_take("c", 61 * S).is_ok());
        assert!(l.try_take("c", 61 * S).is_err());
        assert!(l.tracked() <= 2);
    }
}
