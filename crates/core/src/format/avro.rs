//! Avro: a writer schema (from the registry, or from an object container file's header),
//! parsed by `apache-avro` and flattened here into a table of nodes, read in one pass per
//! datum for just the job's paths. Fields no path names are skipped by their encoded length;
//! nothing is allocated per record (see docs/benchmarks.md, "Message formats", for why this
//! is not `apache_avro::from_avro_datum`, which builds a `Value` tree with owned names).

use std::collections::HashMap;

use apache_avro::Schema;

use super::bytes::{array, take, ReadError};
use super::spans::{all_paths, masks, Out};
use super::varint;
use crate::decode::{FieldPath, Kind, MAX_DEPTH};

/// A schema flattened into nodes (named types are shared, so recursive types are finite).
#[derive(Debug)]
pub(crate) struct AvroSchema {
    nodes: Vec<Node>,
    root: usize,
    /// As parsed, with the schemas its references named (for the whole record as JSON).
    parsed: Schema,
    references: Vec<Schema>,
}

#[derive(Debug)]
enum Node {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Fixed(usize),
    Enum(Vec<String>),
    /// A long of epoch milliseconds, microseconds or nanoseconds: an event time.
    Timestamp(i64),
    /// The `decimal` logical type: a big-endian two's-complement unscaled integer in bytes
    /// (`size` None) or a fixed of `size` bytes, with `scale` digits after the point; read as
    /// the number it is.
    Decimal {
        scale: usize,
        size: Option<usize>,
    },
    Record(Vec<(String, usize)>),
    Array(usize),
    Map(usize),
    Union(Vec<usize>),
    /// A named type not yet filled in (only while building).
    Pending,
}

impl AvroSchema {
    /// Parses `text` (an Avro schema in JSON), with `references`: the schemas that define the
    /// named types it refers to.
    pub(crate) fn parse(text: &str, references: &[String]) -> Result<AvroSchema, String> {
        let (root, refs) = if references.is_empty() {
            (
                Schema::parse_str(text).map_err(|e| e.to_string())?,
                Vec::new(),
            )
        } else {
            Schema::parse_str_with_list(text, references).map_err(|e| e.to_string())?
        };
        let mut b = Builder {
            nodes: Vec::new(),
            names: HashMap::new(),
        };
        for r in &refs {
            b.add(r, None)?;
        }
        let at = b.add(&root, None)?;
        Ok(AvroSchema {
            nodes: b.nodes,
            root: at,
            parsed: root,
            references: refs,
        })
    }

    /// The whole datum as JSON (late events keep their payload so), decoded by apache-avro;
    /// a datum apache-avro does not render (one with a `decimal`) is rendered here.
    pub(crate) fn json(&self, datum: &[u8]) -> Option<String> {
        let refs: Vec<&Schema> = self.references.iter().collect();
        let apache =
            apache_avro::from_avro_datum_schemata(&self.parsed, refs, &mut &datum[..], None)
                .ok()
                .and_then(|v| serde_json::Value::try_from(v).ok());
        if let Some(j) = apache {
            return Some(j.to_string());
        }
        let mut out = String::new();
        let mut r = Cursor { b: datum, i: 0 };
        self.render(&mut r, self.root, 0, &mut out).ok()?;
        Some(out)
    }

    /// Writes the value of `node` at `r` as JSON: unions as their branch's value, bytes and
    /// fixed as text (lossy), decimals as numbers.
    fn render(
        &self,
        r: &mut Cursor<'_>,
        node: usize,
        depth: usize,
        out: &mut String,
    ) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::TooDeep);
        }
        let text = |out: &mut String, b: &[u8]| {
            crate::decode::json_string(&String::from_utf8_lossy(b), out);
        };
        match &self.nodes[node] {
            Node::Null => out.push_str("null"),
            Node::Boolean => out.push_str(if r.take(1)?[0] == 1 { "true" } else { "false" }),
            Node::Int | Node::Long | Node::Timestamp(_) => {
                out.push_str(&varint::zigzag(r.b, &mut r.i)?.to_string());
            }
            Node::Float => {
                let v = f32::from_le_bytes(array(r.b, &mut r.i)?);
                out.push_str(&serde_json::Value::from(f64::from(v)).to_string());
            }
            Node::Double => {
                let v = f64::from_le_bytes(array(r.b, &mut r.i)?);
                out.push_str(&serde_json::Value::from(v).to_string());
            }
            Node::String | Node::Bytes => text(out, r.bytes()?),
            Node::Fixed(n) => text(out, r.take(*n)?),
            Node::Decimal { scale, size } => out.push_str(&r.decimal(*scale, *size)?),
            Node::Enum(symbols) => text(out, r.symbol(symbols)?.as_bytes()),
            Node::Union(branches) => {
                let b = r.branch(branches)?;
                self.render(r, b, depth, out)?;
            }
            Node::Record(fields) => {
                out.push('{');
                for (k, (name, child)) in fields.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    text(out, name.as_bytes());
                    out.push(':');
                    self.render(r, *child, depth + 1, out)?;
                }
                out.push('}');
            }
            Node::Array(items) | Node::Map(items) => {
                let map = matches!(self.nodes[node], Node::Map(_));
                let items = *items;
                out.push(if map { '{' } else { '[' });
                let mut first = true;
                self.blocks(r, |s, r| {
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    if map {
                        let key = r.bytes()?;
                        text(out, key);
                        out.push(':');
                    }
                    s.render(r, items, depth + 1, out)
                })?;
                out.push(if map { '}' } else { ']' });
            }
            Node::Pending => return Err(ReadError::Bad("an unresolved named type")),
        }
        Ok(())
    }

    /// The length of the datum at the start of `data` (object container files hold datums
    /// back to back).
    pub(crate) fn datum_len(&self, data: &[u8]) -> Result<usize, ReadError> {
        let mut r = Cursor { b: data, i: 0 };
        self.skip(&mut r, self.root, 0)?;
        Ok(r.i)
    }

    /// Reads the paths of `plan` out of `datum` (which must be exactly one datum).
    pub(crate) fn read(
        &self,
        plan: &AvroPlan,
        datum: &[u8],
        out: &mut Out<'_>,
    ) -> Result<(), ReadError> {
        let mut r = Cursor { b: datum, i: 0 };
        let all = plan.all;
        self.value(plan, &mut r, self.root, 0, 0, all, out)?;
        if r.i != datum.len() {
            return Err(ReadError::Bad("bytes left after the record"));
        }
        Ok(())
    }

    /// For `paths`, which paths each record field is the end of, or on the way to, by depth.
    pub(crate) fn plan(&self, paths: &[FieldPath]) -> AvroPlan {
        let depth = paths.iter().map(|p| p.segments().len()).max().unwrap_or(0);
        let masks = (0..depth)
            .map(|d| {
                self.nodes
                    .iter()
                    .map(|n| match n {
                        Node::Record(fields) => Some(
                            fields
                                .iter()
                                .map(|(name, _)| masks(paths, d, name.as_bytes()))
                                .collect(),
                        ),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        AvroPlan {
            masks,
            all: all_paths(paths.len()),
            segments: paths
                .iter()
                .map(|p| p.segments().iter().map(|s| s.to_vec()).collect())
                .collect(),
        }
    }

    /// `leaf`: paths that end at this value; `deeper`: paths that go on inside it.
    #[allow(clippy::too_many_arguments)]
    fn value(
        &self,
        plan: &AvroPlan,
        r: &mut Cursor<'_>,
        node: usize,
        depth: usize,
        leaf: u64,
        deeper: u64,
        out: &mut Out<'_>,
    ) -> Result<(), ReadError> {
        if leaf | deeper == 0 {
            return self.skip(r, node, depth);
        }
        if depth > MAX_DEPTH {
            return Err(ReadError::TooDeep);
        }
        match &self.nodes[node] {
            Node::Null => out.set(leaf, Kind::Null),
            Node::Boolean => {
                let b = r.take(1)?[0];
                let text: &[u8] = match b {
                    0 => b"false",
                    1 => b"true",
                    _ => return Err(ReadError::Bad("a boolean that is neither 0 nor 1")),
                };
                out.set_scratch(leaf, Kind::Bool, text, false);
            }
            Node::Int | Node::Long => {
                let v = varint::zigzag(r.b, &mut r.i)?;
                out.set_int(leaf, v, false);
            }
            Node::Timestamp(per_ms) => {
                let v = varint::zigzag(r.b, &mut r.i)?;
                out.set_int(leaf, v.div_euclid(*per_ms), true);
            }
            Node::Float => {
                out.set_f32(leaf, f32::from_le_bytes(array(r.b, &mut r.i)?));
            }
            Node::Double => {
                out.set_float(leaf, f64::from_le_bytes(array(r.b, &mut r.i)?));
            }
            Node::String | Node::Bytes => {
                let s = r.bytes()?;
                out.set_raw(leaf, r.i - s.len(), s);
            }
            Node::Fixed(n) => {
                let s = r.take(*n)?;
                out.set_raw(leaf, r.i - s.len(), s);
            }
            Node::Decimal { scale, size } => {
                let text = r.decimal(*scale, *size)?;
                out.set_scratch(leaf, Kind::Number, text.as_bytes(), *scale == 0);
            }
            Node::Enum(symbols) => {
                out.set_scratch(leaf, Kind::String, r.symbol(symbols)?.as_bytes(), false);
            }
            Node::Union(branches) => {
                let b = r.branch(branches)?;
                return self.value(plan, r, b, depth, leaf, deeper, out);
            }
            Node::Record(fields) => {
                out.set(leaf, Kind::Object);
                let masks = plan.masks.get(depth).and_then(|m| m[node].as_deref());
                for (f, &(_, child)) in fields.iter().enumerate() {
                    let (l, d) = match (masks, deeper) {
                        (Some(m), active) if active != 0 => (m[f].0 & active, m[f].1 & active),
                        _ => (0, 0),
                    };
                    self.value(plan, r, child, depth + 1, l, d, out)?;
                }
            }
            Node::Map(values) => {
                out.set(leaf, Kind::Object);
                self.blocks(r, |s, r| {
                    let key = r.bytes()?;
                    let (l, d) = plan.key_masks(deeper, depth, key);
                    s.value(plan, r, *values, depth + 1, l, d, out)
                })?;
            }
            Node::Array(items) => {
                out.set(leaf, Kind::Array);
                self.blocks(r, |s, r| s.skip(r, *items, depth + 1))?;
            }
            Node::Pending => return Err(ReadError::Bad("an unresolved named type")),
        }
        Ok(())
    }

    /// Arrays and maps: blocks of items, each block a count (negative: followed by its size in
    /// bytes), ending with an empty block.
    fn blocks(
        &self,
        r: &mut Cursor<'_>,
        mut item: impl FnMut(&Self, &mut Cursor<'_>) -> Result<(), ReadError>,
    ) -> Result<(), ReadError> {
        loop {
            let mut count = varint::zigzag(r.b, &mut r.i)?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                count = count
                    .checked_neg()
                    .ok_or(ReadError::Bad("a block count out of range"))?;
                varint::zigzag(r.b, &mut r.i)?;
            }
            for _ in 0..count {
                item(self, r)?;
            }
        }
    }

    fn skip(&self, r: &mut Cursor<'_>, node: usize, depth: usize) -> Result<(), ReadError> {
        if depth > MAX_DEPTH {
            return Err(ReadError::TooDeep);
        }
        match &self.nodes[node] {
            Node::Null => {}
            Node::Boolean => {
                r.take(1)?;
            }
            Node::Int | Node::Long | Node::Enum(_) | Node::Timestamp(_) => {
                varint::zigzag(r.b, &mut r.i)?;
            }
            Node::Float => {
                r.take(4)?;
            }
            Node::Double => {
                r.take(8)?;
            }
            Node::String | Node::Bytes => {
                r.bytes()?;
            }
            Node::Fixed(n) | Node::Decimal { size: Some(n), .. } => {
                r.take(*n)?;
            }
            Node::Decimal { size: None, .. } => {
                r.bytes()?;
            }
            Node::Union(branches) => {
                let b = r.branch(branches)?;
                self.skip(r, b, depth)?;
            }
            Node::Record(fields) => {
                for &(_, child) in fields {
                    self.skip(r, child, depth + 1)?;
                }
            }
            Node::Array(items) | Node::Map(items) => {
                let map = matches!(self.nodes[node], Node::Map(_));
                let items = *items;
                loop {
                    let count = varint::zigzag(r.b, &mut r.i)?;
                    if count == 0 {
                        break;
                    }
                    if count < 0 {
                        // A block with its size: skipped whole.
                        let size = varint::zigzag(r.b, &mut r.i)?;
                        let size = usize::try_from(size)
                            .map_err(|_| ReadError::Bad("a negative block size"))?;
                        r.take(size)?;
                        continue;
                    }
                    for _ in 0..count {
                        if map {
                            r.bytes()?;
                        }
                        self.skip(r, items, depth + 1)?;
                    }
                }
            }
            Node::Pending => return Err(ReadError::Bad("an unresolved named type")),
        }
        Ok(())
    }
}

/// Per field of a record: the paths that end at it, and those that go on inside it.
type FieldMasks = Box<[(u64, u64)]>;

/// What a decoder reads from datums of one schema: per depth and record node, each field's
/// (leaf, deeper) path masks.
#[derive(Debug)]
pub(crate) struct AvroPlan {
    masks: Vec<Vec<Option<FieldMasks>>>,
    all: u64,
    segments: Vec<Vec<Vec<u8>>>,
}

impl AvroPlan {
    /// A map's key against the active paths' segment at `depth`.
    fn key_masks(&self, active: u64, depth: usize, key: &[u8]) -> (u64, u64) {
        let (mut leaf, mut deeper) = (0, 0);
        for (i, segs) in self.segments.iter().enumerate() {
            if active & (1 << i) != 0 && segs.get(depth).map(Vec::as_slice) == Some(key) {
                if segs.len() == depth + 1 {
                    leaf |= 1 << i;
                } else {
                    deeper |= 1 << i;
                }
            }
        }
        (leaf, deeper)
    }
}

struct Builder {
    nodes: Vec<Node>,
    names: HashMap<String, usize>,
}

impl Builder {
    fn push(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    fn add(&mut self, s: &Schema, ns: Option<&str>) -> Result<usize, String> {
        let node = match s {
            Schema::Null => Node::Null,
            Schema::Boolean => Node::Boolean,
            Schema::Int | Schema::Date | Schema::TimeMillis => Node::Int,
            Schema::Long | Schema::TimeMicros => Node::Long,
            Schema::Float => Node::Float,
            Schema::Double => Node::Double,
            Schema::Bytes | Schema::BigDecimal => Node::Bytes,
            Schema::String | Schema::Uuid => Node::String,
            Schema::TimestampMillis | Schema::LocalTimestampMillis => Node::Timestamp(1),
            Schema::TimestampMicros | Schema::LocalTimestampMicros => Node::Timestamp(1_000),
            Schema::TimestampNanos | Schema::LocalTimestampNanos => Node::Timestamp(1_000_000),
            Schema::Duration => Node::Fixed(12),
            Schema::Decimal(d) => Node::Decimal {
                scale: d.scale,
                size: match &*d.inner {
                    Schema::Fixed(f) => Some(f.size),
                    _ => None,
                },
            },
            Schema::Array(a) => {
                let items = self.add(&a.items, ns)?;
                Node::Array(items)
            }
            Schema::Map(m) => {
                let values = self.add(&m.types, ns)?;
                Node::Map(values)
            }
            Schema::Union(u) => {
                let branches = u
                    .variants()
                    .iter()
                    .map(|v| self.add(v, ns))
                    .collect::<Result<Vec<_>, _>>()?;
                Node::Union(branches)
            }
            Schema::Fixed(f) => return Ok(self.named(&f.name.fullname(None), Node::Fixed(f.size))),
            Schema::Enum(e) => {
                let node = Node::Enum(e.symbols.clone());
                return Ok(self.named(&e.name.fullname(None), node));
            }
            Schema::Record(r) => {
                let full = r.name.fullname(None);
                if let Some(&i) = self.names.get(&full) {
                    return Ok(i);
                }
                // Registered before its fields, so that a field may refer to the record.
                let at = self.named(&full, Node::Pending);
                let inner = r.name.namespace.clone();
                let mut fields = Vec::with_capacity(r.fields.len());
                for f in &r.fields {
                    fields.push((f.name.clone(), self.add(&f.schema, inner.as_deref())?));
                }
                self.nodes[at] = Node::Record(fields);
                return Ok(at);
            }
            Schema::Ref { name } => {
                let full = name.fullname(ns.map(str::to_string));
                return self
                    .names
                    .get(&full)
                    .or_else(|| self.names.get(&name.fullname(None)))
                    .copied()
                    .ok_or_else(|| format!("the schema refers to an unknown type '{full}'"));
            }
        };
        Ok(self.push(node))
    }

    fn named(&mut self, full: &str, node: Node) -> usize {
        if let Some(&i) = self.names.get(full) {
            return i;
        }
        let i = self.push(node);
        self.names.insert(full.to_string(), i);
        i
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        take(self.b, &mut self.i, n)
    }

    /// A union's branch: its index, then the node it names.
    #[inline]
    fn branch(&mut self, branches: &[usize]) -> Result<usize, ReadError> {
        let i = varint::zigzag(self.b, &mut self.i)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| branches.get(i))
            .copied()
            .ok_or(ReadError::Bad("a union index outside its branches"))
    }

    /// A length-prefixed string or bytes.
    #[inline]
    /// A `decimal` (bytes, or a fixed of `size` bytes) as its text.
    fn decimal(&mut self, scale: usize, size: Option<usize>) -> Result<String, ReadError> {
        let s = match size {
            Some(n) => self.take(n)?,
            None => self.bytes()?,
        };
        decimal_text(s, scale)
    }

    /// An enum's symbol.
    fn symbol<'s>(&mut self, symbols: &'s [String]) -> Result<&'s str, ReadError> {
        let i = varint::zigzag(self.b, &mut self.i)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| symbols.get(i))
            .map(String::as_str)
            .ok_or(ReadError::Bad("an enum index outside its symbols"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], ReadError> {
        let n = varint::zigzag(self.b, &mut self.i)?;
        let n = usize::try_from(n).map_err(|_| ReadError::Bad("a negative length"))?;
        self.take(n)
    }
}

/// The decimal text of a big-endian two's-complement unscaled integer with `scale` digits after
/// the point (`-1234`, scale 2: `-12.34`).
pub(crate) fn decimal_text(b: &[u8], scale: usize) -> Result<String, ReadError> {
    if b.len() > 16 {
        return Err(ReadError::Bad("a decimal wider than 16 bytes"));
    }
    let mut v: i128 = if b.first().is_some_and(|&x| x & 0x80 != 0) {
        -1
    } else {
        0
    };
    for &x in b {
        v = (v << 8) | i128::from(x);
    }
    let digits = v.unsigned_abs().to_string();
    let sign = if v < 0 { "-" } else { "" };
    if scale == 0 {
        return Ok(format!("{sign}{digits}"));
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    Ok(format!("{sign}{int}.{frac}"))
}
