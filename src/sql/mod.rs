//! Jobs written as SQL (SPEC section 21): the front end that reads a job's statements and plans
//! them. Pure parts: `text.rs` (statements and their `INSERT INTO` heads), `ast.rs` (DuckDB's
//! parse tree as JSON), `shape.rs` (what a statement says, and what a job cannot run). DuckDB at
//! bind time: `duck.rs` (its parser, printer and binder; `builtins.rs`, its own function names).
//! `plan.rs` plans a job and checks each statement, planned by its kind: `transform.rs` (no
//! window), `window.rs` (a window and its keys), then `engine.rs`, `staged.rs` or
//! `window_join.rs` (the stream read twice, joined within each window); between the
//! engine (`on_engine.rs`: its keys, and the fast path's aggregates) and DuckDB (`on_duckdb.rs`:
//! the SQL of each cycle), which the sink runs (`sink::sql_cycle`).
//! `targets.rs`: existing targets checked against what the statements make;
//! `debezium.rs`: the stream of a Debezium topic; `keyed.rs`: an `INSERT OR REPLACE`
//! statement, a table kept by key from a changelog (its sink: `sink::keyed`); `reads.rs`: the
//! columns a parameter job's DuckDB aggregates read.

mod ast;
mod builtins;
mod debezium;
mod duck;
mod engine;
mod keyed;
mod on_duckdb;
mod on_engine;
mod plan;
mod reads;
mod shape;
mod staged;
mod statement;
mod targets;
mod text;
mod transform;
mod window;
mod window_join;

pub use keyed::{Keyed, MESSAGE_KEY_COLUMN};
pub use on_duckdb::events_columns;
pub use plan::{plan, Given, SqlJob};
pub use reads::columns_read;
pub use statement::{Body, SqlStatement};
pub use targets::check_targets;
