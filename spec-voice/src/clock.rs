//! The one clock of a voice session: time from its start, shared by everything on the session.
//!
//! The recognizer, the language model and the synthesizer all read and charge the same
//! [`Clock`] (clones share it), so a partial transcript, a guessed sentence and the first audio
//! are stamped on one timeline with nothing to convert. On the wall clock time is real; on the
//! simulated clock a recording replays in compute time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How time runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockKind {
    /// Real time: audio arrives as it is spoken, and waiting is sleeping.
    Wall,
    /// Compute time: time advances by the measured compute charged to it and jumps forward when
    /// everything is idle, so every latency is real measured compute while a recording replays
    /// as fast as the machine allows.
    Simulated,
}

/// A session's clock: time since it started. Clones share the time (a simulated clock's time
/// charged through one clone is seen by all), so a pipeline hands its clock to every part.
#[derive(Clone, Debug)]
pub struct Clock(Time);

#[derive(Clone, Debug)]
enum Time {
    Wall(Instant),
    /// Nanoseconds since the start.
    Simulated(Arc<AtomicU64>),
}

impl Clock {
    /// A clock of `kind` at zero now.
    pub fn start(kind: ClockKind) -> Self {
        match kind {
            ClockKind::Wall => Self(Time::Wall(Instant::now())),
            ClockKind::Simulated => Self(Time::Simulated(Arc::new(AtomicU64::new(0)))),
        }
    }

    /// A simulated clock at zero.
    pub fn simulated() -> Self {
        Self::start(ClockKind::Simulated)
    }

    /// A wall clock at zero now.
    pub fn wall() -> Self {
        Self::start(ClockKind::Wall)
    }

    pub fn kind(&self) -> ClockKind {
        match self.0 {
            Time::Wall(_) => ClockKind::Wall,
            Time::Simulated(_) => ClockKind::Simulated,
        }
    }

    pub fn is_simulated(&self) -> bool {
        self.kind() == ClockKind::Simulated
    }

    /// Time since the start.
    pub fn now(&self) -> Duration {
        match &self.0 {
            Time::Wall(start) => start.elapsed(),
            Time::Simulated(nanos) => Duration::from_nanos(nanos.load(Ordering::Acquire)),
        }
    }

    /// Compute was spent: a simulated clock advances by it (a wall clock has seen it pass).
    pub fn charge(&self, compute: Duration) {
        if let Time::Simulated(nanos) = &self.0 {
            let by = nanos_of(compute);
            // The closure always returns Some: the update cannot fail.
            let _ = nanos.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(by))
            });
        }
    }

    /// Nothing to do until `at`: a simulated clock jumps there (if it is later than now), a
    /// wall clock sleeps until then.
    pub fn wait_until(&self, at: Duration) {
        match &self.0 {
            Time::Simulated(nanos) => {
                nanos.fetch_max(nanos_of(at), Ordering::AcqRel);
            }
            Time::Wall(start) => std::thread::sleep(at.saturating_sub(start.elapsed())),
        }
    }
}

/// `duration` in nanoseconds, saturating at `u64::MAX` (584 years).
fn nanos_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn a_simulated_clock_advances_by_compute_and_jumps_when_waiting() {
        let clock = Clock::simulated();
        assert_eq!(clock.kind(), ClockKind::Simulated);
        assert_eq!(clock.now(), Duration::ZERO);
        clock.charge(ms(300));
        clock.wait_until(ms(200));
        assert_eq!(clock.now(), ms(300));
        clock.wait_until(ms(1000));
        assert_eq!(clock.now(), ms(1000));
        clock.charge(ms(50));
        assert_eq!(clock.now(), ms(1050));
        clock.charge(Duration::MAX);
        assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn clones_share_one_time() {
        let clock = Clock::simulated();
        let model = clock.clone();
        model.charge(ms(40));
        assert_eq!(clock.now(), ms(40));
        clock.wait_until(ms(500));
        assert_eq!(model.now(), ms(500));
        // A new clock is a new session.
        assert_eq!(Clock::simulated().now(), Duration::ZERO);
    }

    #[test]
    fn a_wall_clock_is_real_time() {
        let clock = Clock::wall();
        assert_eq!(clock.kind(), ClockKind::Wall);
        let before = clock.now();
        clock.charge(Duration::from_secs(3600));
        assert!(
            clock.now() < Duration::from_secs(60),
            "charging moves no wall clock"
        );
        clock.wait_until(before + ms(20));
        assert!(clock.now() >= before + ms(20));
        let clone = clock.clone();
        let (a, b) = (clock.now(), clone.now());
        assert!(b >= a && b - a < Duration::from_secs(1));
    }
}
