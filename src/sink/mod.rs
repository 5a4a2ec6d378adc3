//! The sink: a job's output tables in an attached catalog of the host database. A run's sink
//! ([`duck_sink`]) creates its tables ([`tables`]) and writes each cycle's batch and its marker
//! in one transaction, each table with one statement ([`insert`] says what goes in, [`write`]
//! how), trying commits that conflict again and compacting a DuckLake ([`lake`]); [`catalog`]
//! says which catalog the tables are in and what it can do; a `subscribe` run keeps its
//! partitions' state beside them ([`partition_store`], its rows in [`partition_rows`]); the
//! aggregates DuckDB computes read the events of open windows staged beside them too
//! ([`staged`]); a job written as SQL's statement runs its part of each cycle in [`sql_cycle`], a
//! keyed statement's (`INSERT OR REPLACE`, a table kept from a changelog) in [`keyed`].

pub mod catalog;
pub mod duck_sink;
pub mod insert;
pub mod keyed;
pub mod lake;
pub mod owners;
pub mod partition_rows;
pub mod partition_store;
pub mod sql_cycle;
pub mod staged;
pub mod tables;
pub mod write;
