//! The job runtime of streaming_etl: the side SQLite checkpoint, the commit thread and the run
//! loop. It is written against small traits (the output sink, the source opener, the clock) so
//! that a run can be tested end to end with an in-memory checkpoint, a memory source and a fake
//! sink; the extension crate supplies DuckDB and Kafka.

pub mod checkpoint;
pub mod clock;
pub mod committer;
pub mod config;
pub mod fault;
pub mod group;
pub mod job;
pub mod lock;
pub mod sink;
