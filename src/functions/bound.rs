//! A call of `streaming_etl_run` or `streaming_etl_sql`, bound: its arguments parsed and
//! checked, a job written as SQL planned with DuckDB, the output catalog resolved and the tables
//! created, before any run starts (the statement's own or a background job's).

use std::sync::Arc;

use streaming_etl_core::{EngineConfig, EtlError, Result};
use streaming_etl_runtime::checkpoint::Checkpoint;
use streaming_etl_runtime::config::CheckpointLocation;

use crate::host::args::{Arg, Args};
use crate::host::binder::bind_typed;
use crate::host::connections::{Host, SharedConn};
use crate::jobs::call::Call;
use crate::params::{
    jobs_record, parse_run, ParamType, RunPlan, TableName, RUN_POSITIONAL, RUN_SQL_POSITIONAL,
};
use crate::sink::catalog::OutputCatalog;
use crate::sink::duck_sink::DuckSink;
use crate::sink::owners::Owner;
use crate::sink::sql_cycle::SqlOutput;
use crate::sink::staged::{staged_table, Staging};
use crate::sql::SqlJob;

/// The form of a call: `streaming_etl_run(topic, window_ms, lateness_ms, ...)`, or a job written
/// as SQL, `streaming_etl_sql(topic, sql, ...)`.
pub trait Form: Send + Sync + 'static {
    const NAME: &'static str;
    const POSITIONAL: &'static [ParamType];
}

pub struct ParameterForm;

impl Form for ParameterForm {
    const NAME: &'static str = "streaming_etl_run";
    const POSITIONAL: &'static [ParamType] = RUN_POSITIONAL;
}

pub struct SqlForm;

impl Form for SqlForm {
    const NAME: &'static str = "streaming_etl_sql";
    const POSITIONAL: &'static [ParamType] = RUN_SQL_POSITIONAL;
}

/// How many positional arguments the function of this name takes.
pub fn positional_count(function: &str) -> usize {
    if function == SqlForm::NAME {
        SqlForm::POSITIONAL.len()
    } else {
        ParameterForm::POSITIONAL.len()
    }
}

/// A call, bound: everything a run of it needs, checked.
#[derive(Clone)]
pub struct RunBind {
    pub(super) plan: Arc<RunPlan>,
    /// The catalog the output tables are in.
    pub(super) catalog: OutputCatalog,
    /// A job written as SQL: its statement, planned.
    pub(super) sql: Option<Arc<SqlJob>>,
    /// A job for the background: its call, and where it is recorded to be resumed.
    pub(super) background: Option<Arc<(Call, Option<String>)>>,
}

impl RunBind {
    pub fn job(&self) -> &str {
        &self.plan.job.job
    }

    pub fn call(&self) -> Option<&Call> {
        self.background.as_deref().map(|(c, _)| c)
    }
}

/// The sink of a run in one process: the job's tables, the staged events of the aggregates
/// DuckDB computes, a job written as SQL's statement.
pub(super) fn single_sink(
    plan: &RunPlan,
    catalog: &OutputCatalog,
    sql: Option<&SqlJob>,
    conn: SharedConn,
) -> DuckSink {
    let engine = &plan.job.engine;
    let windows = engine.schemas().windows;
    let staging = Staging::of(
        engine,
        staged_table(&plan.tables.windows).sql(),
        &windows,
        false,
    )
    .filter(|_| sql.is_none());
    let sql = SqlOutput::for_job(sql, engine, false);
    DuckSink::new(
        conn,
        plan.write_mode,
        &plan.tables,
        catalog.clone(),
        plan.compaction,
    )
    .with_staging(staging)
    .with_sql(sql)
    .with_owner(owner(plan))
}

/// The job as its tables are claimed for it (see `sink::owners`).
pub(super) fn owner(plan: &RunPlan) -> Owner {
    Owner {
        job: plan.job.job.clone(),
        shape: plan.job.engine.windows_shown(),
        checkpoint: if plan.subscribe {
            // (A `subscribe` job keeps its state beside its tables.)
            String::new()
        } else {
            plan.job.checkpoint.shown().to_string()
        },
    }
}

/// Plans a job written as SQL with DuckDB (its typed columns, then its statement, which sets
/// the job's windows, keys and aggregates); its target takes the windows table's place, with
/// the late events and dead letters beside it unless they are named. The job's settings then
/// include the statement, and a checkpoint of the job with others is refused here, before
/// anything is created.
fn bind_sql(host: &Arc<Host>, args: &dyn Args, plan: &mut RunPlan, text: &str) -> Result<SqlJob> {
    let pooled = host.checkout()?;
    let conn = pooled.conn()?;
    bind_typed(conn, &mut plan.job.engine)?;
    let given = crate::sql::Given {
        text,
        windows_table: &plan.tables.windows,
        subscribe: plan.subscribe,
        primary_key: plan.primary_key.as_deref(),
    };
    let job = crate::sql::plan(conn, &given, &mut plan.job.engine)?;
    crate::sql::check_targets(conn, &job, plan.job.engine.revisions(), plan.subscribe)?;
    if let Some(target) = job.statements.first().map(|s| s.target.clone()) {
        let named = |p: &str| args.named(p).is_some_and(|a| !matches!(a, Arg::Null));
        if !named("late_table") {
            plan.tables.late = target.sibling("late_events");
        }
        if !named("dead_letter_table") {
            plan.tables.dead = target.sibling("dead_letters");
        }
        plan.tables.windows = target;
    }
    plan.job.tables = plan.tables.as_ref().map(TableName::sql);
    plan.rebind_settings(Some(job.setting()));
    if let CheckpointLocation::File(path) = &plan.job.checkpoint {
        if let Some(stored) = Checkpoint::stored_settings(path, &plan.job.job) {
            if let Some((setting, stored, requested)) = stored.first_difference(&plan.job.settings)
            {
                return Err(EtlError::SettingsChanged {
                    job: plan.job.job.clone(),
                    setting,
                    stored,
                    requested,
                });
            }
        }
    }
    Ok(job)
}

/// Creates the job's output tables at bind time, once every argument is checked. DuckDB keeps a
/// committed `CREATE` (and the checkpoint lock it holds) until every transaction that began
/// before it has ended: created while the calling statement runs, the tables would hold back
/// DuckDB's checkpoints until it ends (a `follow` job: never). Hosts bind a statement in a
/// transaction of its own before they run it (prepare, then execute), so tables created here
/// are older than the statement's run, as an earlier run's are.
fn create_tables(
    host: &Arc<Host>,
    plan: &RunPlan,
    catalog: &OutputCatalog,
    sql: Option<&SqlJob>,
) -> Result<()> {
    use streaming_etl_runtime::sink::OutputSink;
    let mut sink = single_sink(plan, catalog, sql, SharedConn::new(host.checkout()?));
    sink.prepare(&plan.job.tables, &plan.job.engine.schemas())
}

/// The one catalog of the run's output tables (checked at bind time: a cycle commits in one
/// transaction, which writes one catalog), and that compaction asks for a DuckLake.
fn output_catalog(host: &Arc<Host>, plan: &RunPlan) -> Result<OutputCatalog> {
    let pooled = host.checkout()?;
    let catalog = crate::sink::catalog::resolve(pooled.conn()?, &plan.tables)?;
    if let Some(c) = &plan.compaction {
        if !catalog.is_ducklake() {
            return Err(EtlError::invalid(
                "compact_every",
                format!(
                    "compacts a DuckLake, but the output tables are in catalog '{}' of type {}",
                    catalog.name, catalog.kind
                ),
                c.every,
            ));
        }
    }
    if plan.subscribe && !catalog.is_ducklake() {
        return Err(EtlError::invalid(
            "subscribe",
            format!(
                "keeps each partition's state in the output catalog, which every process of the group must be able to write at once (a DuckLake); the output tables are in catalog '{}' of type {}, which one process at a time can write",
                catalog.name, catalog.kind
            ),
            true,
        ));
    }
    Ok(catalog)
}

/// Binds a call of `function` (`streaming_etl_run` or `streaming_etl_sql`): its arguments parsed
/// and checked, a job written as SQL planned, the output catalog resolved and the tables
/// created. A background job's call is kept, with where it is recorded.
pub fn bind_run(host: &Arc<Host>, args: &dyn Args, function: &str) -> Result<RunBind> {
    let mut plan = parse_run(args, host.db_path())?;
    let sql = match plan.sql.clone() {
        Some(text) => Some(bind_sql(host, args, &mut plan, &text)?),
        None if !plan.job.engine.columns.is_empty() => {
            // DuckDB's binder types the columns and aggregates before anything is read.
            let pooled = host.checkout()?;
            bind_typed(pooled.conn()?, &mut plan.job.engine)?;
            plan.rebind_settings(None);
            // (After the settings: a job's settings name the columns it declares.)
            stage_only_what_is_read(pooled.conn()?, &mut plan.job.engine);
            None
        }
        None => None,
    };
    let catalog = output_catalog(host, &plan)?;
    if let Some(job) = &sql {
        let targets: Vec<(String, TableName)> = job
            .statements
            .iter()
            .map(|s| (s.target_shown.clone(), s.target.clone()))
            .collect();
        let pooled = host.checkout()?;
        crate::sink::catalog::check_targets(pooled.conn()?, &catalog, &targets)?;
    }
    if !plan.subscribe {
        create_tables(host, &plan, &catalog, sql.as_ref())?;
    }
    let background = match plan.background {
        Some(_) => {
            let record = jobs_record(args, host.db_path(), &plan.sandbox, false)?;
            let call = Call::capture(function, args, positional_count(function));
            Some(Arc::new((call, record)))
        }
        None => None,
    };
    Ok(RunBind {
        plan: Arc::new(plan),
        catalog,
        sql: sql.map(Arc::new),
        background,
    })
}

/// A parameter job stages only the typed columns its keys and DuckDB aggregates read (the
/// others are declared as for `read_json`: still decoded and converted, so that a value that does
/// not convert is a dead letter, but not copied into DuckDB with every event).
fn stage_only_what_is_read(conn: &duckdb::Connection, engine: &mut EngineConfig) {
    let exprs: Vec<&str> = engine
        .aggregates
        .iter()
        .filter_map(|a| a.duck.as_ref().map(|d| d.expr.as_str()))
        .collect();
    let names: Vec<String> = engine.columns.iter().map(|c| c.name.clone()).collect();
    let Some(read) = crate::sql::columns_read(conn, &exprs, &names) else {
        return;
    };
    let key = |n: &String| {
        engine
            .columns
            .iter()
            .any(|c| &c.name == n && engine.keys.iter().any(|k| k.path == c.path))
    };
    let unstaged = names
        .iter()
        .filter(|n| !read.contains(n) && !key(n))
        .cloned()
        .collect();
    engine.unstaged = unstaged;
}
