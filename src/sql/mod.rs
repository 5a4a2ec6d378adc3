//! Jobs written as SQL (SPEC section 21): the front end that reads a job's statements and plans
//! them. Pure parts: `text.rs` (statements and their `INSERT INTO` heads), `ast.rs` (DuckDB's
//! parse tree as JSON), `shape.rs` (what a statement says, and what a job cannot run). DuckDB's
//! part at bind time: `duck.rs` (its parser, printer and binder). `plan.rs` splits each
//! statement between the engine and DuckDB; the sink runs DuckDB's part each cycle
//! (`sink::sql_cycle`).

mod ast;
mod duck;
mod plan;
mod shape;
mod text;

pub use plan::{check_targets, events_columns, plan, Body, Given, SqlJob, SqlStatement};
