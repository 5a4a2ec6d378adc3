//! The event-time core alone (file source → decode → watermarks → windows), without DuckDB or
//! SQLite: how fast the hot path is, for profiling (`perf record target/release/examples/engine_bench`).
//!
//! usage: engine_bench <glob> [window_ms] [lateness_ms] [hop_ms]; STREAMING_ETL_THREADS=n for
//! n threads (default 1)

use std::time::{Duration, Instant};

use streaming_etl_core::{
    read_cycle, Batch, CycleLimits, Engine, EngineConfig, FieldPath, FileOptions, FileSource,
    PartitionClock, PartitionProgress, Pool, ReadState, Restored, Source, Stop, TimeSpec,
    NO_WATERMARK,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(glob) = args.get(1) else {
        eprintln!("usage: engine_bench <glob> [window_ms] [lateness_ms]");
        std::process::exit(2);
    };
    let window_ms = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let lateness_ms = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(200);
    let hop_ms: Option<i64> = args.get(4).and_then(|a| a.parse().ok());
    let mut source = match FileSource::open("bench", glob, &[], None, FileOptions::default()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let field = |s: &str| FieldPath::parse(s).unwrap_or_else(|| std::process::exit(2));
    let mut cfg = EngineConfig::with_defaults(
        TimeSpec {
            window_ms,
            lateness_ms,
            idle_timeout_ms: None,
        },
        field("key"),
        field("event_time_ms"),
        &field("payload.value"),
    );
    if let Some(h) = hop_ms.filter(|&h| h < window_ms) {
        cfg.window = streaming_etl_core::WindowKind::Hopping { hop_ms: h };
    }
    let partitions = source
        .partitions()
        .iter()
        .map(|p| PartitionProgress {
            partition: p.partition,
            next_offset: p.start_offset,
            clock: PartitionClock::new(None, 0),
        })
        .collect();
    let restored = Restored {
        floor_ms: NO_WATERMARK,
        partitions,
        open_windows: None,
    };
    // STREAMING_ETL_THREADS=n: run on n threads (as DuckDB's `threads` sets a run's).
    let threads: usize = std::env::var("STREAMING_ETL_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let pool = std::sync::Arc::new(Pool::new(threads));
    let mut engine = match Engine::with_pool(&cfg, restored, 0, "bench", pool) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let mut state = ReadState::new(source.partitions().len());
    let mut batch = Batch::empty(&cfg.schemas());
    let (mut windows, mut late, mut dead) = (0usize, 0usize, 0usize);
    let start = Instant::now();
    loop {
        let limits = CycleLimits {
            remaining_messages: u64::MAX,
            max_cycle_messages: 200_000, // as the extension's sub-cycles
            cycle_deadline: Instant::now() + Duration::from_secs(1),
            run_deadline: None,
            max_pending_rows: 500_000,
            follow: false,
            rolling: false,
            quiet_flush_ms: None,
            interrupt: None,
        };
        let stop =
            read_cycle(&mut engine, &mut source, &mut state, &limits, &|| 0).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(1)
            });
        if let Err(e) = engine.take_output(&mut batch) {
            eprintln!("{e}");
            std::process::exit(1)
        }
        windows += batch.windows.len();
        late += batch.late.len();
        dead += batch.dead.len();
        if stop != Stop::CycleEnd {
            break;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let n = engine.counters().events_consumed;
    println!(
        "{n} events in {secs:.3} s = {:.0} events/s; {windows} windows, {late} late, {dead} dead, {} open",
        n as f64 / secs,
        engine.open_windows()
    );
}
