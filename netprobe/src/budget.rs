//! The intrusiveness cap: a token bucket of probe payload bytes per host (pure; time in ms).
//!
//! Every probe byte through the host is charged, as prober and as target. Transfers are taken
//! only when the bucket holds them ([`Bucket::try_take`]); echoes are tiny and always charged
//! ([`Bucket::charge`], which may leave the level below zero). Over any window `w` seconds the
//! host moves at most `rate × w + capacity` probe bytes plus its echoes, plus one transfer
//! borrowed for an overdue pair ([`Bucket::try_take_borrowing`]).

#[derive(Debug, Clone)]
pub struct Bucket {
    rate_per_ms: f64,
    capacity: f64,
    level: f64,
    last_ms: u64,
}

impl Bucket {
    /// A full bucket refilled at `rate_bytes_per_s` up to `capacity` bytes.
    pub fn new(rate_bytes_per_s: u64, capacity: u64, now_ms: u64) -> Bucket {
        Bucket {
            rate_per_ms: rate_bytes_per_s as f64 / 1000.0,
            capacity: capacity as f64,
            level: capacity as f64,
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.last_ms) as f64;
        self.level = (self.level + dt * self.rate_per_ms).min(self.capacity);
        self.last_ms = self.last_ms.max(now_ms);
    }

    /// Takes `n` bytes if the bucket holds them.
    pub fn try_take(&mut self, n: u64, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.level >= n as f64 {
            self.level -= n as f64;
            true
        } else {
            false
        }
    }

    /// Takes `n` bytes if the bucket holds them, or if it is not in debt already and `n` fits
    /// by borrowing from its next refill (the level may fall to `-n`). For a pair whose
    /// transfers were refused again and again: a host whose bucket is always low when one
    /// peer asks (it has just spent on its own turn) would otherwise starve that link forever.
    /// Long-run the rate holds; over a window one more transfer may pass.
    pub fn try_take_borrowing(&mut self, n: u64, now_ms: u64) -> bool {
        self.refill(now_ms);
        if self.level >= 0.0 {
            self.level -= n as f64;
            true
        } else {
            false
        }
    }

    /// Charges `n` bytes unconditionally.
    pub fn charge(&mut self, n: u64, now_ms: u64) {
        self.refill(now_ms);
        self.level -= n as f64;
    }

    /// Gives back `n` bytes taken for a transfer that did not happen.
    pub fn refund(&mut self, n: u64, now_ms: u64) {
        self.refill(now_ms);
        self.level = (self.level + n as f64).min(self.capacity);
    }

    pub fn level(&self) -> f64 {
        self.level
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overdue_transfer_borrows_one_transfer_and_the_debt_is_repaid_first() {
        let mut b = Bucket::new(1000, 2000, 0);
        assert!(b.try_take(1500, 0));
        assert!(!b.try_take(1000, 0), "500 left");
        assert!(b.try_take_borrowing(1000, 0), "borrowed from the refill");
        assert_eq!(b.level(), -500.0);
        assert!(!b.try_take_borrowing(1000, 0), "in debt: no second loan");
        assert!(!b.try_take(1000, 1000), "the refill repays the debt first");
        assert!(b.try_take_borrowing(1000, 1000));
    }

    #[test]
    fn transfers_wait_for_the_refill_and_the_rate_is_kept() {
        let mut b = Bucket::new(1000, 2000, 0);
        assert!(b.try_take(2000, 0));
        assert!(!b.try_take(1000, 500), "half refilled");
        assert!(b.try_take(1000, 1000));
        b.charge(100, 1000);
        assert_eq!(b.level(), -100.0);
        b.refund(50, 1000);
        assert_eq!(b.level(), -50.0);
        // Over 10 s of trying every 10 ms, at most rate × 10 s + capacity bytes pass.
        let mut b = Bucket::new(1000, 2000, 0);
        let mut moved = 0;
        for t in (0..=10_000).step_by(10) {
            if b.try_take(700, t) {
                moved += 700;
            }
        }
        assert!(moved <= 1000 * 10 + 2000, "{moved}");
        assert!(moved >= 1000 * 10 - 700, "{moved}");
    }
}
