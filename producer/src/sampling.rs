//! Sampling: when the sensors sample and how their events reach the hub.
//!
//! The sensors of one period form a group, and one task per group samples all of them on
//! each tick of the period's clock ([`tick::Clock`], one wake-up a tick): every sensor of the
//! group gets the same `now`, and their events go into the hub in one publish, so the
//! subscriptions wake once a tick and a subscriber gets the tick in one message. Each sensor
//! sampling in a task of its own cost the agent ten task wake-ups, ten `select!`s and ten
//! publishes a tick (docs/PERFORMANCE.md, "One task a tick").
//!
//! A sensor keeps a task of its own ([`sensor_loop`]) that follows its setting (period,
//! enabled: it moves the sensor between groups), takes its first sample as it starts, and
//! takes the samples that may block (host commands) off the async workers when the group
//! hands them over. That task wakes only for those, not on every tick.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gma_core::event::EventData;
use gma_core::rpc::RpcStats;
use gma_core::time::now_ns;
use gma_sensors::{AgentCounters, Sensor, SensorError};
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use crate::control;
use crate::hub::Hub;
use crate::tick;

/// The groups of one producer, by period.
pub(crate) struct Sampling {
    /// A group's task removes the group, under this lock, at the first tick that finds it
    /// without members; a member joins under the same lock, so it never joins a group whose
    /// task has ended.
    groups: Mutex<HashMap<Duration, Arc<Group>>>,
    hub: Arc<Hub>,
    /// Marked as each tick starts, before its sensors sample: `gma.agent` reports the samples
    /// of whole ticks ([`AgentCounters::mark_tick`]).
    counters: Arc<AgentCounters>,
    /// Set when the producer stops: no group samples after it.
    stop: watch::Receiver<bool>,
}

/// The sensors of one period.
#[derive(Default)]
struct Group {
    members: Mutex<Vec<Arc<Member>>>,
}

/// One sensor (or the producer's own RPC figures) as its group samples it.
struct Member {
    name: String,
    /// `None` while a sample that may block runs off the async workers.
    sampler: Mutex<Option<Sampler>>,
    /// The sensor's cost as the control service reports it (none for `gma.rpc`, not a sensor).
    slot: Option<Arc<control::Slot>>,
    errors: AtomicU64,
    /// A sample the group could not take itself (it may block, or one is running): the
    /// member's own task takes it. One stored permit: ticks missed meanwhile count as one.
    due: Notify,
}

enum Sampler {
    Sensor(Box<dyn Sensor>),
    /// `gma.rpc`: one event per RPC method of the producer for the period just ended.
    Rpc {
        stats: Arc<RpcStats>,
        source: String,
    },
}

impl Sampler {
    fn blocking(&self) -> bool {
        match self {
            Sampler::Sensor(s) => s.blocking(),
            Sampler::Rpc { .. } => false,
        }
    }

    fn sample(&mut self, now: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
        match self {
            Sampler::Sensor(s) => s.sample(now, out),
            Sampler::Rpc { stats, source } => {
                out.extend(stats.events(source, now));
                Ok(())
            }
        }
    }
}

impl Member {
    fn new(name: String, sampler: Sampler, slot: Option<Arc<control::Slot>>) -> Arc<Member> {
        Arc::new(Member {
            name,
            sampler: Mutex::new(Some(sampler)),
            slot,
            errors: AtomicU64::new(0),
            due: Notify::new(),
        })
    }

    /// Samples into `out` (after what it holds), unless the sample may block or one is
    /// already running off the async workers: then returns false and leaves it.
    fn sample_here(&self, now: i64, out: &mut Vec<EventData>, counters: &AgentCounters) -> bool {
        let mut sampler = self.sampler.lock();
        let Some(s) = sampler.as_mut().filter(|s| !s.blocking()) else {
            return false;
        };
        let from = out.len();
        let began = std::time::Instant::now();
        let r = s.sample(now, out);
        drop(sampler);
        self.account(r, &out[from..], began.elapsed(), counters);
        true
    }

    /// Counts a sample that gave `events` and took `took`, and logs its error.
    fn account(
        &self,
        r: Result<(), SensorError>,
        events: &[EventData],
        took: Duration,
        counters: &AgentCounters,
    ) {
        let Some(slot) = &self.slot else {
            // gma.rpc: the producer's own figures, not sampled values.
            return;
        };
        slot.record(took);
        match r {
            Ok(()) => {
                let values: usize = events.iter().map(|e| e.numbers.len() + e.strings.len()).sum();
                counters.values.fetch_add(values as u64, Ordering::Relaxed);
                counters.events.fetch_add(events.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                let errors = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
                metrics::counter!(crate::telemetry::SENSOR_ERRORS).increment(1);
                // Log the first error and then one in a hundred: a broken probe must not flood.
                if errors == 1 || errors.is_multiple_of(100) {
                    tracing::warn!(sensor = %self.name, errors, error = %e, "sensor sample failed");
                }
            }
        }
    }
}

impl Sampling {
    pub(crate) fn new(
        hub: Arc<Hub>,
        counters: Arc<AgentCounters>,
        stop: watch::Receiver<bool>,
    ) -> Arc<Sampling> {
        Arc::new(Sampling {
            groups: Mutex::new(HashMap::new()),
            hub,
            counters,
            stop,
        })
    }

    /// Adds `member` to the group of `period`, starting the group's task if none runs.
    fn join(self: &Arc<Self>, period: Duration, member: Arc<Member>) {
        let mut groups = self.groups.lock();
        if let Some(g) = groups.get(&period) {
            g.members.lock().push(member);
            return;
        }
        let group = Arc::new(Group::default());
        group.members.lock().push(member);
        groups.insert(period, group.clone());
        drop(groups);
        tokio::spawn(self.clone().run(period, group));
    }

    fn leave(&self, period: Duration, member: &Arc<Member>) {
        if let Some(g) = self.groups.lock().get(&period) {
            g.members.lock().retain(|m| !Arc::ptr_eq(m, member));
        }
    }

    /// Publishes `stats` as `gma.rpc` events (source `<source>/<method>`) every `period`,
    /// with the sensors of that period: no clock of its own, and its events go out in the
    /// tick's write. A period in which no method was called publishes nothing.
    pub(crate) fn publish_rpc(self: &Arc<Self>, stats: Arc<RpcStats>, source: String, period: Duration) {
        let member = Member::new(
            gma_core::rpc::RPC_EVENT.to_string(),
            Sampler::Rpc { stats, source },
            None,
        );
        self.join(period, member);
    }

    /// The task of the group of `period`: samples its members on every tick until the group
    /// has none left or the producer stops.
    async fn run(self: Arc<Self>, period: Duration, group: Arc<Group>) {
        let mut at = aligned_tick(period);
        if at <= tokio::time::Instant::now() {
            // A sensor samples once as it starts: no tick at the same instant.
            at += period;
        }
        // A late tick (a slow start, a busy host) does not move the later ones: they stay on
        // the shared instants. A kernel timer on Linux: one wake-up a tick (tick.rs).
        let mut clock = tick::Clock::new(at, period);
        let mut buf = Vec::new();
        loop {
            clock.tick().await;
            if *self.stop.borrow() {
                return;
            }
            {
                let mut groups = self.groups.lock();
                if group.members.lock().is_empty() {
                    groups.remove(&period);
                    return;
                }
            }
            self.counters.mark_tick();
            let now = now_ns();
            buf.clear();
            for m in group.members.lock().iter() {
                if !m.sample_here(now, &mut buf, &self.counters) {
                    m.due.notify_one();
                }
            }
            self.publish(&buf);
        }
    }

    fn publish(&self, events: &[EventData]) {
        if events.is_empty() {
            return;
        }
        if let (_, Err(e)) = self.hub.publish(events) {
            // The valid events are published; this names the first event that was not.
            tracing::warn!(error = %e, "a sensor produced a nonconforming event");
        }
    }

    /// Takes one sample of `member` now, off the async workers when it may block, and
    /// publishes it. Returns false when the sample panicked (the sensor is gone).
    async fn sample_now(&self, member: &Member) -> bool {
        let mut buf = Vec::new();
        let now = now_ns();
        if member.sample_here(now, &mut buf, &self.counters) {
            self.publish(&buf);
            return true;
        }
        // Only this task takes the sampler out: it is there, and its sample may block.
        let Some(mut sampler) = member.sampler.lock().take() else {
            return true;
        };
        // It runs host commands (each bounded by its timeout): off the async workers. The
        // group meanwhile finds no sampler and leaves the next sample to this task.
        let began = std::time::Instant::now();
        let job = move || {
            let r = sampler.sample(now, &mut buf);
            (sampler, buf, r)
        };
        match tokio::task::spawn_blocking(job).await {
            Ok((s, buf, r)) => {
                *member.sampler.lock() = Some(s);
                member.account(r, &buf, began.elapsed(), &self.counters);
                self.publish(&buf);
                true
            }
            Err(e) => {
                tracing::error!(sensor = %member.name, error = %e, "sensor sample panicked; the sensor stops");
                false
            }
        }
    }
}

/// Runs one sensor: its first sample as it starts (host.info's period is long: a broker must
/// not wait a period for a new host's software), then with its group, in the group of its
/// period while enabled. Ends when the producer stops or its setting's sender is dropped (the
/// control removed the sensor: a runtime watch).
pub(crate) async fn sensor_loop(
    sensor: Box<dyn Sensor>,
    slot: Arc<control::Slot>,
    mut setting: watch::Receiver<control::Setting>,
    sampling: Arc<Sampling>,
) {
    let member = Member::new(sensor.name().to_string(), Sampler::Sensor(sensor), Some(slot));
    let mut stop = sampling.stop.clone();
    let mut cur = *setting.borrow_and_update();
    let mut joined: Option<Duration> = None;
    let mut due = cur.enabled;
    loop {
        if due && !*stop.borrow() && !sampling.sample_now(&member).await {
            break;
        }
        let want = cur.enabled.then_some(cur.period);
        if want != joined {
            if let Some(p) = joined {
                sampling.leave(p, &member);
            }
            if let Some(p) = want {
                // The next sample is at most one period away, in step with the other sensors
                // of the period.
                sampling.join(p, member.clone());
            }
            joined = want;
        }
        tokio::select! {
            () = member.due.notified() => due = cur.enabled,
            changed = setting.changed() => {
                if changed.is_err() {
                    break;
                }
                let next = *setting.borrow_and_update();
                // Enabled again: it samples at once, as it missed the ticks meanwhile.
                due = next.enabled && !cur.enabled;
                cur = next;
            }
            _ = stop.changed() => break,
        }
    }
    if let Some(p) = joined {
        sampling.leave(p, &member);
    }
}

/// The first tick of a sensor sampled every `period`: the next multiple of `period` since the
/// first sensor of this process started. Groups of different periods then tick at the same
/// instants (the 1 s sensors and the 10 s `gma.rpc` every tenth second): one timer wake-up for
/// both, and a subscriber gets their events in one batch (one gRPC message, one write) — the
/// agent's cost per value delivered (docs/PERFORMANCE.md, "The agent").
fn aligned_tick(period: Duration) -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let now = tokio::time::Instant::now();
    let epoch = *EPOCH.get_or_init(|| now);
    if now <= epoch {
        // The first sensor, or a runtime whose clock is behind the first one's (a test's
        // paused clock): sample now.
        return now;
    }
    let p = period.as_nanos().max(1);
    let since = now.saturating_duration_since(epoch).as_nanos();
    let k = since.div_ceil(p);
    let at = u64::try_from(k.saturating_mul(p)).unwrap_or(u64::MAX);
    epoch + Duration::from_nanos(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::tests::schema;
    use gma_proto::v1 as pb;

    /// A sensor that records the instant and the thread of every sample.
    struct Probe {
        name: String,
        blocking: bool,
        samples: Arc<Mutex<Vec<(i64, std::thread::ThreadId)>>>,
    }

    impl Sensor for Probe {
        fn name(&self) -> &str {
            &self.name
        }
        fn schemas(&self) -> Vec<pb::EventSchema> {
            vec![schema()]
        }
        fn period(&self) -> Duration {
            Duration::from_millis(5)
        }
        fn blocking(&self) -> bool {
            self.blocking
        }
        fn sample(&mut self, now: i64, out: &mut Vec<EventData>) -> Result<(), SensorError> {
            self.samples.lock().push((now, std::thread::current().id()));
            out.push(EventData {
                name: "t.x".into(),
                source: self.name.clone(),
                timestamp_ns: now,
                numbers: vec![1.0],
                strings: vec![],
            });
            Ok(())
        }
    }

    type Samples = Arc<Mutex<Vec<(i64, std::thread::ThreadId)>>>;

    struct Kit {
        hub: Arc<Hub>,
        control: Arc<control::Control>,
        sampling: Arc<Sampling>,
        stop: watch::Sender<bool>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Kit {
        fn new() -> Kit {
            let hub = Hub::new(1, 100_000);
            hub.add_schemas(&[schema()]).unwrap();
            let control =
                control::Control::new(hub.clone(), "h".into(), Duration::from_millis(5), None, None).unwrap();
            let (stop, stop_rx) = watch::channel(false);
            let sampling = Sampling::new(hub.clone(), Arc::new(AgentCounters::default()), stop_rx);
            Kit {
                hub,
                control,
                sampling,
                stop,
                tasks: Vec::new(),
            }
        }

        /// Starts sensor `name` sampled every `ms`; returns what it samples.
        fn sensor(&mut self, name: &str, ms: u64, blocking: bool) -> Samples {
            let samples = Samples::default();
            let probe = Probe {
                name: name.into(),
                blocking,
                samples: samples.clone(),
            };
            let (slot, setting) = self.control.register(name, Duration::from_millis(ms));
            self.tasks.push(tokio::spawn(sensor_loop(
                Box::new(probe),
                slot,
                setting,
                self.sampling.clone(),
            )));
            samples
        }

        fn periods(&self) -> Vec<u128> {
            let mut p: Vec<u128> = self
                .sampling
                .groups
                .lock()
                .keys()
                .map(Duration::as_millis)
                .collect();
            p.sort_unstable();
            p
        }

        /// The events of `source` in the hub.
        fn published(&self, source: &str) -> usize {
            let inner = self.hub.lock();
            inner
                .since(0)
                .filter(|e| inner.series[e.series as usize].source == source)
                .count()
        }
    }

    /// Waits for `done` (checked every millisecond) until a generous deadline.
    async fn wait_until(mut done: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done() {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }

    fn instants(s: &Samples) -> Vec<i64> {
        s.lock().iter().map(|(t, _)| *t).collect()
    }

    /// The sensors of one period sample on the same ticks at the same instant, one group per
    /// period; a sensor follows its setting from group to group, samples at once when enabled
    /// again, and a group goes away with its last sensor.
    #[tokio::test(flavor = "current_thread")]
    async fn sensors_of_a_period_sample_together_and_follow_their_setting() {
        let mut kit = Kit::new();
        let a = kit.sensor("a", 5, false);
        let b = kit.sensor("b", 5, false);
        let c = kit.sensor("c", 7, false);
        assert!(wait_until(|| a.lock().len() >= 4 && c.lock().len() >= 3).await);
        assert_eq!(kit.periods(), [5, 7], "one group per period");
        // After its first sample (taken as it started), each tick samples a and b at one
        // instant, in one publish.
        let (ta, tb) = (instants(&a), instants(&b));
        assert_eq!(
            ta[1..],
            tb[1..],
            "a and b sample on the same ticks, at the same instant"
        );
        assert_eq!(kit.published("a"), ta.len());
        assert_eq!(kit.published("b"), tb.len());

        // Disabled, a leaves its group; b keeps sampling.
        kit.control.set_enabled("a", false).await.unwrap();
        let n = a.lock().len();
        let m = b.lock().len();
        assert!(wait_until(|| b.lock().len() >= m + 3).await);
        assert!(
            a.lock().len() <= n + 1,
            "a disabled stops sampling (a tick in flight at most)"
        );
        // Without sensors, the group of 5 ms ends at its next tick.
        kit.control.set_enabled("b", false).await.unwrap();
        assert!(wait_until(|| kit.periods() == [7]).await, "{:?}", kit.periods());

        // Enabled again, a samples at once and then with its group.
        let n = a.lock().len();
        kit.control.set_enabled("a", true).await.unwrap();
        assert!(wait_until(|| a.lock().len() > n).await);
        assert_eq!(kit.periods(), [5, 7]);

        // At 7 ms, a samples with c.
        kit.control.set_period("a", 7).await.unwrap();
        let n = a.lock().len();
        assert!(wait_until(|| a.lock().len() >= n + 3).await);
        let tc = instants(&c);
        let moved = instants(&a)[n + 1..].to_vec();
        assert!(
            moved.iter().all(|t| tc.contains(t)),
            "a samples on c's ticks: {moved:?} {tc:?}"
        );
        assert!(
            wait_until(|| kit.periods() == [7]).await,
            "the 5 ms group ended: {:?}",
            kit.periods()
        );

        // Stopped, every sensor's task ends.
        kit.stop.send_replace(true);
        for t in std::mem::take(&mut kit.tasks) {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .unwrap()
                .unwrap();
        }
    }

    /// A sample that may block runs off the async workers, handed over by its group's ticks,
    /// and is published.
    #[tokio::test(flavor = "current_thread")]
    async fn a_sample_that_may_block_runs_off_the_workers() {
        let mut kit = Kit::new();
        let here = std::thread::current().id();
        let slow = kit.sensor("slow", 5, true);
        let fast = kit.sensor("fast", 5, false);
        assert!(wait_until(|| slow.lock().len() >= 4).await);
        let slow = slow.lock().clone();
        assert!(
            slow.iter().all(|(_, th)| *th != here),
            "every blocking sample off the runtime's thread"
        );
        assert!(
            fast.lock().iter().all(|(_, th)| *th == here),
            "the others sampled by the group"
        );
        assert_eq!(kit.published("slow"), slow.len());
    }
}
