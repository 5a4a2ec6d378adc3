//! Avro object container files: a header (magic, metadata with the writer schema and the
//! codec, a sync marker), then blocks of datums, each block compressed by the file's codec and
//! followed by the marker. Each datum is a message whose offset is its position in the stream
//! of decompressed blocks, as a line's is in a compressed NDJSON file. A file may still be
//! written: a block not yet complete is left until it is.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::sync::Arc;

use apache_avro::Codec as BlockCodec;

use crate::format::{Compiled, SchemaCache};
use crate::source::{Message, Pull};

const MAGIC: &[u8; 4] = b"Obj\x01";

fn invalid(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.into())
}

pub(crate) struct AvroFileReader {
    file: File,
    /// The file's schema, and its number in the run's schema cache.
    compiled: Arc<Compiled>,
    schema: u32,
    codec: BlockCodec,
    sync: [u8; 16],
    /// Where the next block starts in the file.
    next_block: u64,
    /// The current block, decompressed; `pos` is the next datum in it.
    block: Vec<u8>,
    pos: usize,
    /// Datums left in the current block.
    left: i64,
    /// Stream offset of `block[0]`.
    base: i64,
    raw: Vec<u8>,
}

/// Reads `n` bytes at `at`, or fewer if the file ends first.
fn read_at(file: &mut File, at: u64, n: usize, into: &mut Vec<u8>) -> std::io::Result<()> {
    into.clear();
    file.seek(SeekFrom::Start(at))?;
    file.take(n as u64).read_to_end(into)?;
    Ok(())
}

/// A zigzag long at `b[*i..]`; None when the bytes end first.
fn long(b: &[u8], i: &mut usize) -> std::io::Result<Option<i64>> {
    let mut j = *i;
    match crate::format::varint::zigzag(b, &mut j) {
        Ok(v) => {
            *i = j;
            Ok(Some(v))
        }
        Err(_) if b.len() - *i < 10 => Ok(None),
        Err(_) => Err(invalid("a malformed block header")),
    }
}

impl AvroFileReader {
    /// Opens `file` at stream offset `start` (a datum boundary a checkpoint recorded).
    pub(crate) fn open(
        mut file: File,
        start: i64,
        schemas: &Arc<SchemaCache>,
    ) -> std::io::Result<AvroFileReader> {
        let mut head = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        (&mut file).take(1 << 20).read_to_end(&mut head)?;
        if head.len() < 4 || &head[..4] != MAGIC {
            return Err(invalid(
                "not an Avro object container file (no 'Obj' magic)",
            ));
        }
        let mut i = 4;
        let (mut schema_text, mut codec) = (None, "null".to_string());
        let truncated = || invalid("the file header is incomplete");
        loop {
            let mut count = long(&head, &mut i)?.ok_or_else(truncated)?;
            if count == 0 {
                break;
            }
            if count < 0 {
                count = -count;
                long(&head, &mut i)?.ok_or_else(truncated)?;
            }
            for _ in 0..count {
                let k = bytes(&head, &mut i).ok_or_else(truncated)?;
                let v = bytes(&head, &mut i).ok_or_else(truncated)?;
                match k {
                    b"avro.schema" => schema_text = Some(String::from_utf8_lossy(v).into_owned()),
                    b"avro.codec" => codec = String::from_utf8_lossy(v).into_owned(),
                    _ => {}
                }
            }
        }
        let sync: [u8; 16] = head
            .get(i..i + 16)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(truncated)?;
        let schema_text = schema_text.ok_or_else(|| invalid("the header has no avro.schema"))?;
        let schema = schemas
            .add_file_schema(&schema_text)
            .map_err(|e| invalid(format!("its schema cannot be read: {e}")))?;
        let codec: BlockCodec = codec
            .parse()
            .map_err(|_| invalid(format!("its codec '{codec}' is not supported")))?;
        let compiled = schemas
            .file(schema)
            .ok_or_else(|| invalid("its schema is not in the run's cache"))?;
        let mut r = AvroFileReader {
            file,
            compiled,
            schema,
            codec,
            sync,
            next_block: (i + 16) as u64,
            block: Vec::new(),
            pos: 0,
            left: 0,
            base: 0,
            raw: Vec::new(),
        };
        // Whole blocks before `start` are passed over; the datums before it in its block too.
        while r.base + r.block.len() as i64 <= start {
            (r.pos, r.left) = (r.block.len(), 0);
            if !r.next()? {
                break;
            }
        }
        let skip = start - r.base;
        if skip < 0 || skip > r.block.len() as i64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the file's datums end at {}, before the checkpointed offset {start}",
                    r.base + r.block.len() as i64
                ),
            ));
        }
        while (r.pos as i64) < skip {
            r.step()?;
        }
        if r.pos as i64 != skip {
            return Err(invalid(format!(
                "the checkpointed offset {start} is not where a datum starts"
            )));
        }
        Ok(r)
    }

    /// The stream offset of the next datum.
    pub(crate) fn offset(&self) -> i64 {
        self.base + self.pos as i64
    }

    /// The length of the next datum, counted down from the block's datums.
    fn step(&mut self) -> std::io::Result<usize> {
        let rest = &self.block[self.pos..];
        let len = match &*self.compiled {
            Compiled::Avro(s) => s.datum_len(rest),
            _ => Err(crate::format::bytes::ReadError::Bad("not an Avro schema")),
        };
        let n = len.map_err(|_| {
            invalid(format!(
                "a datum at offset {} does not match the file's schema",
                self.offset()
            ))
        })?;
        self.pos += n;
        self.left -= 1;
        Ok(n)
    }

    /// Loads the next block; false when the file has no complete block after this one (yet).
    fn next(&mut self) -> std::io::Result<bool> {
        if self.left > 0 || self.pos < self.block.len() {
            return Err(invalid(format!(
                "a block ends with bytes its datum count does not cover, at offset {}",
                self.offset()
            )));
        }
        let at = self.next_block;
        read_at(&mut self.file, at, 20, &mut self.raw)?;
        let mut i = 0;
        let Some(count) = long(&self.raw, &mut i)? else {
            return Ok(false);
        };
        let Some(size) = long(&self.raw, &mut i)? else {
            return Ok(false);
        };
        let (Ok(count), Ok(size)) = (u64::try_from(count), usize::try_from(size)) else {
            return Err(invalid("a block with a negative count or size"));
        };
        read_at(&mut self.file, at + i as u64, size + 16, &mut self.raw)?;
        if self.raw.len() < size + 16 {
            return Ok(false);
        }
        if self.raw[size..] != self.sync {
            return Err(invalid(format!(
                "the block at byte {at} does not end with the file's sync marker"
            )));
        }
        self.raw.truncate(size);
        self.codec.decompress(&mut self.raw).map_err(|e| {
            invalid(format!(
                "the block at byte {at} cannot be decompressed: {e}"
            ))
        })?;
        self.base += self.block.len() as i64;
        std::mem::swap(&mut self.block, &mut self.raw);
        self.pos = 0;
        self.left = count as i64;
        self.next_block = at + (i + size + 16) as u64;
        Ok(true)
    }

    /// Hands datums to `each` until it returns false or no complete block is left.
    pub(crate) fn pull(
        &mut self,
        each: &mut dyn FnMut(&Message<'_>) -> bool,
    ) -> std::io::Result<Pull> {
        loop {
            while self.left > 0 {
                let offset = self.offset();
                let start = self.pos;
                let n = self.step()?;
                let msg = Message {
                    offset,
                    next_offset: offset + n as i64,
                    payload: &self.block[start..start + n],
                    key: None,
                    timestamp: None,
                    schema: Some(self.schema),
                };
                if !each(&msg) {
                    return Ok(Pull::Paused);
                }
            }
            if !self.next()? {
                return Ok(Pull::Exhausted);
            }
        }
    }
}

fn bytes<'a>(b: &'a [u8], i: &mut usize) -> Option<&'a [u8]> {
    let mut j = *i;
    let n = usize::try_from(crate::format::varint::zigzag(b, &mut j).ok()?).ok()?;
    let s = b.get(j..j.checked_add(n)?)?;
    *i = j + n;
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Record;
    use apache_avro::{Codec, Schema, Writer};

    const SCHEMA: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"key","type":"string"},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}},
        {"name":"amount","type":["null","double"]}]}"#;

    fn file(codec: Codec, n: usize, block: usize) -> std::path::PathBuf {
        let schema = Schema::parse_str(SCHEMA).unwrap();
        let mut w = Writer::builder()
            .schema(&schema)
            .writer(Vec::new())
            .codec(codec)
            .block_size(block)
            .build();
        for i in 0..n {
            let mut r = Record::new(&schema).unwrap();
            r.put("key", format!("k{}", i % 3));
            r.put(
                "ts",
                apache_avro::types::Value::TimestampMillis(1000 + i as i64),
            );
            r.put(
                "amount",
                apache_avro::types::Value::Union(
                    1,
                    Box::new(apache_avro::types::Value::Double(i as f64)),
                ),
            );
            w.append(r).unwrap();
        }
        let bytes = w.into_inner().unwrap();
        let p = std::env::temp_dir().join(format!(
            "setl-avro-{}-{codec:?}-{n}-{block}.avro",
            std::process::id()
        ));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn read_all(p: &std::path::Path, start: i64) -> Vec<(i64, i64)> {
        let cache = SchemaCache::new();
        let mut r = AvroFileReader::open(File::open(p).unwrap(), start, &cache).unwrap();
        let mut got = Vec::new();
        assert_eq!(
            r.pull(&mut |m| {
                got.push((m.offset, m.next_offset));
                true
            })
            .unwrap(),
            Pull::Exhausted
        );
        got
    }

    #[test]
    fn datums_of_every_block_with_offsets_that_resume_exactly() {
        for codec in [
            Codec::Null,
            Codec::Deflate(Default::default()),
            Codec::Snappy,
        ] {
            let p = file(codec, 500, 64);
            let all = read_all(&p, 0);
            assert_eq!(all.len(), 500, "{codec:?}");
            for w in all.windows(2) {
                assert_eq!(w[0].1, w[1].0);
            }
            for cut in [1, 7, 250, 499] {
                assert_eq!(
                    read_all(&p, all[cut].0),
                    all[cut..].to_vec(),
                    "{codec:?} {cut}"
                );
            }
            assert!(read_all(&p, all[499].1).is_empty());
        }
    }

    #[test]
    fn an_incomplete_last_block_waits_and_a_bad_marker_is_an_error() {
        let p = file(Codec::Null, 100, 64);
        let bytes = std::fs::read(&p).unwrap();
        let n = read_all(&p, 0).len();
        let cut = p.with_extension("cut.avro");
        std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
        let partial = read_all(&cut, 0).len();
        assert!(partial < n && partial > 0);
        let mut damaged = bytes.clone();
        let len = damaged.len();
        damaged[len - 1] ^= 0xff;
        let bad = p.with_extension("bad.avro");
        std::fs::write(&bad, &damaged).unwrap();
        let cache = SchemaCache::new();
        let mut r = AvroFileReader::open(File::open(&bad).unwrap(), 0, &cache).unwrap();
        assert!(r.pull(&mut |_| true).is_err());
        let not = p.with_extension("not.avro");
        std::fs::write(&not, b"{\"a\":1}\n").unwrap();
        assert!(AvroFileReader::open(File::open(&not).unwrap(), 0, &cache).is_err());
    }
}
