//! The SQL functions, one file each: `streaming_etl_run` ([`run`]), `streaming_etl_checkpoint`
//! ([`checkpoint`]) and `__streaming_etl_batch`, internal to the sink ([`batch`]); their result
//! columns are declared through [`result`].

pub mod batch;
pub mod checkpoint;
pub mod result;
pub mod run;
