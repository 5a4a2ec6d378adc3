//! The event-time core of streaming_etl, as plain Rust: decoding messages, per-partition
//! watermarks, windows, the checkpointed state model and its encodings, output rows, and the
//! sources that need nothing but the standard library (files, memory). It knows nothing of
//! DuckDB, Kafka or SQLite; those are adapters in the other crates of the workspace.
//!
//! The modules stack without a loop, each using only those above it:
//! `codec`, `error`, `message`, `tables`, `time`, `decode`, `rows`, `hll`, `sketch`, `filter` → `format`,
//! `state`, `aggregate`, `prefilter` → `config` → `record`, `chunk`, `pool` → `emit` → `window`, `session`,
//! `watermark`, `source` → `parse`, `shard` → `engine` → `prefetch` → `pipeline`. They are
//! private; what the other crates use is re-exported here.
#![forbid(unsafe_code)]

mod aggregate;
mod chunk;
mod codec;
mod columns;
mod config;
mod decode;
mod emit;
mod engine;
mod error;
mod filter;
mod format;
mod hll;
mod layer;
mod message;
mod parse;
mod pipeline;
mod pool;
mod prefetch;
mod prefilter;
mod record;
mod rows;
mod session;
mod shard;
mod sketch;
mod source;
mod state;
mod tables;
mod time;
mod watermark;
mod window;

pub use aggregate::{split_alias, AggSpec, DuckAgg};
pub use chunk::Chunk;
pub use codec::CodecError;
pub use columns::{Repr, Resolver, ResolverHandle, TypedColumn};
pub use config::{
    Emit, EngineConfig, Fate, JobSettings, KeyColumn, TimeSpec, WindowKind, CORRECTION_COLUMN,
    DEFAULT_KEY_FIELD, FATE_COLUMN, MAX_AGGREGATES,
};
pub use decode::{parse_f64, parse_i64, DecodeError, Decoder, Field, FieldPath, Fields, Kind};
pub use engine::{Counters, Engine, PartitionProgress, Restored};
pub use error::{EtlError, Result};
pub use format::{
    Envelope, Format, RecordDecoder, RegisteredSchema, SchemaCache, SchemaType, Schemas,
    TOMBSTONE_FIELD,
};
pub use pipeline::{read_cycle, reported_watermark, CycleLimits, ReadState, Stop};
pub use pool::{Actor, Pool};
pub use prefilter::{NullTest, NullTests};
pub use rows::{Cell, Column, ColumnType, OwnedCell, Role, RowCursor, Rows, TableSchema};
pub use source::file::{FileOptions, FileSource};
pub use source::glob::{fixed_prefix, glob, lexical_absolute, PathPolicy};
pub use source::memory::MemorySource;
pub use source::{Gap, Message, Pull, Source, SourcePartition};
pub use state::{Batch, OutputSchemas, PartitionState, Staged};
pub use tables::ByTable;
pub use time::{
    epoch_ms, iso8601_ms, TimeError, TimeFormat, Zone, MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS,
};
pub use watermark::{PartitionClock, NO_WATERMARK};
