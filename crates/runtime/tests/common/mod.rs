//! What the runtime's integration tests share: a clock that stands still, events, and a job.

use std::collections::BTreeMap;

use streaming_etl_core::{EngineConfig, FieldPath, TimeSpec};
use streaming_etl_runtime::clock::Clock;
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};
use streaming_etl_runtime::sink::Tables;

/// A clock that stands still, so ingest times are the same in every run.
pub struct FixedClock;

impl Clock for FixedClock {
    fn wall_ms(&self) -> i64 {
        1_700_000_000_000
    }
}

pub fn ev(key: &str, t: i64, v: f64) -> String {
    format!(r#"{{"key":"{key}","event_time_ms":{t},"payload":{{"value":{v}}}}}"#)
}

/// Three partitions of 300 messages: disorder (late events), bad lines (dead letters), keys in
/// several partitions; partition 1 is `behind_ms` behind the others in event time.
pub fn data(behind_ms: i64) -> Vec<Vec<String>> {
    (0..3)
        .map(|p| {
            (0..300)
                .map(|i| {
                    let t = 10_000 + i * 37 + p * 11 - if p == 1 { behind_ms } else { 0 };
                    if i % 61 == 5 {
                        "{bad".to_string()
                    } else if i % 17 == 3 {
                        ev(&format!("k{}", i % 4), t - 2500, i as f64)
                    } else {
                        ev(&format!("k{}", i % 4), t, i as f64 * 0.5)
                    }
                })
                .collect()
        })
        .collect()
}

/// The default job (key, event time, value), 100 ms lateness, flushed when caught up.
pub fn config(
    checkpoint: CheckpointLocation,
    max_messages: Option<u64>,
    window_ms: i64,
) -> JobConfig {
    let path = |p: &str| FieldPath::parse(p).unwrap();
    let engine = EngineConfig::with_defaults(
        TimeSpec {
            window_ms,
            lateness_ms: 100,
            idle_timeout_ms: None,
        },
        path("key"),
        path("event_time_ms"),
        &path("payload.value"),
    );
    JobConfig {
        settings: engine.job_settings("mem", BTreeMap::new()),
        job: "job".into(),
        source: "mem".into(),
        engine,
        tables: Tables {
            windows: "windows".into(),
            late: "late".into(),
            dead: "dead".into(),
        },
        checkpoint,
        max_messages,
        max_runtime_ms: None,
        checkpoint_interval_ms: 1000,
        flush: true,
        follow: false,
        rolling: false,
        quiet_flush_ms: None,
        threads: 1,
    }
}
