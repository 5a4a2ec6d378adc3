//! Message formats besides JSON: Avro and Protobuf records, in the schema registry's wire
//! format (a magic byte 0, a 4-byte big-endian schema id, for Protobuf the message indexes,
//! then the encoded record) or, for Avro, as datums of an object container file. Schemas come
//! into a [`SchemaCache`] from outside (the registry client is an adapter; a file source reads
//! its file's header); decoding only looks them up, so it never waits on a network.
//!
//! This file is the facade: the formats' public types, the schema cache and the decoder a job
//! uses, dispatching to [`avro`] and [`protobuf`]; what those two share is in [`bytes`]
//! (reading a record's bytes), [`spans`] (filling the fields) and [`varint`].

pub(crate) mod avro;
pub(crate) mod bytes;
pub(crate) mod protobuf;
mod registered;
pub(crate) mod spans;
pub(crate) mod varint;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crate::decode::{DecodeError, Decoder, FieldPath, Fields, Kind, Span};
use bytes::ReadError;
pub use registered::{RegisteredSchema, SchemaType};
use spans::Out;

/// How a job's messages are encoded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Json,
    Avro,
    /// `message`: the full name of the message type the job reads (None: the one each record
    /// names in its framing, the schema's first by default).
    Protobuf {
        message: Option<String>,
    },
}

impl Format {
    pub fn name(&self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Avro => "avro",
            Format::Protobuf { .. } => "protobuf",
        }
    }

    /// Avro or Protobuf: records whose schema is looked up by id.
    pub fn is_binary(&self) -> bool {
        !matches!(self, Format::Json)
    }
}

/// What wraps the record a job reads (`envelope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Envelope {
    /// The message is the record.
    #[default]
    None,
    /// A Debezium change event: `before`, `after`, `op`, `ts_ms`, `source`; in JSON either
    /// bare or as the `payload` of `{"schema": ..., "payload": ...}` (the JSON converter's
    /// `schemas.enable`), told apart by the message's first member.
    Debezium,
    /// A keyed topic (Kafka's compacted-topic convention, Flink's `upsert-kafka`): the message
    /// is the row of its key, and a tombstone (a key without a value) deletes the key's row.
    Upsert,
}

impl Envelope {
    pub fn name(self) -> &'static str {
        match self {
            Envelope::None => "none",
            Envelope::Debezium => "debezium",
            Envelope::Upsert => "upsert",
        }
    }
}

/// The field of an `upsert` tombstone's record that says it is one (see
/// [`RecordDecoder::decode_message`]).
pub const TOMBSTONE_FIELD: &str = "__se_tombstone";

#[derive(Debug)]
pub(crate) enum Compiled {
    Avro(Box<avro::AvroSchema>),
    Protobuf(protobuf::ProtoSchema),
    /// A schema of a kind no job reads (JSON Schema).
    Other(SchemaType),
}

/// What the cache knows of a schema id.
#[derive(Debug, Clone)]
pub(crate) enum Entry {
    Known(Arc<Compiled>),
    /// The registry has no schema with this id.
    Unknown,
}

/// Schemas by registry id, and the schemas of Avro files (by a number of the run's own),
/// shared by a run's decoders.
#[derive(Debug, Default)]
pub struct SchemaCache {
    by_id: RwLock<HashMap<u32, Entry>>,
    files: RwLock<Vec<(String, Arc<Compiled>)>>,
}

impl SchemaCache {
    pub fn new() -> Arc<SchemaCache> {
        Arc::new(SchemaCache::default())
    }

    /// Whether the id was looked up already (known or known to be missing).
    pub fn contains(&self, id: u32) -> bool {
        self.by_id.read().is_ok_and(|m| m.contains_key(&id))
    }

    /// Records what the registry answered for `id` (None: it has no such schema). A schema
    /// that does not parse is an error, naming why.
    pub fn add(&self, id: u32, schema: Option<&RegisteredSchema>) -> Result<(), String> {
        let entry = match schema {
            None => Entry::Unknown,
            Some(s) => Entry::Known(Arc::new(compile(s)?)),
        };
        if let Ok(mut m) = self.by_id.write() {
            m.insert(id, entry);
        }
        Ok(())
    }

    /// An Avro object container file's schema: its number for [`crate::Message::schema`].
    pub fn add_file_schema(&self, text: &str) -> Result<u32, String> {
        let mut files = self
            .files
            .write()
            .map_err(|_| "schema cache poisoned".to_string())?;
        if let Some(i) = files.iter().position(|(t, _)| t == text) {
            return Ok(i as u32);
        }
        let schema = avro::AvroSchema::parse(text, &[])?;
        files.push((text.to_string(), Arc::new(Compiled::Avro(Box::new(schema)))));
        Ok((files.len() - 1) as u32)
    }

    pub(crate) fn get(&self, id: u32) -> Option<Entry> {
        self.by_id.read().ok()?.get(&id).cloned()
    }

    pub(crate) fn file(&self, n: u32) -> Option<Arc<Compiled>> {
        self.files
            .read()
            .ok()?
            .get(n as usize)
            .map(|(_, c)| c.clone())
    }
}

fn compile(s: &RegisteredSchema) -> Result<Compiled, String> {
    Ok(match s.kind {
        SchemaType::Avro => {
            let refs: Vec<String> = s.references.iter().map(|(_, t)| t.clone()).collect();
            Compiled::Avro(Box::new(avro::AvroSchema::parse(&s.text, &refs)?))
        }
        SchemaType::Protobuf => Compiled::Protobuf(protobuf::ProtoSchema::parse(s)?),
        SchemaType::Json => Compiled::Other(SchemaType::Json),
    })
}

/// A shared cache inside the engine's configuration: compared as always equal (it is not a
/// setting).
#[derive(Debug, Clone, Default)]
pub struct Schemas(pub Arc<SchemaCache>);

impl PartialEq for Schemas {
    fn eq(&self, _: &Schemas) -> bool {
        true
    }
}

impl Eq for Schemas {}

/// Whose schema a record is read with: a registry id (with Protobuf's message indexes), or an
/// Avro file's schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    file: bool,
    id: u32,
    indexes: [u32; 16],
    n: u8,
}

enum Plan {
    Avro(Arc<Compiled>, avro::AvroPlan),
    Protobuf(protobuf::ProtoPlan),
    Fail(DecodeError),
}

/// Decodes Avro or Protobuf records for a fixed set of paths, with a plan per schema (and
/// message) made the first time a record names it.
pub(crate) struct BinaryDecoder {
    format: Format,
    cache: Arc<SchemaCache>,
    paths: Vec<FieldPath>,
    plans: Vec<Plan>,
    by_key: HashMap<PlanKey, usize>,
    /// The last record's key and plan: records of one schema come in runs, so most records
    /// skip the hash lookup.
    last: Option<(PlanKey, usize)>,
}

impl BinaryDecoder {
    /// A message key in the registry's wire format as JSON (a tombstone's key); None when its
    /// schema is not one the job's source looked up.
    fn key_json(&self, key: &[u8]) -> Result<String, DecodeError> {
        let id = match key.get(..5) {
            Some([0, a, b, c, d]) => u32::from_be_bytes([*a, *b, *c, *d]),
            Some([m, ..]) => return Err(DecodeError::NoMagicByte(*m)),
            _ => return Err(DecodeError::NoHeader),
        };
        let json = match self.cache.get(id) {
            Some(Entry::Known(c)) => match &*c {
                Compiled::Avro(s) => s.json(&key[5..]),
                Compiled::Protobuf(s) => {
                    let mut indexes = [0u32; 16];
                    protobuf::message_indexes(&key[5..], &mut indexes)
                        .ok()
                        .and_then(|(n, used)| s.json(&indexes[..n], key.get(5 + used..)?))
                }
                Compiled::Other(_) => None,
            },
            _ => return Err(DecodeError::UnknownSchema(id)),
        };
        json.ok_or(DecodeError::Undecodable(
            "the key's schema",
            "it does not decode",
        ))
    }

    pub(crate) fn new(format: &Format, cache: &Arc<SchemaCache>, paths: &[FieldPath]) -> Self {
        BinaryDecoder {
            format: format.clone(),
            cache: cache.clone(),
            paths: paths.to_vec(),
            plans: Vec::new(),
            by_key: HashMap::new(),
            last: None,
        }
    }

    fn name(&self) -> &'static str {
        match self.format {
            Format::Protobuf { .. } => "Protobuf",
            _ => "Avro",
        }
    }

    /// Fills `spans` from `raw` (a framed record, or a file's datum of schema `file_schema`).
    pub(crate) fn decode(
        &mut self,
        raw: &[u8],
        file_schema: Option<u32>,
        spans: &mut [Span],
        scratch: &mut Vec<u8>,
        numbers_only: u64,
    ) -> Result<(), DecodeError> {
        let name = self.name();
        let bad = |e: ReadError| match e {
            ReadError::Bad(why) => DecodeError::Undecodable(name, why),
            ReadError::TooDeep => DecodeError::TooDeep,
        };
        let (key, body) = match file_schema {
            Some(n) => (
                PlanKey {
                    file: true,
                    id: n,
                    indexes: [0; 16],
                    n: 0,
                },
                0,
            ),
            None => {
                match raw.first() {
                    None => return Err(DecodeError::Empty),
                    Some(&b) if b != 0 => return Err(DecodeError::NoMagicByte(b)),
                    _ => {}
                }
                let id = match raw.get(1..5) {
                    Some(b) => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
                    None => return Err(DecodeError::NoHeader),
                };
                let mut indexes = [0u32; 16];
                let (n, used) = match self.format {
                    Format::Protobuf { .. } => {
                        protobuf::message_indexes(&raw[5..], &mut indexes).map_err(bad)?
                    }
                    _ => (0, 0),
                };
                (
                    PlanKey {
                        file: false,
                        id,
                        indexes,
                        n: n as u8,
                    },
                    5 + used,
                )
            }
        };
        let at = match self.last {
            Some((k, at)) if k == key => at,
            _ => {
                let at = match self.by_key.get(&key) {
                    Some(&at) => at,
                    None => {
                        let Some(plan) = self.plan(&key) else {
                            return Err(DecodeError::UnknownSchema(key.id));
                        };
                        self.plans.push(plan);
                        self.by_key.insert(key, self.plans.len() - 1);
                        self.plans.len() - 1
                    }
                };
                self.last = Some((key, at));
                at
            }
        };
        let mut out = Out {
            spans,
            scratch,
            base: body,
            found: 0,
            numbers_only,
        };
        let data = raw.get(body..).unwrap_or(&[]);
        match self.plans.get(at) {
            Some(Plan::Avro(c, plan)) => match &**c {
                Compiled::Avro(s) => s.read(plan, data, &mut out).map_err(bad),
                _ => Err(DecodeError::UnknownSchema(key.id)),
            },
            Some(Plan::Protobuf(plan)) => plan.read(data, &mut out).map_err(bad),
            Some(Plan::Fail(e)) => Err(*e),
            None => Err(DecodeError::UnknownSchema(key.id)),
        }
    }

    /// None: the schema was never looked up (the source resolves every id before it delivers
    /// a record, so this is not cached).
    fn plan(&self, key: &PlanKey) -> Option<Plan> {
        let compiled = if key.file {
            self.cache.file(key.id)?
        } else {
            match self.cache.get(key.id)? {
                Entry::Unknown => return Some(Plan::Fail(DecodeError::UnknownSchema(key.id))),
                Entry::Known(c) => c,
            }
        };
        Some(match (&self.format, &*compiled) {
            (Format::Avro, Compiled::Avro(s)) => {
                let plan = s.plan(&self.paths);
                Plan::Avro(compiled.clone(), plan)
            }
            (Format::Protobuf { message }, Compiled::Protobuf(s)) => {
                let Some(m) = s.message(&key.indexes[..key.n as usize]) else {
                    return Some(Plan::Fail(DecodeError::NoSuchMessage(key.id)));
                };
                let plan = s.plan(&m, &self.paths);
                if message.as_deref().is_some_and(|want| want != plan.name()) {
                    return Some(Plan::Fail(DecodeError::OtherMessage(key.id)));
                }
                Plan::Protobuf(plan)
            }
            (_, Compiled::Avro(_)) => Plan::Fail(DecodeError::OtherFormat(key.id, "Avro")),
            (_, Compiled::Protobuf(_)) => Plan::Fail(DecodeError::OtherFormat(key.id, "Protobuf")),
            (_, Compiled::Other(t)) => Plan::Fail(DecodeError::OtherFormat(key.id, t.name())),
        })
    }
}

/// A binary record as JSON text (a late event's `payload_json`): the whole record, as the
/// format's own library renders it; `null` if it cannot be (it decoded, so it should).
pub(crate) fn record_json(schemas: &Schemas, raw: &[u8], file_schema: Option<u32>) -> String {
    let rendered = || -> Option<String> {
        if let Some(n) = file_schema {
            return match &*schemas.0.file(n)? {
                Compiled::Avro(s) => s.json(raw),
                _ => None,
            };
        }
        let id = u32::from_be_bytes(raw.get(1..5)?.try_into().ok()?);
        let Entry::Known(c) = schemas.0.get(id)? else {
            return None;
        };
        match &*c {
            Compiled::Avro(s) => s.json(raw.get(5..)?),
            Compiled::Protobuf(s) => {
                let mut indexes = [0u32; 16];
                let (n, used) = protobuf::message_indexes(raw.get(5..)?, &mut indexes).ok()?;
                s.json(&indexes[..n], raw.get(5 + used..)?)
            }
            Compiled::Other(_) => None,
        }
    };
    rendered().unwrap_or_else(|| "null".to_string())
}

/// A job's decoder: JSON objects, or Avro or Protobuf records, read into the same fields.
pub struct RecordDecoder {
    fields: Decoder,
    binary: Option<BinaryDecoder>,
    numbers_only: u64,
    /// JSON Debezium events: finds the `payload` of a `{"schema": ..., "payload": ...}` message,
    /// whose fields the paths then name (see [`Envelope::Debezium`]).
    unwrap: Option<Decoder>,
    /// A tombstone as the delete it stands for (see [`RecordDecoder::decode_message`]).
    tombstone: Vec<u8>,
    envelope: Envelope,
}

impl RecordDecoder {
    pub fn new(paths: Vec<FieldPath>, format: &Format, schemas: &Schemas) -> RecordDecoder {
        let binary = format
            .is_binary()
            .then(|| BinaryDecoder::new(format, &schemas.0, &paths));
        RecordDecoder {
            fields: Decoder::new(paths),
            binary,
            numbers_only: 0,
            unwrap: None,
            tombstone: Vec::new(),
            envelope: Envelope::None,
        }
    }

    /// Reads the records inside `envelope` (JSON: a wrapped Debezium event's payload, or a
    /// wrapped row of a keyed topic).
    pub(crate) fn envelope(mut self, envelope: Envelope) -> RecordDecoder {
        self.envelope = envelope;
        if envelope != Envelope::None && self.binary.is_none() {
            self.unwrap = FieldPath::parse("payload").map(|p| Decoder::new(vec![p]));
        }
        self
    }

    /// Whether a message of this value and key is a tombstone the envelope reads as a delete.
    #[inline]
    pub fn is_tombstone(&self, raw: &[u8], key: Option<&[u8]>) -> bool {
        self.envelope != Envelope::None && raw.is_empty() && key.is_some_and(|k| !k.is_empty())
    }

    /// Paths only numeric aggregates read: a binary format's floats there get no text.
    pub(crate) fn numbers_only(mut self, mask: u64) -> RecordDecoder {
        self.numbers_only = mask;
        self
    }

    /// Decodes one message with its Kafka key and timestamp. A tombstone (an empty value with
    /// a key, which a Debezium connector sends after a delete so that log compaction can drop
    /// the key, and which deletes a key of a keyed topic) reads as the delete of its key:
    /// - Debezium: `{"op": "d", "before": <the key's fields>, "ts_ms": <the record's
    ///   timestamp>}`;
    /// - `upsert`: the key's fields (none when the key is not an object), with
    ///   [`TOMBSTONE_FIELD`] true.
    ///
    /// A binary format's key is read in the registry's wire format, a JSON key bare or in the
    /// JSON converter's wrapper.
    #[inline]
    pub fn decode_message<'a>(
        &'a mut self,
        raw: &'a [u8],
        file_schema: Option<u32>,
        key: Option<&'a [u8]>,
        timestamp: Option<i64>,
    ) -> Result<Fields<'a>, DecodeError> {
        let Some(k) = key.filter(|_| self.is_tombstone(raw, key)) else {
            return self.decode(raw, file_schema);
        };
        let rendered;
        let fields_of_key: Option<&[u8]> = match (&self.binary, &mut self.unwrap) {
            (Some(b), _) => {
                rendered = b.key_json(k)?;
                Some(rendered.as_bytes())
            }
            (None, Some(outer)) if first_member_is(k, b"schema") => {
                payload_of(outer, k)?.map(|r| &k[r])
            }
            (None, _) => Some(k),
        };
        let doc = &mut self.tombstone;
        doc.clear();
        match self.envelope {
            Envelope::Upsert => {
                doc.extend_from_slice(br#"{""#);
                doc.extend_from_slice(TOMBSTONE_FIELD.as_bytes());
                doc.extend_from_slice(br#"":true"#);
                // (A key that is not an object names no field: `key` is the key.)
                let members = fields_of_key
                    .map(<[u8]>::trim_ascii)
                    .and_then(|o| o.strip_prefix(b"{")?.strip_suffix(b"}"))
                    .filter(|m| !m.trim_ascii().is_empty());
                if let Some(m) = members {
                    doc.push(b',');
                    doc.extend_from_slice(m);
                }
            }
            _ => {
                doc.extend_from_slice(br#"{"op":"d","before":"#);
                doc.extend_from_slice(fields_of_key.unwrap_or(b"null"));
                if let Some(ts) = timestamp {
                    doc.extend_from_slice(
                        format!(r#","ts_ms":{ts},"source":{{"ts_ms":{ts}}}"#).as_bytes(),
                    );
                }
            }
        }
        doc.push(b'}');
        self.fields.decode(&self.tombstone)
    }

    /// Decodes one message (`file_schema`: a datum of that Avro file schema).
    #[inline]
    pub fn decode<'a>(
        &'a mut self,
        raw: &'a [u8],
        file_schema: Option<u32>,
    ) -> Result<Fields<'a>, DecodeError> {
        match &mut self.binary {
            None => {
                let inner = match &mut self.unwrap {
                    Some(outer) if first_member_is(raw, b"schema") => payload_of(outer, raw)?,
                    _ => None,
                };
                match inner {
                    Some(r) => self.fields.decode(&raw[r]),
                    None => self.fields.decode(raw),
                }
            }
            Some(b) => {
                let numbers_only = self.numbers_only;
                self.fields.decode_with(raw, |spans, scratch| {
                    b.decode(raw, file_schema, spans, scratch, numbers_only)
                })
            }
        }
    }
}

/// Whether the JSON object `raw` begins with the member `name` (the JSON converter writes
/// `schema` first, so a wrapped event is told apart without a scan).
fn first_member_is(raw: &[u8], name: &[u8]) -> bool {
    let skip = |b: &[u8], mut i: usize| {
        while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
            i += 1;
        }
        i
    };
    let i = skip(raw, 0);
    if raw.get(i) != Some(&b'{') {
        return false;
    }
    let i = skip(raw, i + 1);
    raw.get(i) == Some(&b'"')
        && raw.get(i + 1..i + 1 + name.len()) == Some(name)
        && raw.get(i + 1 + name.len()) == Some(&b'"')
}

/// Where in `raw` its `payload` object is (the whole message is checked as JSON); None when
/// it has none (the fields are then looked for in the message itself).
fn payload_of(
    outer: &mut Decoder,
    raw: &[u8],
) -> Result<Option<std::ops::Range<usize>>, DecodeError> {
    let fields = outer.decode(raw)?;
    let p = fields.get(0);
    if p.kind != Kind::Object {
        return Ok(None);
    }
    // An object's span is always the message's own bytes (never the unescaping buffer).
    let start = (p.bytes.as_ptr() as usize).wrapping_sub(raw.as_ptr() as usize);
    let end = start.wrapping_add(p.bytes.len());
    Ok((start <= end && end <= raw.len()).then_some(start..end))
}

#[cfg(test)]
mod tests;
