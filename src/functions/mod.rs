//! The SQL functions, one file each: `streaming_etl_run` and `streaming_etl_sql` ([`run`], their
//! calls bound in [`bound`]),
//! `streaming_etl_checkpoint` ([`checkpoint`]), the background jobs' `streaming_etl_jobs`
//! ([`jobs`]), `streaming_etl_stop` ([`stop`]) and `streaming_etl_resume` ([`resume`]), and
//! `__streaming_etl_batch`, internal to the sink ([`batch`]); their result columns are declared
//! through [`result`].

pub mod batch;
pub mod bound;
pub mod checkpoint;
pub mod jobs;
pub mod result;
pub mod resume;
pub mod run;
pub mod stop;
