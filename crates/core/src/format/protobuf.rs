//! Protobuf: the registry's schema (a `.proto` text, or the serialized descriptor Confluent's
//! clients register) compiled by `protox` into `prost-reflect` descriptors, and the message a
//! record names flattened into a table read in one pass per record for the job's paths.
//! Fields are found by number wherever they occur; the last occurrence of a scalar wins, as in
//! every Protobuf parser. A scalar without presence that is absent reads as its default (0,
//! "", false, the enum's first value), as generated code reads it; an absent message or a
//! field with presence is missing.

use std::collections::HashMap;

use base64::Engine as _;
use prost_reflect::prost::Message as _;
use prost_reflect::prost_types::FileDescriptorProto;
use prost_reflect::{DescriptorPool, FileDescriptor, Kind as PKind, MessageDescriptor};
use protox::file::{ChainFileResolver, File, FileResolver, GoogleFileResolver};

use super::bytes::{array, take, ReadError};
use super::registered::RegisteredSchema;
use super::spans::{all_paths, masks, Out};
use super::varint;
use crate::decode::{FieldPath, Kind, MAX_DEPTH};

/// The name the schema itself is compiled under (its references keep their own).
const MAIN: &str = "registered_schema.proto";

pub(crate) struct ProtoSchema {
    file: FileDescriptor,
    _pool: DescriptorPool,
}

impl std::fmt::Debug for ProtoSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProtoSchema({})", self.file.name())
    }
}

struct Files(HashMap<String, String>);

/// A schema's text as a file: a serialized `FileDescriptorProto` in base64 (what the
/// registry's `format=serialized` and Confluent's clients use), else `.proto` source.
fn load(name: &str, text: &str) -> Result<File, protox::Error> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim());
    if let Ok(b) = bytes {
        if let Ok(mut fd) = FileDescriptorProto::decode(b.as_slice()) {
            fd.name = Some(name.to_string());
            return Ok(File::from_file_descriptor_proto(fd));
        }
    }
    File::from_source(name, text)
}

impl FileResolver for Files {
    fn open_file(&self, name: &str) -> Result<File, protox::Error> {
        match self.0.get(name) {
            Some(text) => load(name, text),
            None => Err(protox::Error::file_not_found(name)),
        }
    }
}

impl ProtoSchema {
    /// The whole message as JSON (proto3's JSON mapping), decoded by prost-reflect.
    pub(crate) fn json(&self, indexes: &[u32], data: &[u8]) -> Option<String> {
        let m = prost_reflect::DynamicMessage::decode(self.message(indexes)?, data).ok()?;
        serde_json::to_string(&m).ok()
    }

    pub(crate) fn parse(s: &RegisteredSchema) -> Result<ProtoSchema, String> {
        let mut files: HashMap<String, String> = s.references.iter().cloned().collect();
        files.insert(MAIN.to_string(), s.text.clone());
        let mut chain = ChainFileResolver::new();
        chain.add(Files(files));
        chain.add(GoogleFileResolver::new());
        let mut c = protox::Compiler::with_file_resolver(chain);
        c.include_imports(true);
        c.open_file(MAIN).map_err(|e| e.to_string())?;
        let pool = c.descriptor_pool();
        let file = pool
            .get_file_by_name(MAIN)
            .ok_or_else(|| "the compiled schema has no file".to_string())?;
        if file.messages().len() == 0 {
            return Err("the schema defines no message".into());
        }
        Ok(ProtoSchema { file, _pool: pool })
    }

    /// The message at Confluent's message indexes (the first top-level message is `[0]`).
    pub(crate) fn message(&self, indexes: &[u32]) -> Option<MessageDescriptor> {
        let (&first, rest) = indexes.split_first()?;
        let mut m = self.file.messages().nth(first as usize)?;
        for &i in rest {
            let child = m.child_messages().nth(i as usize);
            m = child?;
        }
        Some(m)
    }

    pub(crate) fn plan(&self, m: &MessageDescriptor, paths: &[FieldPath]) -> ProtoPlan {
        let mut b = PlanBuilder {
            msgs: Vec::new(),
            index: HashMap::new(),
        };
        let root = b.add(m);
        let depth = paths.iter().map(|p| p.segments().len()).max().unwrap_or(0);
        let masks = (0..depth)
            .map(|d| {
                b.msgs
                    .iter()
                    .map(|msg| {
                        msg.fields
                            .iter()
                            .map(|f| masks(paths, d, f.name.as_bytes()))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        ProtoPlan {
            name: m.full_name().to_string(),
            msgs: b.msgs,
            root,
            masks,
            all: all_paths(paths.len()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
    Enum(usize),
    Message(usize),
}

#[derive(Debug)]
struct PField {
    name: String,
    number: u32,
    ty: Ty,
    repeated: bool,
    map: bool,
    presence: bool,
}

#[derive(Debug)]
struct Msg {
    fields: Vec<PField>,
    /// Field position by number (numbers below 128 in `dense`, the index + 1; 0: none).
    dense: [u8; 128],
    by_number: HashMap<u32, usize>,
    /// google.protobuf.Timestamp: an event time when read as a whole.
    timestamp: bool,
    enums: Vec<Vec<(i32, String)>>,
}

/// Per field of a message: the paths that end at it, and those that go on inside it.
type FieldMasks = Box<[(u64, u64)]>;

/// One message type flattened for one job's paths.
#[derive(Debug)]
pub(crate) struct ProtoPlan {
    name: String,
    msgs: Vec<Msg>,
    root: usize,
    /// Per depth, per message, per field: (leaf, deeper) path masks.
    masks: Vec<Vec<FieldMasks>>,
    all: u64,
}

struct PlanBuilder {
    msgs: Vec<Msg>,
    index: HashMap<String, usize>,
}

impl PlanBuilder {
    fn add(&mut self, m: &MessageDescriptor) -> usize {
        if let Some(&i) = self.index.get(m.full_name()) {
            return i;
        }
        let at = self.msgs.len();
        self.index.insert(m.full_name().to_string(), at);
        self.msgs.push(Msg {
            fields: Vec::new(),
            dense: [0; 128],
            by_number: HashMap::new(),
            timestamp: m.full_name() == "google.protobuf.Timestamp",
            enums: Vec::new(),
        });
        let mut fields = Vec::new();
        let mut enums = Vec::new();
        for f in m.fields() {
            let ty = match f.kind() {
                PKind::Double => Ty::Double,
                PKind::Float => Ty::Float,
                PKind::Int32 => Ty::Int32,
                PKind::Int64 => Ty::Int64,
                PKind::Uint32 => Ty::Uint32,
                PKind::Uint64 => Ty::Uint64,
                PKind::Sint32 => Ty::Sint32,
                PKind::Sint64 => Ty::Sint64,
                PKind::Fixed32 => Ty::Fixed32,
                PKind::Fixed64 => Ty::Fixed64,
                PKind::Sfixed32 => Ty::Sfixed32,
                PKind::Sfixed64 => Ty::Sfixed64,
                PKind::Bool => Ty::Bool,
                PKind::String => Ty::String,
                PKind::Bytes => Ty::Bytes,
                PKind::Enum(e) => {
                    enums.push(
                        e.values()
                            .map(|v| (v.number(), v.name().to_string()))
                            .collect(),
                    );
                    Ty::Enum(enums.len() - 1)
                }
                PKind::Message(sub) => Ty::Message(self.add(&sub)),
            };
            fields.push(PField {
                name: f.name().to_string(),
                number: f.number(),
                ty,
                repeated: f.is_list() || f.is_map(),
                map: f.is_map(),
                presence: f.supports_presence(),
            });
        }
        let msg = &mut self.msgs[at];
        msg.by_number = fields
            .iter()
            .enumerate()
            .map(|(i, f)| (f.number, i))
            .collect();
        for (i, f) in fields.iter().enumerate() {
            if f.number < 128 && i < 255 {
                msg.dense[f.number as usize] = i as u8 + 1;
            }
        }
        msg.fields = fields;
        msg.enums = enums;
        at
    }
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const SGROUP: u8 = 3;
const EGROUP: u8 = 4;
const I32: u8 = 5;

impl ProtoPlan {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Reads the job's paths out of one encoded message.
    pub(crate) fn read(&self, data: &[u8], out: &mut Out<'_>) -> Result<(), ReadError> {
        self.message(self.root, data, 0, 0, self.all, out)
    }

    /// `at`: where `data` starts in the record (strings are spans of the message).
    fn message(
        &self,
        m: usize,
        data: &[u8],
        at: usize,
        depth: usize,
        active: u64,
        out: &mut Out<'_>,
    ) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::TooDeep);
        }
        let msg = &self.msgs[m];
        let masks = self.masks.get(depth).map(|d| &d[m]);
        let mut i = 0;
        while i < data.len() {
            let tag = varint::unsigned(data, &mut i)?;
            let (number, wire) = ((tag >> 3) as u32, (tag & 7) as u8);
            if number == 0 {
                return Err(ReadError::Bad("a field number 0"));
            }
            let pos = match msg.dense.get(number as usize) {
                Some(&0) if number < 128 => None,
                Some(&d) => Some(d as usize - 1),
                None => msg.by_number.get(&number).copied(),
            };
            let hit = pos.and_then(|f| {
                let (l, d) = masks?[f];
                let (l, d) = (l & active, d & active);
                (l | d != 0).then_some((f, l, d))
            });
            let Some((f, leaf, deeper)) = hit else {
                skip(data, &mut i, wire, number, 0)?;
                continue;
            };
            let field = &msg.fields[f];
            if field.repeated {
                out.set(leaf, if field.map { Kind::Object } else { Kind::Array });
                skip(data, &mut i, wire, number, 0)?;
                continue;
            }
            self.scalar(msg, field, data, &mut i, wire, at, depth, leaf, deeper, out)?;
        }
        // Scalars without presence that were not on the wire hold their defaults.
        if let Some(masks) = masks {
            for (f, field) in msg.fields.iter().enumerate() {
                let leaf = masks[f].0 & active & !out.found;
                if leaf == 0 {
                    continue;
                }
                if field.repeated {
                    out.set(leaf, if field.map { Kind::Object } else { Kind::Array });
                } else if !field.presence {
                    default(msg, field, leaf, out);
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn scalar(
        &self,
        msg: &Msg,
        field: &PField,
        data: &[u8],
        i: &mut usize,
        wire: u8,
        at: usize,
        depth: usize,
        leaf: u64,
        deeper: u64,
        out: &mut Out<'_>,
    ) -> Result<(), ReadError> {
        let expected = match field.ty {
            Ty::Double | Ty::Fixed64 | Ty::Sfixed64 => I64,
            Ty::Float | Ty::Fixed32 | Ty::Sfixed32 => I32,
            Ty::String | Ty::Bytes | Ty::Message(_) => LEN,
            _ => VARINT,
        };
        if wire != expected {
            return Err(ReadError::Bad("a field encoded with the wrong wire type"));
        }
        match field.ty {
            Ty::Double => {
                out.set_float(leaf, f64::from_le_bytes(array(data, i)?));
            }
            Ty::Float => {
                out.set_f32(leaf, f32::from_le_bytes(array(data, i)?));
            }
            Ty::Fixed64 => {
                out.set_uint(leaf, u64::from_le_bytes(array(data, i)?));
            }
            Ty::Sfixed64 => {
                out.set_int(leaf, i64::from_le_bytes(array(data, i)?), false);
            }
            Ty::Fixed32 => {
                out.set_uint(leaf, u32::from_le_bytes(array(data, i)?).into());
            }
            Ty::Sfixed32 => {
                out.set_int(leaf, i32::from_le_bytes(array(data, i)?).into(), false);
            }
            Ty::Int32 => {
                let v = varint::unsigned(data, i)?;
                out.set_int(leaf, i64::from(v as i32), false);
            }
            Ty::Int64 => {
                let v = varint::unsigned(data, i)?;
                out.set_int(leaf, v as i64, false);
            }
            Ty::Uint32 => {
                let v = varint::unsigned(data, i)?;
                out.set_uint(leaf, u64::from(v as u32));
            }
            Ty::Uint64 => {
                let v = varint::unsigned(data, i)?;
                out.set_uint(leaf, v);
            }
            Ty::Sint32 | Ty::Sint64 => {
                let v = varint::zigzag(data, i)?;
                out.set_int(leaf, v, false);
            }
            Ty::Bool => {
                let v = varint::unsigned(data, i)?;
                let text: &[u8] = if v != 0 { b"true" } else { b"false" };
                out.set_scratch(leaf, Kind::Bool, text, false);
            }
            Ty::Enum(e) => {
                let v = varint::unsigned(data, i)? as i32;
                match msg.enums[e].iter().find(|(n, _)| *n == v) {
                    Some((_, name)) => out.set_scratch(leaf, Kind::String, name.as_bytes(), false),
                    None => out.set_int(leaf, v.into(), false),
                }
            }
            Ty::String | Ty::Bytes => {
                let s = len_delimited(data, i)?;
                out.set_raw(leaf, at + *i - s.len(), s);
            }
            Ty::Message(sub) => {
                let s = len_delimited(data, i)?;
                let start = at + *i - s.len();
                if self.msgs[sub].timestamp && leaf != 0 {
                    out.set_int(leaf, timestamp_ms(s)?, true);
                } else {
                    out.set(leaf, Kind::Object);
                }
                if deeper != 0 {
                    self.message(sub, s, start, depth + 1, deeper, out)?;
                }
            }
        }
        Ok(())
    }
}

fn default(msg: &Msg, field: &PField, leaf: u64, out: &mut Out<'_>) {
    match field.ty {
        Ty::Double | Ty::Float => out.set_float(leaf, 0.0),
        Ty::String | Ty::Bytes => out.set_scratch(leaf, Kind::String, b"", false),
        Ty::Bool => out.set_scratch(leaf, Kind::Bool, b"false", false),
        Ty::Enum(e) => match msg.enums[e].first() {
            Some((_, name)) => out.set_scratch(leaf, Kind::String, name.as_bytes(), false),
            None => out.set_int(leaf, 0, false),
        },
        Ty::Message(_) => {}
        _ => out.set_int(leaf, 0, false),
    }
}

/// google.protobuf.Timestamp's seconds and nanos as epoch milliseconds.
fn timestamp_ms(data: &[u8]) -> Result<i64, ReadError> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    let mut i = 0;
    while i < data.len() {
        let tag = varint::unsigned(data, &mut i)?;
        match (tag >> 3, (tag & 7) as u8) {
            (1, VARINT) => seconds = varint::unsigned(data, &mut i)? as i64,
            (2, VARINT) => nanos = i64::from(varint::unsigned(data, &mut i)? as i32),
            (n, w) => skip(data, &mut i, w, n as u32, 0)?,
        }
    }
    seconds
        .checked_mul(1000)
        .and_then(|ms| ms.checked_add(nanos.div_euclid(1_000_000)))
        .ok_or(ReadError::Bad("a timestamp out of range"))
}

fn len_delimited<'a>(data: &'a [u8], i: &mut usize) -> Result<&'a [u8], ReadError> {
    let n = varint::unsigned(data, i)?;
    let n = usize::try_from(n).map_err(|_| ReadError::Bad("a length out of range"))?;
    take(data, i, n)
}

fn skip(data: &[u8], i: &mut usize, wire: u8, number: u32, depth: usize) -> Result<(), ReadError> {
    match wire {
        VARINT => {
            varint::unsigned(data, i)?;
        }
        I64 => {
            take(data, i, 8)?;
        }
        LEN => {
            len_delimited(data, i)?;
        }
        I32 => {
            take(data, i, 4)?;
        }
        SGROUP => {
            if depth > MAX_DEPTH {
                return Err(ReadError::TooDeep);
            }
            loop {
                let tag = varint::unsigned(data, i)?;
                let (n, w) = ((tag >> 3) as u32, (tag & 7) as u8);
                if w == EGROUP {
                    if n != number {
                        return Err(ReadError::Bad("a group that ends with another's number"));
                    }
                    return Ok(());
                }
                skip(data, i, w, n, depth + 1)?;
            }
        }
        _ => return Err(ReadError::Bad("an unknown wire type")),
    }
    Ok(())
}

/// Confluent's message indexes after the schema id: a zigzag count, then that many zigzag
/// indexes; a count of 0 means `[0]`, the first message. Returns how many bytes they took.
pub(crate) fn message_indexes(
    data: &[u8],
    into: &mut [u32; 16],
) -> Result<(usize, usize), ReadError> {
    let mut i = 0;
    let n = varint::zigzag(data, &mut i)?;
    if n == 0 {
        into[0] = 0;
        return Ok((1, i));
    }
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| n <= into.len())
        .ok_or(ReadError::Bad("a message index count out of range"))?;
    for slot in into.iter_mut().take(n) {
        let v = varint::zigzag(data, &mut i)?;
        *slot = u32::try_from(v).map_err(|_| ReadError::Bad("a negative message index"))?;
    }
    Ok((n, i))
}
