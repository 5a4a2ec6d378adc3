//! The embedded source: NDJSON files matched by a glob (`file:<glob>`). Each file is one
//! partition, numbered in the sorted order of the paths matched at the job's first run (a file
//! that appears later gets the next free number); each line is one message, whose offset is the
//! byte position where the line starts. A last line without its newline is left for a later
//! run, so a file being appended to is never read half-written.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::{EtlError, Result};
use crate::source::{Message, Pull, Source, SourcePartition};

pub struct FileSource {
    source_name: String,
    parts: Vec<SourcePartition>,
    readers: Vec<Option<Reader>>,
    sizes: Vec<i64>,
    buf_size: usize,
}

struct Reader {
    file: File,
    buf: Vec<u8>,
    /// Next unread byte in `buf`.
    pos: usize,
    /// End of the valid bytes in `buf`.
    end: usize,
    /// File offset of `buf[0]`.
    base: i64,
    eof: bool,
}

impl FileSource {
    /// Opens the files matched by `pattern`, keeping the partition numbers in `known`
    /// (partition, absolute path) and resuming each at its offset in `offsets`.
    pub fn open(
        source_name: &str,
        pattern: &str,
        known: &[(i32, String)],
        offsets: &HashMap<i32, i64>,
        only: Option<&[i32]>,
    ) -> Result<FileSource> {
        let mut parts = assign_partitions(source_name, pattern, known, offsets)?;
        if let Some(only) = only {
            let missing: Vec<i32> = only
                .iter()
                .copied()
                .filter(|o| !parts.iter().any(|p| p.partition == *o))
                .collect();
            if !missing.is_empty() {
                return Err(EtlError::source(
                    source_name,
                    format!(
                        "partitions {missing:?} do not exist: '{pattern}' matches partitions {:?}",
                        parts.iter().map(|p| p.partition).collect::<Vec<_>>()
                    ),
                ));
            }
            parts.retain(|p| only.contains(&p.partition));
        }
        let mut sizes = Vec::with_capacity(parts.len());
        for p in &parts {
            let len = std::fs::metadata(&p.name)
                .map_err(|e| {
                    EtlError::source(source_name, format!("cannot read '{}': {e}", p.name))
                })?
                .len() as i64;
            if len < p.start_offset {
                return Err(EtlError::source(
                    source_name,
                    format!(
                        "file '{}' is {len} bytes long, shorter than its checkpointed offset {}: it was truncated or replaced; a file source may only be appended to",
                        p.name, p.start_offset
                    ),
                ));
            }
            sizes.push(len);
        }
        // Every partition is read at once (in event-time order), so the buffers share a budget.
        let buf_size = ((64 << 20) / parts.len().max(1)).clamp(64 << 10, 1 << 20);
        Ok(FileSource {
            source_name: source_name.to_string(),
            readers: parts.iter().map(|_| None).collect(),
            parts,
            sizes,
            buf_size,
        })
    }

    fn reader(&mut self, idx: usize) -> Result<&mut Reader> {
        if self.readers[idx].is_none() {
            let p = &self.parts[idx];
            let err = |e: std::io::Error| {
                EtlError::source(&self.source_name, format!("cannot read '{}': {e}", p.name))
            };
            let mut file = File::open(&p.name).map_err(err)?;
            file.seek(SeekFrom::Start(p.start_offset as u64))
                .map_err(err)?;
            self.readers[idx] = Some(Reader {
                file,
                buf: vec![0; self.buf_size],
                pos: 0,
                end: 0,
                base: p.start_offset,
                eof: false,
            });
        }
        self.readers[idx]
            .as_mut()
            .ok_or_else(|| EtlError::Internal("file reader missing".into()))
    }
}

impl Source for FileSource {
    fn partitions(&self) -> &[SourcePartition] {
        &self.parts
    }

    fn pull(&mut self, idx: usize, each: &mut dyn FnMut(&Message<'_>) -> bool) -> Result<Pull> {
        match self.reader(idx)?.pull(each) {
            Ok(Pull::Exhausted) => {
                self.readers[idx] = None;
                Ok(Pull::Exhausted)
            }
            Ok(p) => Ok(p),
            Err(e) => Err(EtlError::source(
                &self.source_name,
                format!("cannot read '{}': {e}", self.parts[idx].name),
            )),
        }
    }

    fn end_offset(&self, idx: usize) -> Option<i64> {
        self.sizes.get(idx).copied()
    }
}

impl Reader {
    fn pull(&mut self, each: &mut dyn FnMut(&Message<'_>) -> bool) -> std::io::Result<Pull> {
        loop {
            if let Some(nl) = memchr::memchr(b'\n', &self.buf[self.pos..self.end]) {
                let offset = self.base + self.pos as i64;
                let msg = Message {
                    offset,
                    next_offset: offset + nl as i64 + 1,
                    payload: &self.buf[self.pos..self.pos + nl],
                    key: None,
                    timestamp: None,
                };
                self.pos += nl + 1;
                if !each(&msg) {
                    return Ok(Pull::Paused);
                }
                continue;
            }
            if self.eof {
                // What is left is an incomplete last line: not consumed, read by a later run.
                return Ok(Pull::Exhausted);
            }
            // Keep the partial line, make room (growing for a line longer than the buffer),
            // and read more.
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as i64;
            self.end -= self.pos;
            self.pos = 0;
            if self.end == self.buf.len() {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
            let n = loop {
                match self.file.read(&mut self.buf[self.end..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.eof = n == 0;
            self.end += n;
        }
    }
}

/// Matches `pattern` and numbers the files: known ones keep their numbers, new ones get the
/// next free numbers in sorted path order.
fn assign_partitions(
    source_name: &str,
    pattern: &str,
    known: &[(i32, String)],
    offsets: &HashMap<i32, i64>,
) -> Result<Vec<SourcePartition>> {
    let matched = glob(pattern).map_err(|e| EtlError::source(source_name, e))?;
    if matched.is_empty() {
        return Err(EtlError::source(
            source_name,
            format!("no file matches '{pattern}'"),
        ));
    }
    let by_path: HashMap<&str, i32> = known.iter().map(|(p, n)| (n.as_str(), *p)).collect();
    let mut next_free = known.iter().map(|(p, _)| p + 1).max().unwrap_or(0);
    let mut parts = Vec::with_capacity(matched.len());
    for path in matched {
        let abs = std::fs::canonicalize(&path).map_err(|e| {
            EtlError::source(
                source_name,
                format!("cannot resolve '{}': {e}", path.display()),
            )
        })?;
        let abs = abs.to_string_lossy().into_owned();
        let partition = match by_path.get(abs.as_str()) {
            Some(&p) => p,
            None => {
                let p = next_free;
                next_free += 1;
                p
            }
        };
        parts.push(SourcePartition {
            partition,
            start_offset: offsets.get(&partition).copied().unwrap_or(0),
            name: abs,
        });
    }
    parts.sort_by_key(|p| p.partition);
    parts.dedup_by(|a, b| a.partition == b.partition);
    Ok(parts)
}

/// Expands a glob (`*`, `?`, `[abc]`, `[a-z]`, `[!abc]` within a path component, `**` for any
/// number of directories) into the regular files it matches, sorted by path.
pub fn glob(pattern: &str) -> std::result::Result<Vec<PathBuf>, String> {
    let absolute = pattern.starts_with('/');
    let components: Vec<&str> = pattern.split('/').filter(|c| !c.is_empty()).collect();
    if components.is_empty() {
        return Err(format!("empty file pattern '{pattern}'"));
    }
    let root = if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut out = Vec::new();
    walk(&root, &components, &mut out);
    out.sort();
    out.dedup();
    Ok(out)
}

fn has_wildcard(c: &str) -> bool {
    c.contains(['*', '?', '['])
}

fn walk(dir: &Path, rest: &[&str], out: &mut Vec<PathBuf>) {
    let Some((&first, tail)) = rest.split_first() else {
        if dir.is_file() {
            out.push(dir.to_path_buf());
        }
        return;
    };
    let list = |d: &Path| -> Vec<(String, PathBuf)> {
        let d = if d.as_os_str().is_empty() {
            Path::new(".")
        } else {
            d
        };
        let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.file_name()))
            .map(|(n, os)| (n, os.into()))
            .collect();
        v.sort();
        v
    };
    if first == "**" {
        // Zero directories, then one more level of any directory.
        walk(dir, tail, out);
        for (name, os) in list(dir) {
            let next = dir.join(os);
            if next.is_dir() && !name.starts_with('.') {
                walk(&next, rest, out);
            }
        }
    } else if has_wildcard(first) {
        for (name, os) in list(dir) {
            if wildcard_match(first.as_bytes(), name.as_bytes()) {
                walk(&dir.join(os), tail, out);
            }
        }
    } else {
        let next = dir.join(first);
        if tail.is_empty() || next.is_dir() {
            walk(&next, tail, out);
        }
    }
}

/// Shell-style matching of one path component.
pub fn wildcard_match(pat: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pat.len() {
            match pat[p] {
                b'*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    n += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, len)) = class_match(&pat[p..], name[n]) {
                        if matched {
                            p += len;
                            n += 1;
                            continue;
                        }
                    } else if name[n] == b'[' {
                        p += 1;
                        n += 1;
                        continue;
                    }
                }
                c if c == name[n] => {
                    p += 1;
                    n += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((sp, sn)) => {
                p = sp + 1;
                n = sn + 1;
                star = Some((sp, sn + 1));
            }
            None => return false,
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// Matches `c` against the class at the start of `pat` (`[...]`); returns (matched, class
/// length), or None when the bracket is not a complete class.
fn class_match(pat: &[u8], c: u8) -> Option<(bool, usize)> {
    let mut i = 1;
    let negate = matches!(pat.get(1), Some(b'!' | b'^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    while i < pat.len() {
        if pat[i] == b']' && !first {
            return Some((matched != negate, i + 1));
        }
        first = false;
        if pat.get(i + 1) == Some(&b'-') && pat.get(i + 2).is_some_and(|&e| e != b']') {
            if pat[i] <= c && c <= pat[i + 2] {
                matched = true;
            }
            i += 3;
        } else {
            if pat[i] == c {
                matched = true;
            }
            i += 1;
        }
    }
    None
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

    fn collect(src: &mut FileSource, idx: usize) -> (Vec<(i64, i64, String)>, Pull) {
        let mut v = Vec::new();
        let pull = src
            .pull(idx, &mut |m| {
                v.push((
                    m.offset,
                    m.next_offset,
                    String::from_utf8_lossy(m.payload).into_owned(),
                ));
                true
            })
            .unwrap();
        (v, pull)
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match(b"orders-*.ndjson", b"orders-1.ndjson"));
        assert!(wildcard_match(b"*", b""));
        assert!(!wildcard_match(b"orders-?.ndjson", b"orders-10.ndjson"));
        assert!(wildcard_match(b"p[0-3].json", b"p2.json"));
        assert!(!wildcard_match(b"p[!0-3].json", b"p2.json"));
        assert!(wildcard_match(b"*a*b", b"xxaxxb"));
        assert!(!wildcard_match(b"*a*b", b"xxaxxbc"));
    }

    #[test]
    fn lines_offsets_and_incomplete_last_line() {
        let d = tmpdir("lines");
        std::fs::write(d.join("a.ndjson"), b"one\ntwo\r\n\nthree-partial").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let mut src = FileSource::open("t", &pattern, &[], &HashMap::new(), None).unwrap();
        let (msgs, pull) = collect(&mut src, 0);
        assert_eq!(pull, Pull::Exhausted);
        assert_eq!(
            msgs,
            vec![
                (0, 4, "one".into()),
                (4, 9, "two\r".into()),
                (9, 10, "".into())
            ]
        );
        // The rest of the line arrives; the next run resumes at offset 10.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("a.ndjson"))
            .unwrap();
        f.write_all(b"\n").unwrap();
        let known = vec![(0, src.partitions()[0].name.clone())];
        let mut src =
            FileSource::open("t", &pattern, &known, &HashMap::from([(0, 10)]), None).unwrap();
        assert_eq!(
            collect(&mut src, 0).0,
            vec![(10, 24, "three-partial".into())]
        );
    }

    #[test]
    fn lines_longer_than_the_buffer() {
        let d = tmpdir("long");
        let long = "x".repeat(3 << 20);
        std::fs::write(d.join("a.ndjson"), format!("{long}\nshort\n")).unwrap();
        let mut src = FileSource::open(
            "t",
            &format!("{}/a.ndjson", d.display()),
            &[],
            &HashMap::new(),
            None,
        )
        .unwrap();
        let (msgs, _) = collect(&mut src, 0);
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].2.len(), 3 << 20);
        assert_eq!(msgs[1], ((3 << 20) + 1, (3 << 20) + 7, "short".into()));
    }

    #[test]
    fn new_files_get_the_next_numbers_and_old_ones_keep_theirs() {
        let d = tmpdir("numbers");
        std::fs::write(d.join("b.ndjson"), b"").unwrap();
        std::fs::write(d.join("c.ndjson"), b"").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let first = FileSource::open("t", &pattern, &[], &HashMap::new(), None).unwrap();
        let known: Vec<(i32, String)> = first
            .partitions()
            .iter()
            .map(|p| (p.partition, p.name.clone()))
            .collect();
        assert_eq!(known.iter().map(|k| k.0).collect::<Vec<_>>(), vec![0, 1]);
        std::fs::write(d.join("a.ndjson"), b"").unwrap();
        let second = FileSource::open("t", &pattern, &known, &HashMap::new(), None).unwrap();
        let names: Vec<(i32, String)> = second
            .partitions()
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
    fn truncated_file_and_no_match_are_errors() {
        let d = tmpdir("trunc");
        std::fs::write(d.join("a.ndjson"), b"x\n").unwrap();
        let pattern = format!("{}/*.ndjson", d.display());
        let first = FileSource::open("t", &pattern, &[], &HashMap::new(), None).unwrap();
        let known = vec![(0, first.partitions()[0].name.clone())];
        let e = FileSource::open("t", &pattern, &known, &HashMap::from([(0, 100)]), None)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("shorter than its checkpointed offset 100"),
            "{e}"
        );
        let e = FileSource::open(
            "t",
            &format!("{}/none-*", d.display()),
            &[],
            &HashMap::new(),
            None,
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("no file matches"), "{e}");
    }

    #[test]
    fn recursive_glob() {
        let d = tmpdir("rec");
        std::fs::create_dir_all(d.join("x/y")).unwrap();
        std::fs::write(d.join("top.ndjson"), b"").unwrap();
        std::fs::write(d.join("x/y/deep.ndjson"), b"").unwrap();
        let found = glob(&format!("{}/**/*.ndjson", d.display())).unwrap();
        assert_eq!(found.len(), 2);
    }
}
