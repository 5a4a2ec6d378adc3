//! The Kafka source (the file and memory sources are in the core crate): the consumer both
//! readers are built on ([`kafka_client`]), a topic's partitions assigned explicitly
//! ([`kafka`]) or by the job's consumer group ([`kafka_group`]), librdkafka's batch queue
//! ([`kafka_batch`]) and the schema registry client ([`registry`]).

pub mod kafka;
mod kafka_batch;
mod kafka_client;
pub mod kafka_group;
pub mod registry;
