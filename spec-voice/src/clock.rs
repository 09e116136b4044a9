//! A simulated clock for replaying speech in compute time.

use std::time::Duration;

/// A simulated clock: time advances by measured compute, and jumps forward when idle, so a
/// benchmark costs compute time, not speaking time.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimClock {
    now: Duration,
}

impl SimClock {
    /// A clock at zero, the start of a turn.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current simulated time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// Moves time forward by `by` (compute spent).
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now.saturating_add(by);
    }

    /// Jumps to `t` if it is later than now.
    pub fn wait_until(&mut self, t: Duration) {
        self.now = self.now.max(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    #[test]
    fn sim_clock_advances_and_waits() {
        let mut clock = SimClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(ms(300));
        clock.wait_until(ms(200));
        assert_eq!(clock.now(), ms(300));
        clock.wait_until(ms(1000));
        assert_eq!(clock.now(), ms(1000));
        clock.advance(ms(50));
        assert_eq!(clock.now(), ms(1050));
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), Duration::MAX);
    }
}
