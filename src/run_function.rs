//! `streaming_etl_run(topic, window_ms, lateness_ms, ...)`: runs a job until its source is
//! caught up or a limit is reached. It returns a row per checkpoint cycle (cumulative counts;
//! `status` says 'running' until the last row, whose totals are the run's): handing control back
//! to DuckDB between cycles is what lets Ctrl-C or a client's interrupt stop a long run, with
//! everything before the interrupt written and checkpointed.

use std::sync::Arc;

use crate::error::Result;
use crate::ffi::{Args, ColType, Output, TableFunction};
use crate::host::Host;
use crate::job::Run;
use crate::params::{parse_run, RunConfig, RUN_NAMED};

pub struct RunFunction;

pub struct RunState {
    run: Option<Run>,
}

impl TableFunction for RunFunction {
    type Bind = Arc<RunConfig>;
    type State = RunState;
    const NAME: &'static str = "streaming_etl_run";
    const PARAMETERS: &'static [ColType] = &[ColType::Varchar, ColType::BigInt, ColType::BigInt];
    const NAMED_PARAMETERS: &'static [(&'static str, ColType)] = RUN_NAMED;
    const COLUMNS: &'static [(&'static str, ColType)] = &[
        ("job", ColType::Varchar),
        ("events_consumed", ColType::BigInt),
        ("windows_emitted", ColType::BigInt),
        ("late_events", ColType::BigInt),
        ("dead_letters", ColType::BigInt),
        ("watermark_ms", ColType::BigInt),
        ("elapsed_ms", ColType::BigInt),
        ("events_per_sec", ColType::Double),
        ("open_windows", ColType::BigInt),
        ("partitions", ColType::BigInt),
        ("cycles", ColType::BigInt),
        ("status", ColType::Varchar),
    ];

    fn bind(args: &dyn Args, host: &Arc<Host>) -> Result<Self::Bind> {
        crate::testing::panic_point("bind");
        parse_run(args, host.db_path()).map(Arc::new)
    }

    fn init(bind: &Self::Bind, host: &Arc<Host>) -> Result<Self::State> {
        crate::testing::panic_point("init");
        Ok(RunState {
            run: Some(Run::start(Arc::clone(bind), host)?),
        })
    }

    fn produce(_bind: &Self::Bind, state: &mut Self::State, out: &mut Output<'_>) -> Result<()> {
        let Some(run) = state.run.as_mut() else {
            return Ok(());
        };
        let more = run.cycle()?;
        let s = run.stats();
        let n = |v: u64| Some(i64::try_from(v).unwrap_or(i64::MAX));
        out.set_str(0, 0, Some(&s.job));
        out.set_i64(1, 0, n(s.events_consumed));
        out.set_i64(2, 0, n(s.windows_emitted));
        out.set_i64(3, 0, n(s.late_events));
        out.set_i64(4, 0, n(s.dead_letters));
        out.set_i64(5, 0, s.watermark_ms);
        out.set_i64(6, 0, Some(s.elapsed_ms));
        out.set_f64(7, 0, Some(s.events_per_sec));
        out.set_i64(8, 0, n(s.open_windows));
        out.set_i64(9, 0, n(s.partitions));
        out.set_i64(10, 0, n(s.cycles));
        out.set_str(11, 0, Some(s.status));
        out.set_len(1);
        if !more {
            // Releases the job lock and the connection before DuckDB asks for the next chunk.
            state.run = None;
        }
        Ok(())
    }
}
