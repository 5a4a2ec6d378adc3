//! `streaming_etl_checkpoint()` (also `CALL streaming_etl_checkpoint()`): one row per job and
//! partition of the checkpoint, read without changing it: next offset, partition and global
//! watermarks, open windows, output not yet confirmed in DuckDB, last update, and the lag where
//! the source knew its end offset (bytes for files, messages for Kafka).

use std::sync::Arc;

use crate::checkpoint::{inspect, CheckpointRow};
use crate::error::Result;
use crate::ffi::{Arg, Args, ColType, Output, TableFunction};
use crate::host::Host;
use crate::params::{checkpoint_location, CheckpointLocation};

pub struct CheckpointFunction;

pub struct Inspect {
    location: CheckpointLocation,
    job: Option<String>,
}

pub struct Rows {
    rows: Vec<CheckpointRow>,
    next: usize,
}

impl TableFunction for CheckpointFunction {
    type Bind = Inspect;
    type State = Rows;
    const NAME: &'static str = "streaming_etl_checkpoint";
    const PARAMETERS: &'static [ColType] = &[];
    const NAMED_PARAMETERS: &'static [(&'static str, ColType)] =
        &[("checkpoint", ColType::Varchar), ("job", ColType::Varchar)];
    const COLUMNS: &'static [(&'static str, ColType)] = &[
        ("job", ColType::Varchar),
        ("topic", ColType::Varchar),
        ("partition", ColType::Integer),
        ("file", ColType::Varchar),
        ("next_offset", ColType::BigInt),
        ("max_event_time_ms", ColType::BigInt),
        ("partition_watermark_ms", ColType::BigInt),
        ("global_watermark_ms", ColType::BigInt),
        ("open_windows", ColType::BigInt),
        ("pending_batches", ColType::BigInt),
        ("end_offset", ColType::BigInt),
        ("lag", ColType::BigInt),
        ("window_ms", ColType::BigInt),
        ("lateness_ms", ColType::BigInt),
        ("last_update_ms", ColType::BigInt),
    ];

    fn bind(args: &dyn Args, host: &Arc<Host>) -> Result<Self::Bind> {
        crate::testing::panic_point("checkpoint-bind");
        let job = match args.named("job") {
            Some(Arg::Text(j)) => Some(j),
            _ => None,
        };
        Ok(Inspect {
            location: checkpoint_location(args, host.db_path())?,
            job,
        })
    }

    fn init(bind: &Self::Bind, host: &Arc<Host>) -> Result<Self::State> {
        Ok(Rows {
            rows: inspect(&bind.location, host, bind.job.as_deref())?,
            next: 0,
        })
    }

    fn produce(_bind: &Self::Bind, state: &mut Self::State, out: &mut Output<'_>) -> Result<()> {
        let rows = &state.rows[state.next..];
        let n = rows.len().min(out.capacity());
        for (i, r) in rows[..n].iter().enumerate() {
            out.set_str(0, i, Some(&r.job));
            out.set_str(1, i, Some(&r.source));
            out.set_i32(2, i, r.partition);
            out.set_str(3, i, r.name.as_deref());
            out.set_i64(4, i, r.next_offset);
            out.set_i64(5, i, r.max_event_time_ms);
            out.set_i64(6, i, r.partition_watermark_ms);
            out.set_i64(7, i, r.global_watermark_ms);
            out.set_i64(8, i, Some(r.open_windows));
            out.set_i64(9, i, Some(r.pending_batches));
            out.set_i64(10, i, r.end_offset);
            out.set_i64(11, i, r.lag);
            out.set_i64(12, i, Some(r.window_ms));
            out.set_i64(13, i, Some(r.lateness_ms));
            out.set_i64(14, i, Some(r.last_update_ms));
        }
        out.set_len(n);
        state.next += n;
        Ok(())
    }
}
