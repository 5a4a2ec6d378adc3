//! The event-time core of streaming_etl, as plain Rust: decoding messages, per-partition
//! watermarks, windows, the checkpointed state model and its encodings, output rows, and the
//! sources that need nothing but the standard library (files, memory). It knows nothing of
//! DuckDB, Kafka or SQLite; those are adapters in the other crates of the workspace.
#![forbid(unsafe_code)]

pub mod aggregate;
pub mod decode;
pub mod engine;
pub mod error;
pub mod hll;
pub mod pipeline;
pub mod prefetch;
pub mod record;
pub mod rows;
pub mod session;
pub mod source;
pub mod state;
pub mod time;
pub mod watermark;
pub mod window;
