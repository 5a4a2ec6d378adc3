//! A message: what a source delivers and a chunk holds, addressed by its partition's offset.

/// One message as the source delivers it, borrowed from the source's buffers.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub offset: i64,
    /// The offset to resume from once this message is processed.
    pub next_offset: i64,
    pub payload: &'a [u8],
    /// The Kafka message key, when there is one.
    pub key: Option<&'a [u8]>,
    /// The Kafka record's timestamp (create or log-append time, epoch ms), when it has one.
    pub timestamp: Option<i64>,
    /// The payload is a datum of an Avro file, of this file schema (see
    /// [`crate::SchemaCache::add_file_schema`]); None: it carries its own framing.
    pub schema: Option<u32>,
}
