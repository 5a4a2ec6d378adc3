//! A Kafka-protocol broker for tests: librdkafka's mock cluster, listening on 127.0.0.1.
//!
//! Prints `bootstrap <host:port,...>` once the brokers listen, then reads commands on stdin
//! (one per line) and answers `ok` or `error: <reason>` to each:
//!
//! ```text
//! create <topic> <partitions>             create a topic
//! down <broker> | up <broker>             take a broker down / bring it back (ids from 1)
//! rtt <broker> <ms>                       add round-trip latency to a broker
//! errors <api> <count> <error>            fail the next <count> requests of an API
//!                                          (api: Fetch, Metadata, OffsetCommit, ListOffsets, ...;
//!                                          error: a Kafka error code: 3, 5, 6, 7, 13, 15, 16, 29, 58)
//! clear <api>                             stop injecting errors into an API
//! leader <topic> <partition> <broker>     move a partition's leader
//! quit                                    exit (so does end of input)
//! ```
//!
//! `mock-kafka consume <bootstrap> <topic>` is the benchmark's baseline instead: a plain
//! consume-only loop (BaseConsumer, all partitions from the start to their end offsets) that
//! prints `{"messages": n, "bytes": b, "elapsed_s": t}`.

use std::io::{BufRead, Write};
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};

fn api(name: &str) -> Option<RDKafkaApiKey> {
    Some(match name {
        "Produce" => RDKafkaApiKey::Produce,
        "Fetch" => RDKafkaApiKey::Fetch,
        "ListOffsets" => RDKafkaApiKey::ListOffsets,
        "Metadata" => RDKafkaApiKey::Metadata,
        "OffsetCommit" => RDKafkaApiKey::OffsetCommit,
        "OffsetFetch" => RDKafkaApiKey::OffsetFetch,
        "FindCoordinator" => RDKafkaApiKey::FindCoordinator,
        "ApiVersion" => RDKafkaApiKey::ApiVersion,
        _ => return None,
    })
}

/// The Kafka error codes tests inject, by number.
fn error_code(text: &str) -> Option<RDKafkaRespErr> {
    use RDKafkaRespErr::*;
    Some(match text.parse::<i32>().ok()? {
        3 => RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART,
        5 => RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        6 => RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        7 => RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        13 => RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
        15 => RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
        16 => RD_KAFKA_RESP_ERR_NOT_COORDINATOR,
        29 => RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        58 => RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED,
        _ => return None,
    })
}

fn run(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    line: &str,
) -> Result<bool, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let int = |i: usize| -> Result<i32, String> {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("argument {i} must be an integer"))
    };
    match words.first().copied() {
        None => Ok(true),
        Some("quit") => Ok(false),
        Some("create") => {
            let topic = words.get(1).ok_or("create <topic> <partitions>")?;
            cluster
                .create_topic(topic, int(2)?, 1)
                .map_err(|e| e.to_string())?;
            Ok(true)
        }
        Some("down") => cluster
            .broker_down(int(1)?)
            .map(|_| true)
            .map_err(|e| e.to_string()),
        Some("up") => cluster
            .broker_up(int(1)?)
            .map(|_| true)
            .map_err(|e| e.to_string()),
        Some("rtt") => cluster
            .broker_round_trip_time(int(1)?, Duration::from_millis(int(2)? as u64))
            .map(|_| true)
            .map_err(|e| e.to_string()),
        Some("errors") => {
            let key = words.get(1).and_then(|a| api(a)).ok_or("unknown API")?;
            let count = int(2)? as usize;
            let err = words
                .get(3)
                .and_then(|e| error_code(e))
                .ok_or("error must be a Kafka error code")?;
            cluster.request_errors(key, &vec![err; count]);
            Ok(true)
        }
        Some("clear") => {
            let key = words.get(1).and_then(|a| api(a)).ok_or("unknown API")?;
            cluster.clear_request_errors(key);
            Ok(true)
        }
        Some("leader") => {
            let topic = words.get(1).ok_or("leader <topic> <partition> <broker>")?;
            cluster
                .partition_leader(topic, int(2)?, Some(int(3)?))
                .map(|_| true)
                .map_err(|e| e.to_string())
        }
        Some(other) => Err(format!("unknown command {other}")),
    }
}

fn consume(bootstrap: &str, topic: &str) -> Result<(), String> {
    let timeout = Duration::from_secs(15);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "raw-consume-baseline")
        .set("enable.auto.commit", "false")
        // The same fetch settings as streaming_etl's consumer, so the baseline is fair.
        .set("queued.max.messages.kbytes", "4096")
        .set("fetch.queue.backoff.ms", "5")
        .create()
        .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| e.to_string())?;
    let partitions: Vec<i32> = metadata
        .topics()
        .first()
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    let mut tpl = TopicPartitionList::new();
    let mut remaining = 0i64;
    for &p in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, timeout)
            .map_err(|e| e.to_string())?;
        remaining += high - low;
        tpl.add_partition_offset(topic, p, Offset::Offset(low))
            .map_err(|e| e.to_string())?;
    }
    let start = std::time::Instant::now();
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let (mut messages, mut bytes) = (0i64, 0u64);
    while messages < remaining {
        match consumer.poll(timeout) {
            Some(Ok(m)) => {
                messages += 1;
                bytes += m.payload().map_or(0, |p| p.len() as u64);
            }
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err(format!("stalled after {messages} messages")),
        }
    }
    println!(
        "{{\"messages\": {messages}, \"bytes\": {bytes}, \"elapsed_s\": {:.4}}}",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("consume") {
        let (Some(bootstrap), Some(topic)) = (args.get(2), args.get(3)) else {
            eprintln!("usage: mock-kafka consume <bootstrap> <topic>");
            std::process::exit(2);
        };
        if let Err(e) = consume(bootstrap, topic) {
            eprintln!("consume: {e}");
            std::process::exit(1);
        }
        return;
    }
    let brokers: i32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let cluster = match MockCluster::new(brokers) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start the mock cluster: {e}");
            std::process::exit(1);
        }
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = writeln!(out, "bootstrap {}", cluster.bootstrap_servers());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match run(&cluster, &line) {
            Ok(true) => {
                let _ = writeln!(out, "ok");
            }
            Ok(false) => break,
            Err(e) => {
                let _ = writeln!(out, "error: {e}");
            }
        }
        let _ = out.flush();
    }
}
