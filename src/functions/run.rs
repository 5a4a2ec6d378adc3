//! `streaming_etl_run(topic, window_ms, lateness_ms, ...)`: runs a job until its source is
//! caught up or a limit is reached. It returns a row per checkpoint cycle (cumulative counts;
//! `status` says 'running' until the last row, whose totals are the run's): handing control back
//! to DuckDB between cycles is what lets Ctrl-C or a client's interrupt stop a long run, with
//! everything before the interrupt written and checkpointed.

use std::collections::HashMap;
use std::error::Error;
use std::marker::PhantomData;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};

use duckdb::core::{DataChunkHandle, LogicalTypeHandle};
use duckdb::vtab::{BindInfo, InitInfo, TableFunctionInfo, VTab};
use streaming_etl_core::{
    Cell, ColumnType, EtlError, FileOptions, FileSource, Format, PartitionState, ResolverHandle,
    Result, Source,
};
use streaming_etl_runtime::checkpoint::Checkpoint;
use streaming_etl_runtime::clock::SystemClock;
use streaming_etl_runtime::config::{CheckpointLocation, JobConfig};
use streaming_etl_runtime::group::{GroupEnv, GroupRun};
use streaming_etl_runtime::job::{Run, RunEnv, RunStats, SourceOpener};
use streaming_etl_runtime::lock::JobLock;

use super::bound::{bind_run, single_sink, Form, RunBind};
use super::jobs::JOB_COLUMNS;
use super::result::{add_columns, write_row, ResultColumn};
use crate::host::connections::{Host, SharedConn};
use crate::host::entry;
use crate::host::resolver::DuckResolver;
use crate::host::sql_error::contained;
use crate::jobs::job::{now_ms, JobRow, JobSpec};
use crate::jobs::worker::{Runnable, Starter};
use crate::params::{RunPlan, SourceSpec, Start, RUN_PARAMS};
use crate::sink::catalog::OutputCatalog;
use crate::sink::partition_store::{windows_with_partition, LakeStore};
use crate::sink::sql_cycle::SqlOutput;
use crate::sink::staged::{staged_table, Staging};
use crate::source::kafka::{KafkaOptions, KafkaSource};
use crate::source::kafka_group::KafkaGroup;
use crate::source::registry::Registry;
use crate::sql::SqlJob;

fn count(v: u64) -> Cell<'static> {
    Cell::I64(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The result row of a run.
pub const RUN_COLUMNS: &[ResultColumn<RunStats>] = &[
    ResultColumn {
        name: "job",
        ty: ColumnType::Varchar,
        get: |s| Cell::Str(&s.job),
    },
    ResultColumn {
        name: "events_consumed",
        ty: ColumnType::BigInt,
        get: |s| count(s.events_consumed),
    },
    ResultColumn {
        name: "windows_emitted",
        ty: ColumnType::BigInt,
        get: |s| count(s.windows_emitted),
    },
    ResultColumn {
        name: "late_events",
        ty: ColumnType::BigInt,
        get: |s| count(s.late_events),
    },
    ResultColumn {
        name: "dead_letters",
        ty: ColumnType::BigInt,
        get: |s| count(s.dead_letters),
    },
    ResultColumn {
        name: "watermark_ms",
        ty: ColumnType::BigInt,
        get: |s| s.watermark_ms.map_or(Cell::Null, Cell::I64),
    },
    ResultColumn {
        name: "elapsed_ms",
        ty: ColumnType::BigInt,
        get: |s| Cell::I64(s.elapsed_ms),
    },
    ResultColumn {
        name: "events_per_sec",
        ty: ColumnType::Double,
        get: |s| Cell::F64(s.events_per_sec),
    },
    ResultColumn {
        name: "open_windows",
        ty: ColumnType::BigInt,
        get: |s| count(s.open_windows),
    },
    ResultColumn {
        name: "partitions",
        ty: ColumnType::BigInt,
        get: |s| count(s.partitions),
    },
    ResultColumn {
        name: "cycles",
        ty: ColumnType::BigInt,
        get: |s| count(s.cycles),
    },
    ResultColumn {
        name: "status",
        ty: ColumnType::Varchar,
        get: |s| Cell::Str(s.status),
    },
];

pub struct RunFunction<F: Form>(PhantomData<F>);

/// A run of either kind: one process's (state in the SQLite checkpoint) or a consumer group
/// member's (`subscribe`: state in the output catalog).
enum AnyRun {
    Single(Box<Run>),
    Group(Box<GroupRun>),
}

impl Runnable for AnyRun {
    fn cycle(&mut self) -> Result<bool> {
        match self {
            AnyRun::Single(r) => r.cycle(),
            AnyRun::Group(r) => r.cycle(),
        }
    }

    fn stats(&self) -> RunStats {
        match self {
            AnyRun::Single(r) => r.stats(),
            AnyRun::Group(r) => r.stats(),
        }
    }

    fn lag(&self) -> Option<i64> {
        match self {
            AnyRun::Single(r) => r.lag(),
            AnyRun::Group(r) => r.lag(),
        }
    }

    fn unreachable(&mut self) -> Option<String> {
        match self {
            AnyRun::Single(r) => r.unreachable(),
            AnyRun::Group(r) => r.unreachable(),
        }
    }

    fn threads(&self) -> usize {
        match self {
            AnyRun::Single(r) => r.threads(),
            AnyRun::Group(r) => r.threads(),
        }
    }

    fn interrupter(&self) -> Option<Arc<AtomicBool>> {
        match self {
            AnyRun::Single(r) => Some(r.interrupter()),
            AnyRun::Group(r) => Some(r.interrupter()),
        }
    }

    fn finish(&mut self) -> Result<()> {
        match self {
            AnyRun::Single(r) => r.finish(),
            // A member's cycle commits before it returns.
            AnyRun::Group(_) => Ok(()),
        }
    }
}

enum State {
    NotStarted,
    Running(AnyRun),
    Done,
}

pub struct RunInit {
    state: Mutex<State>,
}

/// Who a run's connection is lent to: a user's statement (it waits for a free one) or a
/// background job (it never waits, nor takes the last free one).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lender {
    Statement,
    Job,
}

impl Lender {
    fn checkout(self, host: &Arc<Host>) -> Result<crate::host::connections::PooledConn> {
        match self {
            Lender::Statement => host.checkout(),
            Lender::Job => {
                let pooled = host.checkout_for_job()?;
                // DuckDB's checkpoint threshold as the run starts: the WAL the jobs watch is
                // judged against it (see `jobs::wal`).
                let threshold = pooled.conn()?.query_row(
                    "SELECT current_setting('checkpoint_threshold')::VARCHAR",
                    [],
                    |r| r.get::<_, String>(0),
                );
                if let Ok(t) = threshold {
                    host.jobs().set_wal_threshold(&t);
                }
                Ok(pooled)
            }
        }
    }

    /// The run's threads: a statement's run takes DuckDB's `threads`; background jobs share
    /// them, a run starting while n jobs of the database run (itself included) taking 1/n of
    /// them, at least one (answers are the same at any thread count).
    fn threads(self, host: &Arc<Host>, mut job: JobConfig) -> JobConfig {
        if self == Lender::Job {
            let running = host.jobs().alive_besides(&job.job) + 1;
            job.threads = (job.threads / running).max(1);
        }
        job
    }
}

/// Opens what a run needs, in an order that never leaves a half-started job behind: the job's
/// lock first, then its checkpoint, then one of the extension's connections (waiting while all
/// are in use); the source opens inside `Run::start`, once the checkpoint says where to resume.
fn start(bound: &RunBind, host: &Arc<Host>, lender: Lender) -> Result<AnyRun> {
    let (plan, catalog, sql) = (&*bound.plan, &bound.catalog, bound.sql.as_deref());
    if plan.subscribe {
        return start_group(plan, catalog, sql, host, lender).map(|r| AnyRun::Group(Box::new(r)));
    }
    let job = &plan.job;
    let (lock, checkpoint) = match &job.checkpoint {
        CheckpointLocation::File(path) => {
            let lock = crate::host::os::lock_job_file(path, &job.job)?;
            (lock, Checkpoint::open_file(path)?)
        }
        CheckpointLocation::Memory => (
            JobLock::memory(host.memory_locks(), &job.job)?,
            host.memory_checkpoint()?,
        ),
    };
    let conn = SharedConn::new(lender.checkout(host)?);
    let job = lender.threads(host, with_resolver(job, &conn));
    let sink = single_sink(plan, catalog, sql, conn);
    Run::start(
        Arc::new(job),
        RunEnv {
            checkpoint,
            lock,
            sink: Box::new(sink),
            open_source: source_opener(plan),
            clock: Arc::new(SystemClock),
        },
    )
    .map(|r| AnyRun::Single(Box::new(r)))
}

/// The job, with DuckDB converting the values of its typed columns the core cannot, on the
/// run's connection.
fn with_resolver(job: &JobConfig, conn: &SharedConn) -> JobConfig {
    let mut job = job.clone();
    if !job.engine.columns.is_empty() {
        job.engine.resolver = ResolverHandle(Some(DuckResolver::new(conn.clone())));
    }
    job
}

/// A consumer group member: no checkpoint file and no job lock (several processes run the
/// job); its partitions' state is claimed from and committed to the output catalog.
fn start_group(
    plan: &RunPlan,
    catalog: &OutputCatalog,
    sql: Option<&SqlJob>,
    host: &Arc<Host>,
    lender: Lender,
) -> Result<GroupRun> {
    let job = &plan.job;
    let conn = SharedConn::new(lender.checkout(host)?);
    let job = &lender.threads(host, with_resolver(job, &conn));
    let windows = windows_with_partition(&job.engine.schemas().windows);
    // A job written as SQL stages its statements' events (their outputs say where).
    let staging = Staging::of(
        &job.engine,
        staged_table(&plan.tables.windows).sql(),
        &windows,
        true,
    )
    .filter(|_| sql.is_none());
    let store = LakeStore::new(
        conn,
        &job.job,
        &job.settings,
        plan.write_mode,
        &plan.tables,
        catalog.clone(),
        plan.compaction,
    )
    .with_staging(staging)
    .with_sql(SqlOutput::for_job(sql, &job.engine, true))
    .with_owner(super::bound::owner(plan));
    let SourceSpec::Kafka { topic } = &plan.source else {
        return Err(EtlError::Internal("subscribe without a Kafka topic".into()));
    };
    let (topic, kafka, follow, start_at) =
        (topic.clone(), plan.kafka.clone(), job.follow, plan.start);
    let registry = registry(plan)?;
    let source_name = job.source.clone();
    let clock = SystemClock;
    let owner = format!(
        "{} pid {} run {}",
        host_name(),
        std::process::id(),
        streaming_etl_runtime::clock::Clock::wall_ms(&clock)
    );
    GroupRun::start(
        Arc::new(job.clone()),
        GroupEnv {
            store: Box::new(store),
            open_group: Box::new(move |claimer| {
                Ok(Box::new(KafkaGroup::open(
                    &source_name,
                    &topic,
                    &kafka,
                    follow,
                    start_at,
                    claimer,
                    registry.clone(),
                )?)
                    as Box<dyn streaming_etl_runtime::group::GroupSource>)
            }),
            clock: Arc::new(SystemClock),
            owner,
        },
    )
}

/// This machine's name, for the owner column of the state rows.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// The schema registry client of a run that reads Avro or Protobuf from Kafka, filling the
/// cache the run's decoders read.
fn registry(plan: &RunPlan) -> Result<Option<Arc<Registry>>> {
    let Some(params) = &plan.kafka.registry else {
        return Ok(None);
    };
    Registry::new(params, &plan.job.engine.schemas.0)
        .map(|r| Some(Arc::new(r)))
        .map_err(|e| {
            EtlError::source(
                &plan.job.source,
                format!("schema registry '{}': {e}", params.url),
            )
        })
}

fn source_opener(plan: &RunPlan) -> SourceOpener {
    let plan = plan.clone();
    Box::new(move |known: &[PartitionState]| {
        let only = plan.partitions.as_deref();
        let topic = &plan.job.source;
        Ok(match &plan.source {
            SourceSpec::Files { pattern } => {
                let opts = FileOptions {
                    policy: plan.sandbox.path_policy(),
                    start_at_end: plan.start == Start::Latest,
                    avro: (plan.job.engine.format == Format::Avro)
                        .then(|| plan.job.engine.schemas.0.clone()),
                };
                Box::new(FileSource::open(topic, pattern, known, only, opts)?) as Box<dyn Source>
            }
            SourceSpec::Kafka { topic: name } => {
                let offsets: HashMap<i32, i64> =
                    known.iter().map(|p| (p.partition, p.next_offset)).collect();
                let opts = KafkaOptions {
                    follow: plan.job.follow,
                    start: plan.start,
                    registry: registry(&plan)?,
                };
                Box::new(KafkaSource::open(
                    topic,
                    name,
                    &plan.kafka,
                    &offsets,
                    only,
                    opts,
                )?)
            }
        })
    })
}

/// Whether a background job that cannot start is an error of the statement starting it (a new
/// job: the user sees why at once) or a job that retries (one resumed after a restart, whose
/// broker may not be back yet).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FirstRun {
    MustStart,
    MayRetry,
}

/// Starts a bound call as a background job: its first run now (so a job that cannot run fails
/// the statement, when `first` says so), then a thread of its own; the job is recorded to be
/// resumed after a restart. Returns its row.
pub fn start_background(host: &Arc<Host>, bound: &RunBind, first: FirstRun) -> Result<JobRow> {
    let Some(bg) = bound.background.clone() else {
        return Err(EtlError::Internal("not a background job".into()));
    };
    let (call, record) = &*bg;
    let name = bound.job().to_string();
    let jobs = host.jobs();
    jobs.check_free(&name)?;
    if first != FirstRun::MayRetry {
        host.check_room_for_job()?;
    }
    host.job_starting();
    let again = bound.clone();
    let job_host = Arc::clone(host);
    let mut starter: Starter = Box::new(move || {
        start(&again, &job_host, Lender::Job).map(|r| Box::new(r) as Box<dyn Runnable>)
    });
    let run = match starter() {
        Ok(r) => Ok(r),
        Err(e) if first == FirstRun::MayRetry => Err(e),
        Err(e) => return Err(e),
    };
    if let Some(path) = record {
        // Before the thread starts: a job that cannot be recorded does not start.
        Checkpoint::open_file(path)?.record_background(&name, &call.encode(), now_ms())?;
    }
    let spec = JobSpec {
        name,
        call_shown: call.shown(),
        record: record.clone(),
        every_ms: bound.plan.background.and_then(|b| b.every_ms),
    };
    jobs.spawn(spec, run, starter)
}

impl<F: Form> VTab for RunFunction<F> {
    type InitData = RunInit;
    type BindData = RunBind;

    fn bind(bind: &BindInfo) -> std::result::Result<RunBind, Box<dyn Error>> {
        Ok(contained(|| {
            streaming_etl_runtime::fault::panic_point("bind");
            let host = entry::bind_host(bind).ok_or(EtlError::Detached)?;
            host.touch();
            let bound = bind_run(&host, bind, F::NAME)?;
            match bound.background {
                Some(_) => add_columns(bind, JOB_COLUMNS),
                None => add_columns(bind, RUN_COLUMNS),
            }
            Ok(bound)
        })?)
    }

    fn init(init: &InitInfo) -> std::result::Result<RunInit, Box<dyn Error>> {
        Ok(contained(|| {
            streaming_etl_runtime::fault::panic_point("init");
            init.set_max_threads(1);
            Ok(RunInit {
                state: Mutex::new(State::NotStarted),
            })
        })?)
    }

    fn func(
        func: &TableFunctionInfo<Self>,
        output: &mut DataChunkHandle,
    ) -> std::result::Result<(), Box<dyn Error>> {
        Ok(contained(|| {
            let init = func.get_init_data();
            let mut state = init.state.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*state, State::NotStarted) {
                let host = entry::func_host(func).ok_or(EtlError::Detached)?;
                // A failed start leaves nothing running; the error ends the statement.
                *state = State::Done;
                let bound = func.get_bind_data();
                if bound.background.is_some() {
                    let row = start_background(&host, bound, FirstRun::MustStart)?;
                    write_row(output, 0, JOB_COLUMNS, &row)?;
                    output.set_len(1);
                    return Ok(());
                }
                *state = State::Running(start(bound, &host, Lender::Statement)?);
            }
            let State::Running(run) = &mut *state else {
                output.set_len(0);
                return Ok(());
            };
            let more = match run.cycle() {
                Ok(more) => more,
                Err(e) => {
                    // Releases the job lock and the connection before the error reaches DuckDB.
                    *state = State::Done;
                    return Err(e);
                }
            };
            write_row(output, 0, RUN_COLUMNS, &run.stats())?;
            output.set_len(1);
            if !more {
                // Releases the job lock and the connection before DuckDB asks for the next chunk.
                *state = State::Done;
            }
            Ok(())
        })?)
    }

    fn parameters() -> Option<Vec<LogicalTypeHandle>> {
        Some(
            F::POSITIONAL
                .iter()
                .map(|&ty| crate::host::param_types::logical_type(ty))
                .collect(),
        )
    }

    fn named_parameters() -> Option<Vec<(String, LogicalTypeHandle)>> {
        Some(crate::host::param_types::named_parameters(RUN_PARAMS))
    }
}
