//! The Kafka source (the file and memory sources are in the core crate).

pub mod kafka;
mod kafka_batch;
pub mod kafka_group;
pub mod registry;
