//! The embedded source: NDJSON files matched by a pattern (`file:<glob>`). Each file is one
//! partition for its whole life, identified by its device and inode as well as its path:
//! renamed (log rotation), it keeps its partition and is read to its end under the new name; a
//! new file at the old path is a new partition. Partitions are numbered in the sorted order of
//! the paths matched at the job's first run; a file that appears later gets the next free
//! number. A message's offset is the byte position where its line starts (in the decompressed
//! stream for `.gz` / `.zst`). A file that shrinks is an error (copytruncate loses data); a file
//! deleted before it was read to its end is reported as a dead letter naming what was lost.
//! (The last quarter of the file is its tests: rotation, deletion, truncation, discovery.)

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::chunk::Chunk;
use crate::error::{EtlError, Result};
use crate::format::SchemaCache;
use crate::source::avro_file::AvroFileReader;
use crate::source::glob::{allowed, glob, PathPolicy};
use crate::source::lines::{Codec, LineReader};
use crate::source::{Gap, Message, Pull, Source, SourcePartition};
use crate::state::PartitionState;

/// How a file source is opened.
#[derive(Clone, Default)]
pub struct FileOptions {
    /// Which paths may be listed and read (DuckDB's sandbox); None: any.
    pub policy: Option<PathPolicy>,
    /// A new job starts at the current end of the files that exist (`start := 'latest'`).
    pub start_at_end: bool,
    /// The files are Avro object container files (`format := 'avro'`); their schemas go here.
    pub avro: Option<Arc<SchemaCache>>,
}

/// How a read stopped, and the offset after the last message it took.
type Read = (Pull, Option<i64>);

/// What reads a file's messages: its lines, or an Avro file's datums.
enum Reader {
    Lines(LineReader),
    Avro(AvroFileReader),
}

impl Reader {
    fn open(
        file: File,
        codec: Codec,
        start: i64,
        buf: usize,
        avro: Option<&Arc<SchemaCache>>,
    ) -> std::io::Result<Reader> {
        match avro {
            Some(schemas) => AvroFileReader::open(file, start, schemas).map(Reader::Avro),
            None => LineReader::open(file, codec, start, buf).map(Reader::Lines),
        }
    }

    fn pull(&mut self, each: &mut dyn FnMut(&Message<'_>) -> bool) -> std::io::Result<Pull> {
        match self {
            Reader::Lines(r) => r.pull(each),
            Reader::Avro(r) => r.pull(each),
        }
    }

    fn offset(&self) -> i64 {
        match self {
            Reader::Lines(r) => r.offset(),
            Reader::Avro(r) => r.offset(),
        }
    }

    /// An immutable (compressed) stream was read to its end.
    fn finished(&self) -> bool {
        match self {
            Reader::Lines(r) => r.finished(),
            Reader::Avro(_) => false,
        }
    }
}

/// Bytes at the start of a file that go into its identity.
const FINGERPRINT: u64 = 256;

/// A file's identity: device and inode, and a hash of its first bytes (up to 256), since an
/// inode is reused once its file is deleted: `dev:ino/len/hash`. Files only grow, so a file
/// keeps matching the identity recorded when it was shorter.
fn identity(path: &Path, meta: &std::fs::Metadata) -> String {
    let len = meta.len().min(FINGERPRINT);
    let hash = prefix_hash(path, len).unwrap_or(0);
    format!("{}:{}/{len}/{hash:016x}", meta.dev(), meta.ino())
}

fn prefix_hash(path: &Path, len: u64) -> Option<u64> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(len as usize);
    File::open(path)
        .ok()?
        .take(len)
        .read_to_end(&mut buf)
        .ok()?;
    (buf.len() as u64 == len).then(|| crate::hll::hash64(&buf))
}

/// Whether the file at `path` (with `meta`) is the one `known` identifies.
fn same_file(known: &str, path: &Path, meta: &std::fs::Metadata) -> bool {
    let mut parts = known.split('/');
    let inode = format!("{}:{}", meta.dev(), meta.ino());
    if parts.next() != Some(inode.as_str()) {
        return false;
    }
    match (
        parts.next().and_then(|l| l.parse::<u64>().ok()),
        parts.next(),
    ) {
        (Some(len), Some(hash)) => {
            meta.len() >= len && prefix_hash(path, len).is_some_and(|h| format!("{h:016x}") == hash)
        }
        // An identity without a fingerprint (none such is written, but be lenient).
        _ => true,
    }
}

struct Slot {
    path: PathBuf,
    codec: Codec,
    reader: Option<Reader>,
    /// The size last seen (plain files), or the decompressed length once read to the end.
    size: Option<i64>,
    next: i64,
}

pub struct FileSource {
    source_name: String,
    pattern: String,
    opts: FileOptions,
    parts: Vec<SourcePartition>,
    slots: Vec<Slot>,
    gaps: Vec<Gap>,
    buf_size: usize,
    next_free: i32,
    only: Option<Vec<i32>>,
}

/// A file the pattern matches now.
struct Found {
    path: PathBuf,
    identity: String,
    size: i64,
    meta: std::fs::Metadata,
}

fn find(source_name: &str, pattern: &str, policy: Option<&PathPolicy>) -> Result<Vec<Found>> {
    let err = |m: String| EtlError::source(source_name, m);
    let mut out = Vec::new();
    for path in glob(pattern, policy).map_err(err)? {
        // A file renamed or deleted between the listing and here (a log being rotated) is not
        // an error: under its new name it is found by the next look.
        let abs = match std::fs::canonicalize(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            r => r.map_err(|e| err(format!("cannot resolve '{}': {e}", path.display())))?,
        };
        let meta = match std::fs::metadata(&abs) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            r => r.map_err(|e| err(format!("cannot read '{}': {e}", abs.display())))?,
        };
        // Two names of one file (hard links, symlinks) are one partition.
        if out
            .iter()
            .any(|f: &Found| f.meta.dev() == meta.dev() && f.meta.ino() == meta.ino())
        {
            continue;
        }
        out.push(Found {
            identity: identity(&abs, &meta),
            path: abs,
            size: meta.len() as i64,
            meta,
        });
    }
    Ok(out)
}

/// Looks in `dir` for the file with this identity (a file renamed out of the pattern's reach).
fn renamed_in(dir: &Path, id: &str, policy: Option<&PathPolicy>) -> Option<Found> {
    allowed(policy, dir).ok()?;
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let meta = e.metadata().ok()?;
        let path = e.path();
        (meta.is_file() && same_file(id, &path, &meta)).then(|| Found {
            identity: identity(&path, &meta),
            path,
            size: meta.len() as i64,
            meta,
        })
    })
}

impl FileSource {
    /// Opens the files `pattern` matches, keeping the partitions the checkpoint knows (`known`:
    /// number, path, identity, next offset) and numbering new files after them.
    pub fn open(
        source_name: &str,
        pattern: &str,
        known: &[PartitionState],
        only: Option<&[i32]>,
        opts: FileOptions,
    ) -> Result<FileSource> {
        let policy = opts.policy.clone();
        let found = find(source_name, pattern, policy.as_ref())?;
        if found.is_empty() && known.is_empty() {
            return Err(EtlError::source(
                source_name,
                format!("no file matches '{pattern}'"),
            ));
        }
        let mut src = FileSource {
            source_name: source_name.to_string(),
            pattern: pattern.to_string(),
            parts: Vec::new(),
            slots: Vec::new(),
            gaps: Vec::new(),
            buf_size: 1 << 20,
            next_free: known.iter().map(|k| k.partition + 1).max().unwrap_or(0),
            only: only.map(<[i32]>::to_vec),
            opts,
        };
        let mut taken = vec![false; found.len()];
        let mut sorted: Vec<&PartitionState> = known.iter().collect();
        sorted.sort_by_key(|k| k.partition);
        for k in sorted {
            let hit = if k.status == "deleted" {
                None
            } else if !k.identity.is_empty() {
                match found
                    .iter()
                    .position(|f| same_file(&k.identity, &f.path, &f.meta))
                {
                    Some(j) => {
                        taken[j] = true;
                        Some(found_clone(&found[j]))
                    }
                    None => {
                        src.check_truncated(k)?;
                        Path::new(&k.name)
                            .parent()
                            .and_then(|dir| renamed_in(dir, &k.identity, policy.as_ref()))
                    }
                }
            } else {
                // A checkpoint of version 0.1 knew files by path only.
                found
                    .iter()
                    .position(|f| f.path.to_string_lossy() == k.name)
                    .map(|j| {
                        taken[j] = true;
                        found_clone(&found[j])
                    })
            };
            src.add_known(k, hit)?;
        }
        let first_run = known.is_empty();
        for (j, f) in found.into_iter().enumerate() {
            if !taken[j] {
                let start = if first_run && src.opts.start_at_end {
                    end_of(&f, src.opts.avro.as_ref())?
                } else {
                    0
                };
                src.add_new(f, start);
            }
        }
        if let Some(only) = only {
            let missing: Vec<i32> = only
                .iter()
                .copied()
                .filter(|o| !src.parts.iter().any(|p| p.partition == *o))
                .collect();
            if !missing.is_empty() {
                return Err(EtlError::source(
                    source_name,
                    format!(
                        "partitions {missing:?} do not exist: '{pattern}' matches partitions {:?}",
                        src.parts.iter().map(|p| p.partition).collect::<Vec<_>>()
                    ),
                ));
            }
        }
        src.restrict();
        // Every partition is read at once (in event-time order), so the buffers share a budget.
        src.buf_size = ((64 << 20) / src.parts.len().max(1)).clamp(64 << 10, 1 << 20);
        Ok(src)
    }

    /// The file is still at its path with its inode, but its first bytes changed or it is
    /// shorter: it was truncated (and maybe written again) in place.
    fn check_truncated(&self, k: &PartitionState) -> Result<()> {
        let Ok(meta) = std::fs::metadata(&k.name) else {
            return Ok(());
        };
        let inode = format!("{}:{}/", meta.dev(), meta.ino());
        // Still the same file (moved out of the pattern's reach): not truncated.
        if k.identity.starts_with(&inode) && !same_file(&k.identity, Path::new(&k.name), &meta) {
            return Err(EtlError::source(
                &self.source_name,
                format!(
                    "file '{}' is {} bytes long and its first bytes changed since this job read {} bytes of it: it was truncated in place (as copytruncate does, which loses data); a file source may only be appended to, or rotated by renaming",
                    k.name,
                    meta.len(),
                    k.next_offset
                ),
            ));
        }
        Ok(())
    }

    fn add_known(&mut self, k: &PartitionState, hit: Option<Found>) -> Result<()> {
        let (path, id, size, gone) = match hit {
            Some(f) => {
                let codec = self.codec(&f.path);
                if codec == Codec::Plain && f.size < k.next_offset {
                    return Err(EtlError::source(
                        &self.source_name,
                        format!(
                            "file '{}' is {} bytes long, shorter than its checkpointed offset {}: it was truncated in place (as copytruncate does, which loses data); a file source may only be appended to, or rotated by renaming",
                            f.path.display(),
                            f.size,
                            k.next_offset
                        ),
                    ));
                }
                let size = (codec == Codec::Plain).then_some(f.size).or(k.end_offset);
                (f.path, f.identity, size, false)
            }
            None => {
                if k.status != "deleted" {
                    self.gaps.extend(unread_gap(
                        k.partition,
                        &k.name,
                        k.next_offset,
                        k.end_offset,
                    ));
                }
                (
                    PathBuf::from(&k.name),
                    k.identity.clone(),
                    k.end_offset,
                    true,
                )
            }
        };
        self.parts.push(SourcePartition {
            partition: k.partition,
            name: path.to_string_lossy().into_owned(),
            identity: id,
            start_offset: k.next_offset,
            gone,
        });
        self.slots.push(Slot {
            codec: self.codec(&path),
            path,
            reader: None,
            size,
            next: k.next_offset,
        });
        Ok(())
    }

    /// How a file is stored: by its name, or an Avro file (every file of an Avro job).
    fn codec(&self, path: &Path) -> Codec {
        match self.opts.avro {
            Some(_) => Codec::Avro,
            None => Codec::of(path),
        }
    }

    fn add_new(&mut self, f: Found, start: i64) {
        let codec = self.codec(&f.path);
        self.parts.push(SourcePartition {
            partition: self.next_free,
            name: f.path.to_string_lossy().into_owned(),
            identity: f.identity,
            start_offset: start,
            gone: false,
        });
        self.slots.push(Slot {
            size: (codec == Codec::Plain).then_some(f.size),
            codec,
            path: f.path,
            reader: None,
            next: start,
        });
        self.next_free += 1;
    }

    /// Keeps only the partitions of `only` (`partitions := [...]`), in partition order.
    fn restrict(&mut self) {
        let only = self.only.clone();
        let keep = |p: i32| only.as_ref().is_none_or(|o| o.contains(&p));
        let mut both: Vec<(SourcePartition, Slot)> = std::mem::take(&mut self.parts)
            .into_iter()
            .zip(std::mem::take(&mut self.slots))
            .filter(|(p, _)| keep(p.partition))
            .collect();
        both.sort_by_key(|(p, _)| p.partition);
        (self.parts, self.slots) = both.into_iter().unzip();
        self.gaps.retain(|g| keep(g.partition));
    }

    /// The partition's reader, opening its file where the file is now: it may have been renamed
    /// (a log rotated) since it was found, and another file may have taken its name, which must
    /// never be read in its place. None when the file is nowhere to be found: the partition is
    /// then gone, with a gap for what was not read.
    /// Reads from the partition's file with `f` (which returns how it stopped and the offset
    /// after the last message it took), keeping the partition's position and size; a damaged
    /// compressed file is reported and done with.
    fn read(
        &mut self,
        idx: usize,
        f: &mut dyn FnMut(&mut Reader) -> std::io::Result<Read>,
    ) -> Result<Pull> {
        if self.parts[idx].gone {
            return Ok(Pull::Exhausted);
        }
        let Some(reader) = self.reader(idx)? else {
            return Ok(Pull::Exhausted);
        };
        let result = f(reader);
        let slot = &mut self.slots[idx];
        let result = result.map(|(pull, last)| {
            if let Some(n) = last {
                slot.next = n;
            }
            pull
        });
        match result {
            Ok(pull) => {
                if let Some(r) = &slot.reader {
                    if r.finished() {
                        slot.size = Some(r.offset());
                    }
                }
                Ok(pull)
            }
            Err(e) if slot.codec != Codec::Plain => {
                // A damaged compressed file: what could not be decompressed is reported, and
                // the file is done (it cannot change).
                self.gaps.push(Gap {
                    partition: self.parts[idx].partition,
                    from: slot.next,
                    message: if slot.codec == Codec::Avro {
                        format!(
                            "file '{}' cannot be read as Avro after offset {}: {e}",
                            slot.path.display(),
                            slot.next
                        )
                    } else {
                        format!(
                            "file '{}' cannot be decompressed after byte {} of its content: {e}",
                            slot.path.display(),
                            slot.next
                        )
                    },
                });
                slot.reader = None;
                self.parts[idx].gone = true;
                Ok(Pull::Exhausted)
            }
            Err(e) => Err(EtlError::source(
                &self.source_name,
                format!("cannot read '{}': {e}", slot.path.display()),
            )),
        }
    }

    fn reader(&mut self, idx: usize) -> Result<Option<&mut Reader>> {
        if self.slots[idx].reader.is_none() && !self.open_reader(idx)? {
            return Ok(None);
        }
        self.slots[idx]
            .reader
            .as_mut()
            .map(Some)
            .ok_or_else(|| EtlError::Internal("file reader missing".into()))
    }

    fn open_reader(&mut self, idx: usize) -> Result<bool> {
        let policy = self.opts.policy.clone();
        let (part, slot) = (&mut self.parts[idx], &mut self.slots[idx]);
        let name = &self.source_name;
        let err = |path: &Path, e: String| {
            EtlError::source(name, format!("cannot read '{}': {e}", path.display()))
        };
        allowed(policy.as_ref(), &slot.path).map_err(|e| err(&slot.path, e))?;
        let at_path = File::open(&slot.path).and_then(|f| Ok((f.metadata()?, f)));
        let file = match at_path {
            // Files known by path only (checkpoints of version 0.1) are taken as they are.
            Ok((meta, f))
                if part.identity.is_empty() || same_file(&part.identity, &slot.path, &meta) =>
            {
                f
            }
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(err(&slot.path, e.to_string()))
            }
            _ => {
                let moved = slot
                    .path
                    .parent()
                    .and_then(|dir| renamed_in(dir, &part.identity, policy.as_ref()));
                let Some(found) = moved else {
                    part.gone = true;
                    let name = slot.path.to_string_lossy();
                    self.gaps
                        .extend(unread_gap(part.partition, &name, slot.next, slot.size));
                    return Ok(false);
                };
                slot.path = found.path;
                File::open(&slot.path).map_err(|e| err(&slot.path, e.to_string()))?
            }
        };
        let reader = Reader::open(
            file,
            slot.codec,
            slot.next,
            self.buf_size,
            self.opts.avro.as_ref(),
        );
        slot.reader = match reader {
            Ok(r) => Some(r),
            // A file of an Avro job that is not one (or whose header is damaged) is reported
            // whole, like a damaged compressed file; the job goes on with the others.
            Err(e) if slot.codec == Codec::Avro && e.kind() == std::io::ErrorKind::InvalidData => {
                part.gone = true;
                self.gaps.push(Gap {
                    partition: part.partition,
                    from: slot.next,
                    message: format!(
                        "file '{}' cannot be read as Avro after offset {}: {e}",
                        slot.path.display(),
                        slot.next
                    ),
                });
                return Ok(false);
            }
            Err(e) => return Err(err(&slot.path, e.to_string())),
        };
        Ok(true)
    }
}

/// The gap a file leaves when it is gone before this job read it to its end (`end`: its length,
/// when known); none when nothing was left to read.
fn unread_gap(partition: i32, name: &str, next: i64, end: Option<i64>) -> Option<Gap> {
    let what = match end {
        Some(e) if e <= next => return None,
        Some(e) => format!("bytes {next} to {} were never read", e - 1),
        None => format!("what followed byte {next} was never read"),
    };
    Some(Gap {
        partition,
        from: next,
        message: format!(
            "file '{name}' was deleted (or moved out of reach) before this job read it to the end: {what}"
        ),
    })
}

fn found_clone(f: &Found) -> Found {
    Found {
        path: f.path.clone(),
        identity: f.identity.clone(),
        size: f.size,
        meta: f.meta.clone(),
    }
}

/// The stream length of a file (decompressed, for compressed ones).
fn end_of(f: &Found, avro: Option<&Arc<SchemaCache>>) -> Result<i64> {
    let codec = if avro.is_some() {
        Codec::Avro
    } else {
        Codec::of(&f.path)
    };
    match codec {
        Codec::Plain => Ok(f.size),
        codec => {
            let file = File::open(&f.path).map_err(|e| {
                EtlError::source("file", format!("cannot read '{}': {e}", f.path.display()))
            })?;
            let mut r = Reader::open(file, codec, 0, 1 << 16, avro).map_err(|e| {
                EtlError::source("file", format!("cannot read '{}': {e}", f.path.display()))
            })?;
            r.pull(&mut |_| true).map_err(|e| {
                EtlError::source("file", format!("cannot read '{}': {e}", f.path.display()))
            })?;
            Ok(r.offset())
        }
    }
}

impl Source for FileSource {
    fn partitions(&self) -> &[SourcePartition] {
        &self.parts
    }

    fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
        self.read(idx, &mut |reader| {
            let mut last = None;
            let pull = reader.pull(&mut |m| {
                last = Some(m.next_offset);
                each(m)
            })?;
            Ok((pull, last))
        })
    }

    fn fill(
        &mut self,
        idx: usize,
        chunk: &mut Chunk,
        max_messages: usize,
        max_bytes: usize,
    ) -> Result<Pull> {
        self.read(idx, &mut |reader| match reader {
            // Lines are read as one block, split by whichever thread parses the chunk.
            Reader::Lines(r) => r.fill_block(chunk, max_bytes),
            Reader::Avro(r) => {
                let mut last = None;
                let pull = r.pull(&mut |m| {
                    last = Some(m.next_offset);
                    chunk.push(m);
                    chunk.messages() < max_messages && chunk.bytes() < max_bytes
                })?;
                Ok((pull, last))
            }
        })
    }

    fn end_offset(&self, idx: usize) -> Option<i64> {
        self.slots.get(idx).and_then(|s| s.size)
    }

    fn take_gaps(&mut self) -> Vec<Gap> {
        std::mem::take(&mut self.gaps)
    }

    fn discover(&mut self) -> Result<usize> {
        let found = find(&self.source_name, &self.pattern, self.opts.policy.as_ref())?;
        let before = self.parts.len();
        for f in found {
            let inode = format!("{}:{}/", f.meta.dev(), f.meta.ino());
            if let Some(i) = self
                .parts
                .iter()
                .position(|p| !p.gone && p.identity.starts_with(&inode))
            {
                if self.slots[i].codec == Codec::Plain {
                    self.slots[i].size = Some(f.size);
                }
                continue;
            }
            let number = self.next_free;
            if self.only.as_ref().is_some_and(|o| !o.contains(&number)) {
                continue;
            }
            self.add_new(f, 0);
        }
        Ok(self.parts.len() - before)
    }

    fn wait(&mut self, timeout: Duration) -> bool {
        // Files have no notification to wait on: a short sleep, then the readers look again.
        std::thread::sleep(timeout.min(Duration::from_millis(50)));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("setl-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn collect(src: &mut FileSource, idx: usize) -> Vec<(i64, String)> {
        let mut v = Vec::new();
        src.pull(idx, &mut |m| {
            v.push((m.offset, String::from_utf8_lossy(m.payload).into_owned()));
            true
        })
        .unwrap();
        v
    }

    /// The checkpoint's view of a source after reading everything.
    fn known(src: &FileSource) -> Vec<PartitionState> {
        src.parts
            .iter()
            .enumerate()
            .map(|(i, p)| PartitionState {
                partition: p.partition,
                name: p.name.clone(),
                identity: p.identity.clone(),
                next_offset: src.slots[i].next,
                max_event_time_ms: None,
                last_delivery_ms: 0,
                end_offset: src.end_offset(i),
                status: if p.gone {
                    "deleted".into()
                } else {
                    String::new()
                },
            })
            .collect()
    }

    fn open(pattern: &str, known: &[PartitionState]) -> Result<FileSource> {
        FileSource::open("t", pattern, known, None, FileOptions::default())
    }

    #[test]
    fn new_files_get_the_next_numbers_and_old_ones_keep_theirs() {
        let d = tmpdir("numbers");
        std::fs::write(d.join("b.ndjson"), b"").unwrap();
        std::fs::write(d.join("c.ndjson"), b"").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let first = open(&pattern, &[]).unwrap();
        std::fs::write(d.join("a.ndjson"), b"").unwrap();
        let second = open(&pattern, &known(&first)).unwrap();
        let names: Vec<(i32, String)> = second
            .parts
            .iter()
            .map(|p| {
                (
                    p.partition,
                    Path::new(&p.name)
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                (0, "b.ndjson".into()),
                (1, "c.ndjson".into()),
                (2, "a.ndjson".into())
            ]
        );
    }

    #[test]
    fn a_renamed_file_keeps_its_partition_and_a_new_one_at_the_old_path_is_new() {
        let d = tmpdir("rotate");
        std::fs::write(d.join("app.ndjson"), b"1\n2\n").unwrap();
        let pattern = format!("{}/app.ndjson", d.display());
        let mut first = open(&pattern, &[]).unwrap();
        assert_eq!(collect(&mut first, 0).len(), 2);
        let k = known(&first);
        // Rotation: the file is renamed (and written once more), a new file starts at the old name.
        std::fs::rename(d.join("app.ndjson"), d.join("app.ndjson.1")).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("app.ndjson.1"))
            .unwrap()
            .write_all(b"3\n")
            .unwrap();
        std::fs::write(d.join("app.ndjson"), b"new\n").unwrap();
        let mut second = open(&pattern, &k).unwrap();
        assert_eq!(second.parts.len(), 2);
        assert!(second.parts[0].name.ends_with("app.ndjson.1"));
        assert_eq!(
            collect(&mut second, 0),
            vec![(4, "3".into())],
            "read to its end under the new name"
        );
        assert_eq!(collect(&mut second, 1), vec![(0, "new".into())]);
    }

    #[test]
    fn shrinking_is_an_error_and_deletion_before_the_end_is_a_gap() {
        let d = tmpdir("shrink");
        std::fs::write(d.join("a.ndjson"), b"x\ny\n").unwrap();
        std::fs::write(d.join("b.ndjson"), b"x\ny\n").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let mut first = open(&pattern, &[]).unwrap();
        collect(&mut first, 0);
        let k = known(&first);
        std::fs::write(d.join("a.ndjson"), b"").unwrap();
        let e = open(&pattern, &k).err().unwrap().to_string();
        assert!(
            e.contains("truncated in place") && e.contains("copytruncate"),
            "{e}"
        );
        // Truncated and written again (copytruncate), longer than before: still caught.
        std::fs::write(d.join("a.ndjson"), b"other lines\n").unwrap();
        let e = open(&pattern, &k).err().unwrap().to_string();
        assert!(e.contains("truncated in place"), "{e}");
        std::fs::remove_file(d.join("a.ndjson")).unwrap();
        std::fs::remove_file(d.join("b.ndjson")).unwrap();
        std::fs::write(d.join("c.ndjson"), b"z\n").unwrap();
        let mut second = open(&pattern, &k).unwrap();
        let gaps = second.take_gaps();
        assert_eq!(gaps.len(), 1, "b was never read; a was read to its end");
        assert!(
            gaps[0].message.contains("b.ndjson") && gaps[0].message.contains("bytes 0 to 3"),
            "{}",
            gaps[0].message
        );
        assert!(second.parts[0].gone && second.parts[1].gone);
        assert_eq!(collect(&mut second, 2), vec![(0, "z".into())]);
        // Reported once: the next run knows it is deleted.
        let third = open(&pattern, &known(&second)).unwrap();
        assert!(third.gaps.is_empty());
    }

    #[test]
    fn discovery_finds_new_files_while_reading() {
        let d = tmpdir("discover");
        std::fs::write(d.join("a.ndjson"), b"1\n").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let mut src = open(&pattern, &[]).unwrap();
        assert_eq!(src.discover().unwrap(), 0);
        std::fs::write(d.join("b.ndjson"), b"2\n").unwrap();
        assert_eq!(src.discover().unwrap(), 1);
        assert_eq!(collect(&mut src, 1), vec![(0, "2".into())]);
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("a.ndjson"))
            .unwrap()
            .write_all(b"3\n")
            .unwrap();
        assert_eq!(collect(&mut src, 0), vec![(0, "1".into()), (2, "3".into())]);
    }

    #[test]
    fn start_at_end_skips_what_exists() {
        let d = tmpdir("latest");
        std::fs::write(d.join("a.ndjson"), b"old\n").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let opts = FileOptions {
            start_at_end: true,
            ..Default::default()
        };
        let mut src = FileSource::open("t", &pattern, &[], None, opts).unwrap();
        assert!(collect(&mut src, 0).is_empty());
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("a.ndjson"))
            .unwrap()
            .write_all(b"new\n")
            .unwrap();
        assert_eq!(collect(&mut src, 0), vec![(4, "new".into())]);
    }

    #[test]
    fn no_match_is_an_error() {
        let d = tmpdir("nomatch");
        let e = open(&format!("{}/none-*", d.display()), &[]).err().unwrap();
        assert!(e.to_string().contains("no file matches"), "{e}");
    }

    /// A log rotated by renaming after the job found it but before it read it: the job reads
    /// the file under its new name from where it was, never the new file that took the name.
    #[test]
    fn a_file_renamed_before_its_first_read_is_read_where_it_went() {
        let d = tmpdir("renamed-early");
        std::fs::write(d.join("app.ndjson"), b"first\nsecond\n").unwrap();
        let pattern = format!("{}/app.ndjson*", d.display());
        let mut src = open(&pattern, &[]).unwrap();
        std::fs::rename(d.join("app.ndjson"), d.join("app.ndjson.1")).unwrap();
        std::fs::write(d.join("app.ndjson"), b"other\n").unwrap();
        let got = collect(&mut src, 0);
        assert_eq!(
            got,
            vec![(0, "first".to_string()), (6, "second".to_string())]
        );
        assert!(src.take_gaps().is_empty());
        // The new file is a partition of its own.
        assert_eq!(src.discover().unwrap(), 1);
        assert_eq!(collect(&mut src, 1), vec![(0, "other".to_string())]);
    }

    /// Deleted before its first read: the partition is gone, with a gap for what it held.
    #[test]
    fn a_file_deleted_before_its_first_read_leaves_a_gap() {
        let d = tmpdir("deleted-early");
        std::fs::write(d.join("a.ndjson"), b"lost\n").unwrap();
        std::fs::write(d.join("empty.ndjson"), b"").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let mut src = open(&pattern, &[]).unwrap();
        std::fs::remove_file(d.join("a.ndjson")).unwrap();
        std::fs::remove_file(d.join("empty.ndjson")).unwrap();
        assert!(collect(&mut src, 0).is_empty());
        assert!(collect(&mut src, 1).is_empty());
        assert!(src.parts.iter().all(|p| p.gone));
        let gaps = src.take_gaps();
        assert_eq!(gaps.len(), 1, "only the file with unread bytes: {gaps:?}");
        assert_eq!((gaps[0].partition, gaps[0].from), (0, 0));
        assert!(gaps[0].message.contains("a.ndjson"), "{}", gaps[0].message);
    }
}
