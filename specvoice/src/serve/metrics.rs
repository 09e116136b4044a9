//! What `/metrics` reports, in Prometheus' text format: requests and sessions, the engines and
//! the queue, tokens and speculation, and histograms of the latencies a user feels.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use spec_core::DecodeStats;

/// The endpoints counted in `specvoice_requests_total`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Endpoint {
    ChatCompletions,
    Transcriptions,
    Speech,
    Realtime,
    /// SpecVoice's own protocol (`/ws`).
    Native,
}

impl Endpoint {
    const ALL: [Self; 5] = [
        Self::ChatCompletions,
        Self::Transcriptions,
        Self::Speech,
        Self::Realtime,
        Self::Native,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat_completions",
            Self::Transcriptions => "transcriptions",
            Self::Speech => "speech",
            Self::Realtime => "realtime",
            Self::Native => "native",
        }
    }
}

/// Upper bounds of the latency histograms' buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0,
];

/// A cumulative histogram of durations.
#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, duration: Duration) {
        let seconds = duration.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, bucket) in BUCKETS.iter().zip(&self.buckets) {
            let n = bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// The server's counters.
#[derive(Default)]
pub(crate) struct Metrics {
    requests: [AtomicU64; Endpoint::ALL.len()],
    failed: [AtomicU64; Endpoint::ALL.len()],
    /// Requests refused for a missing or wrong key, or a foreign origin.
    refused: AtomicU64,
    /// Sessions and requests holding or waiting for an engine now.
    active: AtomicU64,
    generated_tokens: AtomicU64,
    generation_micros: AtomicU64,
    drafted_tokens: AtomicU64,
    accepted_tokens: AtomicU64,
    first_token: Histogram,
    turn_latency: Histogram,
}

/// Counts a session or request as active while it lives.
pub(crate) struct Active<'m>(&'m Metrics);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn request(&self, endpoint: Endpoint) -> Active<'_> {
        self.requests[endpoint as usize].fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
        Active(self)
    }

    pub fn failed(&self, endpoint: Endpoint) {
        self.failed[endpoint as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// An answer's decoding: its tokens, their time, and the speculation's drafts.
    pub fn decoded(&self, stats: &DecodeStats) {
        let add = |counter: &AtomicU64, n: usize| {
            counter.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed)
        };
        add(&self.generated_tokens, stats.generated_tokens);
        let micros = usize::try_from(stats.total_time.as_micros()).unwrap_or(usize::MAX);
        add(&self.generation_micros, micros);
        add(&self.drafted_tokens, stats.drafted_tokens());
        add(&self.accepted_tokens, stats.accepted_tokens());
    }

    /// Request to first streamed token of a chat completion.
    pub fn first_token(&self, after: Duration) {
        self.first_token.observe(after);
    }

    /// End of speech to first answer audio of a voice turn.
    pub fn turn_latency(&self, latency: Duration) {
        self.turn_latency.observe(latency);
    }

    /// The metrics in Prometheus' text format, with the pool's state.
    pub fn render(&self, engines_free: usize, queue_length: usize) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counter = |name: &str, help: &str, values: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in values {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let per_endpoint = |counters: &[AtomicU64]| -> Vec<(String, u64)> {
            Endpoint::ALL
                .iter()
                .map(|e| {
                    (
                        format!("{{endpoint=\"{}\"}}", e.label()),
                        load(&counters[*e as usize]),
                    )
                })
                .collect()
        };
        counter(
            "specvoice_requests_total",
            "Requests and sessions started, per endpoint.",
            &per_endpoint(&self.requests),
        );
        counter(
            "specvoice_failed_total",
            "Requests and sessions that ended in an error, per endpoint.",
            &per_endpoint(&self.failed),
        );
        counter(
            "specvoice_refused_total",
            "Requests refused for a missing or wrong API key or a foreign origin.",
            &[(String::new(), load(&self.refused))],
        );
        counter(
            "specvoice_generated_tokens_total",
            "Tokens the language model produced.",
            &[(String::new(), load(&self.generated_tokens))],
        );
        counter(
            "specvoice_drafted_tokens_total",
            "Draft tokens offered to verification (speculative decoding).",
            &[(String::new(), load(&self.drafted_tokens))],
        );
        counter(
            "specvoice_accepted_tokens_total",
            "Draft tokens verification accepted.",
            &[(String::new(), load(&self.accepted_tokens))],
        );
        let seconds = load(&self.generation_micros) as f64 / 1e6;
        let _ = writeln!(
            out,
            "# HELP specvoice_generation_seconds_total Time spent producing tokens (tokens/s = \
             generated_tokens_total / this).\n# TYPE specvoice_generation_seconds_total \
             counter\nspecvoice_generation_seconds_total {seconds}"
        );
        let gauges = [
            (
                "specvoice_active",
                "Sessions and requests in progress or waiting for an engine.",
                load(&self.active),
            ),
            (
                "specvoice_engines_free",
                "Engines no session holds.",
                engines_free as u64,
            ),
            (
                "specvoice_queue_length",
                "Sessions and requests waiting for an engine.",
                queue_length as u64,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        self.first_token.write(
            &mut out,
            "specvoice_first_token_seconds",
            "Chat completions: request to first token.",
        );
        self.turn_latency.write(
            &mut out,
            "specvoice_turn_latency_seconds",
            "Voice turns: end of speech to first answer audio.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_as_prometheus_text() {
        let metrics = Metrics::default();
        let active = metrics.request(Endpoint::ChatCompletions);
        metrics.request(Endpoint::Speech);
        metrics.failed(Endpoint::Speech);
        metrics.first_token(Duration::from_millis(30));
        metrics.first_token(Duration::from_millis(600));
        let text = metrics.render(0, 2);
        for line in [
            "specvoice_requests_total{endpoint=\"chat_completions\"} 1",
            "specvoice_failed_total{endpoint=\"speech\"} 1",
            "specvoice_active 1",
            "specvoice_queue_length 2",
            "specvoice_first_token_seconds_bucket{le=\"0.025\"} 0",
            "specvoice_first_token_seconds_bucket{le=\"0.05\"} 1",
            "specvoice_first_token_seconds_bucket{le=\"0.75\"} 2",
            "specvoice_first_token_seconds_bucket{le=\"+Inf\"} 2",
            "specvoice_first_token_seconds_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        drop(active);
        assert!(metrics
            .render(1, 0)
            .lines()
            .any(|l| l == "specvoice_active 0"));
    }
}
