//! Sample counts and stream time at any sample rate, in exact integer arithmetic: at 16 kHz a
//! sample is 62.5 µs, so `duration_of(a) + duration_of(b) == duration_of(a + b)` and stream
//! times counted in samples compare exactly.

use std::time::Duration;

const NANOS_PER_SECOND: u128 = 1_000_000_000;

/// Samples in `duration` at `sample_rate`, to the nearest sample.
pub fn samples_in(duration: Duration, sample_rate: u32) -> usize {
    let scaled = duration.as_nanos() * u128::from(sample_rate);
    usize::try_from((scaled + NANOS_PER_SECOND / 2) / NANOS_PER_SECOND).unwrap_or(usize::MAX)
}

/// How long `samples` last at `sample_rate`, to the nearest nanosecond (zero at a zero rate).
pub fn duration_of(samples: usize, sample_rate: u32) -> Duration {
    if sample_rate == 0 {
        return Duration::ZERO;
    }
    let rate = u128::from(sample_rate);
    let nanos = (samples as u128 * NANOS_PER_SECOND + rate / 2) / rate;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_kilohertz_is_exact_both_ways() {
        assert_eq!(samples_in(Duration::from_millis(700), 16_000), 11_200);
        assert_eq!(duration_of(11_200, 16_000), Duration::from_millis(700));
        assert_eq!(duration_of(1, 16_000), Duration::from_nanos(62_500));
        for (a, b) in [(1, 2), (3, 17), (12_345, 678)] {
            assert_eq!(
                duration_of(a, 16_000) + duration_of(b, 16_000),
                duration_of(a + b, 16_000)
            );
        }
        for n in [0, 1, 7, 320, 16_001, 10_000_000] {
            assert_eq!(samples_in(duration_of(n, 16_000), 16_000), n);
        }
    }

    #[test]
    fn other_rates_round_to_the_nearest() {
        // 24 kHz: 41 666.67 ns a sample.
        assert_eq!(duration_of(1, 24_000), Duration::from_nanos(41_667));
        assert_eq!(duration_of(24_000, 24_000), Duration::from_secs(1));
        for n in [0, 1, 2, 5, 22_050, 1_000_003] {
            assert_eq!(samples_in(duration_of(n, 24_000), 24_000), n);
            assert_eq!(samples_in(duration_of(n, 22_050), 22_050), n);
        }
        assert_eq!(samples_in(Duration::from_micros(20), 24_000), 0);
        assert_eq!(samples_in(Duration::from_micros(21), 24_000), 1);
        assert_eq!(duration_of(5, 0), Duration::ZERO);
        assert_eq!(samples_in(Duration::from_secs(3), 0), 0);
    }
}
