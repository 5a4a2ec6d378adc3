//! Jobs that run beside the user (SPEC §23): started by `streaming_etl_run(..., background :=
//! true)` or `every := INTERVAL ...`, each on a thread and a connection of the extension's own,
//! so that no statement of the user's stays open while it runs. [`job`] is one job and what it
//! reports; [`registry`] holds a database's jobs (`streaming_etl_jobs()`,
//! `streaming_etl_stop(name)`); [`worker`] is a job's thread, driving the same runs the foreground
//! call drives; [`schedule`] says when the next scheduled run or retry starts; [`call`] keeps a
//! job's arguments, to show them without secrets and to start the job again after a restart
//! (`streaming_etl_resume()`); [`wal`] watches the database's WAL for a checkpoint held back.

pub mod call;
pub mod job;
pub mod registry;
pub mod schedule;
pub mod wal;
pub mod worker;
