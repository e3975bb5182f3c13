//! The clock of a sampling period: one tick every period from a first instant on, a late tick
//! not moving the later ones (tokio's `MissedTickBehavior::Skip`).
//!
//! On Linux it is a kernel timer (`timerfd`, armed once with the period as its interval) read
//! through the runtime's reactor: the runtime wakes once a tick. tokio's timer wheel woke an
//! idle agent twice for every 1 s tick: its second level has 64 ms slots, and the driver wakes
//! at the start of the slot holding the deadline to move the entry down to the millisecond
//! level, then again at the deadline (docs/PERFORMANCE.md, "One wake-up a tick"). Elsewhere, or
//! when the kernel refuses a timer, it is tokio's interval.
//!
//! The kernel timer follows the real monotonic clock: a test that pauses tokio's clock
//! (`start_paused`, `time::advance`) does not drive it (none does; such a test would have to
//! sample with [`Clock::wheel`]).

use std::time::Duration;

use tokio::time::{Instant, Interval, MissedTickBehavior};

/// Ticks every `period` from a first instant on.
pub(crate) enum Clock {
    /// A `timerfd` with `period` as its interval, registered with the runtime's reactor.
    #[cfg(target_os = "linux")]
    Kernel {
        fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
        period: Duration,
    },
    /// tokio's timer wheel.
    Wheel(Interval),
}

impl Clock {
    /// Ticks at `first`, then every `period` (not zero) after it.
    pub(crate) fn new(first: Instant, period: Duration) -> Clock {
        #[cfg(target_os = "linux")]
        match kernel_timer(first, period) {
            Ok(fd) => return Clock::Kernel { fd, period },
            Err(e) => {
                tracing::debug!(error = %e, "no kernel timer for the sampling ticks; tokio's timer wheel ticks");
            }
        }
        Clock::wheel(first, period)
    }

    /// The same ticks on tokio's timer wheel.
    pub(crate) fn wheel(first: Instant, period: Duration) -> Clock {
        let mut tick = tokio::time::interval_at(first, period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        Clock::Wheel(tick)
    }

    /// Waits for the next tick; ticks missed meanwhile count as one.
    pub(crate) async fn tick(&mut self) {
        #[cfg(target_os = "linux")]
        if let Clock::Kernel { fd, period } = self {
            match read_expirations(fd).await {
                Ok(()) => return,
                Err(e) => {
                    // Not seen in practice (a timerfd read fails only with EAGAIN, handled):
                    // tick on from the wheel rather than stop sampling.
                    tracing::warn!(error = %e, "the sampling timer failed; tokio's timer wheel ticks from now on");
                    let period = *period;
                    *self = Clock::wheel(Instant::now() + period, period);
                }
            }
        }
        if let Clock::Wheel(tick) = self {
            tick.tick().await;
        }
    }
}

/// A non-blocking monotonic `timerfd` expiring first at `first` (at once when it is past),
/// then every `period`. Armed at an absolute time ([`monotonic_at`]): timers of different
/// periods whose ticks fall on the same instant (the 1 s sensors' and the 10 s `gma.rpc`
/// ticker's every tenth second) expire at the same nanosecond, in one run of the kernel's
/// timer interrupt, so the runtime wakes once for both and their events go out in one write.
/// Armed relative to "now", they expired microseconds apart: mostly still one wake-up, now and
/// then a second wake-up and write (docs/PERFORMANCE.md, "Ticks on one instant").
#[cfg(target_os = "linux")]
fn kernel_timer(
    first: Instant,
    period: Duration,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    use rustix::time::{
        timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    };
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    timerfd_settime(
        &fd,
        TimerfdTimerFlags::ABSTIME,
        &Itimerspec {
            it_interval: timespec(period),
            it_value: monotonic_at(first),
        },
    )?;
    // The safe constructor is deprecated since tokio 1.54 (tokio#8587) because an arbitrary
    // `AsRawFd` may change or close its descriptor under the reactor; its replacement is
    // `unsafe`, which this workspace forbids. An `OwnedFd` moved into the `AsyncFd` keeps the
    // one descriptor open for the `AsyncFd`'s whole life: the contract the unsafe one states.
    #[allow(deprecated)]
    tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)
}

/// `at` on `CLOCK_MONOTONIC`, for an absolute `timerfd`. `Instant` keeps that clock's reading
/// but does not show it: one pair of readings (an `Instant` and the clock's value), taken
/// once for the process, converts every `Instant`, so equal instants give equal times (two
/// readings per timer would differ by the nanoseconds between them). Never zero, which would
/// disarm the timer: a time in the past expires at once.
#[cfg(target_os = "linux")]
fn monotonic_at(at: Instant) -> rustix::time::Timespec {
    use rustix::time::{clock_gettime, ClockId};
    static ANCHOR: std::sync::OnceLock<(std::time::Instant, Duration)> = std::sync::OnceLock::new();
    let (instant, mono) = *ANCHOR.get_or_init(|| {
        // The clock read between two instants, paired with their midpoint.
        let before = std::time::Instant::now();
        let t = clock_gettime(ClockId::Monotonic);
        let after = std::time::Instant::now();
        let mono = Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        );
        (before + after.duration_since(before) / 2, mono)
    });
    let at = at.into_std();
    let d = match at.checked_duration_since(instant) {
        Some(after) => mono.saturating_add(after),
        None => mono.saturating_sub(instant.duration_since(at)),
    };
    timespec(d.max(Duration::from_nanos(1)))
}

#[cfg(target_os = "linux")]
fn timespec(d: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: d.subsec_nanos().into(),
    }
}

/// Waits until the timer has expired at least once and reads (resets) its expiration count.
#[cfg(target_os = "linux")]
async fn read_expirations(fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>) -> std::io::Result<()> {
    loop {
        let mut ready = fd.readable().await?;
        let mut count = [0u8; 8];
        match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut count)?)) {
            Ok(Ok(_)) => {
                // The count is read: nothing more to read until the next expiration, whose
                // readiness event tokio keeps (it clears only the event it handed out). Saves
                // a read that would fail with EAGAIN at the next tick.
                ready.clear_ready();
                return Ok(());
            }
            Ok(Err(e)) => return Err(e),
            // Not expired yet (EAGAIN): readiness cleared, wait again.
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel timer ticks at its first instant and then once a period, and ticks missed
    /// while nobody waited count as one (the next wait is a whole tick, not an instant).
    #[tokio::test(flavor = "current_thread")]
    async fn ticks_once_a_period_and_skips_missed_ticks() {
        let period = Duration::from_millis(20);
        let start = Instant::now();
        let mut clock = Clock::new(start + period, period);
        #[cfg(target_os = "linux")]
        assert!(matches!(clock, Clock::Kernel { .. }), "a timerfd on Linux");
        clock.tick().await;
        assert!(Instant::now() >= start + period, "not before its first instant");
        clock.tick().await;
        assert!(Instant::now() >= start + 2 * period, "the next one a period on");
        // Miss a few ticks: the next wait returns at once (the missed ones, counted as one),
        // and the one after is back on the period's instants.
        std::thread::sleep(3 * period);
        clock.tick().await;
        clock.tick().await;
        let after = Instant::now();
        let since_start = after.saturating_duration_since(start).as_nanos();
        assert!(
            since_start >= 6 * period.as_nanos(),
            "the tick after the missed ones is on a later instant of the period"
        );
    }

    /// Equal instants are equal times on the kernel's clock, and the times keep the instants'
    /// distances to the nanosecond, before and after the process's first reading.
    #[cfg(target_os = "linux")]
    #[test]
    fn instants_convert_to_the_monotonic_clock_exactly() {
        let ns = |t: rustix::time::Timespec| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
        let a = Instant::now();
        let first = ns(monotonic_at(a));
        assert_eq!(ns(monotonic_at(a)), first);
        for d in [1, 999_999_999, 1_000_000_000, 10_000_000_007u64] {
            let d = Duration::from_nanos(d);
            assert_eq!(ns(monotonic_at(a + d)) - first, d.as_nanos() as i128);
            if let Some(before) = a.checked_sub(d) {
                assert_eq!(first - ns(monotonic_at(before)), d.as_nanos() as i128);
            }
        }
    }

    /// The wheel ticks the same way (the fallback).
    #[tokio::test(flavor = "current_thread")]
    async fn the_wheel_ticks_at_its_first_instant_then_every_period() {
        let period = Duration::from_millis(5);
        let start = Instant::now();
        let mut clock = Clock::wheel(start + period, period);
        clock.tick().await;
        clock.tick().await;
        assert!(Instant::now() >= start + 2 * period);
    }
}
