//! Lines of one file, read in large buffers: each line is a message whose offset is the byte
//! position where it starts (in the decompressed stream, for `.gz` and `.zst` files). A plain
//! file may still be written, so a last line without its newline is left until it is complete;
//! a compressed file is immutable, so its last line counts at the end of the stream.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use crate::chunk::Chunk;
use crate::source::{Message, Pull};

/// How a file is stored, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Plain,
    Gzip,
    Zstd,
    /// An Avro object container file (read by `avro_file`, never as lines).
    Avro,
}

impl Codec {
    pub(crate) fn of(path: &Path) -> Codec {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Codec::Gzip,
            Some("zst") => Codec::Zstd,
            _ => Codec::Plain,
        }
    }
}

pub(crate) struct LineReader {
    input: Box<dyn Read + Send>,
    codec: Codec,
    buf: Vec<u8>,
    /// Next unread byte in `buf`.
    pos: usize,
    /// End of the valid bytes in `buf`.
    end: usize,
    /// Stream offset of `buf[0]`.
    base: i64,
    /// The input had nothing more at the last read (a plain file may grow later).
    eof: bool,
    /// A compressed stream ended (for good).
    finished: bool,
    /// A read failed after complete lines were taken: reported at the next read.
    failed: Option<std::io::Error>,
}

fn open_decoder(file: File, codec: Codec) -> std::io::Result<Box<dyn Read + Send>> {
    Ok(match codec {
        Codec::Plain => Box::new(file),
        Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(BufReader::new(file))),
        Codec::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(BufReader::new(
            file,
        ))?),
        Codec::Avro => return Err(std::io::Error::other("an Avro file is not read as lines")),
    })
}

impl LineReader {
    /// Opens `file` at stream offset `start` (a compressed stream is decompressed up to it).
    pub fn open(
        mut file: File,
        codec: Codec,
        start: i64,
        buf_size: usize,
    ) -> std::io::Result<LineReader> {
        if codec == Codec::Plain {
            file.seek(SeekFrom::Start(start as u64))?;
        }
        let mut input = open_decoder(file, codec)?;
        if codec != Codec::Plain {
            let skipped =
                std::io::copy(&mut (&mut input).take(start as u64), &mut std::io::sink())?;
            if skipped != start as u64 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the decompressed stream ends at {skipped}, before the checkpointed offset {start}"),
                ));
            }
        }
        Ok(LineReader {
            input,
            codec,
            buf: vec![0; buf_size.max(64)],
            pos: 0,
            end: 0,
            base: start,
            eof: false,
            finished: false,
            failed: None,
        })
    }

    /// The stream offset of the next line.
    pub fn offset(&self) -> i64 {
        self.base + self.pos as i64
    }

    /// A compressed stream was read to its end.
    pub(crate) fn finished(&self) -> bool {
        self.finished
    }

    /// Reads complete lines into `chunk` as one block of about `max_bytes` (more for a line
    /// longer than that), straight from the input into the chunk's buffer; the partial line
    /// after them waits here for the next read. Returns how it stopped and the offset after the
    /// last line taken.
    pub(crate) fn fill_block(
        &mut self,
        chunk: &mut Chunk,
        max_bytes: usize,
    ) -> std::io::Result<(Pull, Option<i64>)> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        self.eof = false;
        let carry = self.end - self.pos;
        let base = self.base + self.pos as i64;
        let mut size = max_bytes.max(carry * 2).max(4096);
        chunk.block_buffer(size).0[..carry].copy_from_slice(&self.buf[self.pos..self.end]);
        let mut len = carry;
        let mut failed = None;
        loop {
            if len == size {
                if memchr::memrchr(b'\n', &chunk.block_buffer(size).0[..len]).is_some() {
                    break;
                }
                // A line longer than the block: the block grows.
                size *= 2;
            }
            let buf = chunk.block_buffer(size).0;
            match self.input.read(&mut buf[len..size]) {
                Ok(0) => {
                    self.eof = true;
                    if self.codec != Codec::Plain {
                        self.finished = true;
                    }
                    break;
                }
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let buf = chunk.block_buffer(size).0;
        // The last line of an immutable stream needs no newline; in a plain file, what follows
        // the last newline is a line still being written.
        let cut = if self.finished && failed.is_none() {
            len
        } else {
            memchr::memrchr(b'\n', &buf[..len]).map_or(0, |p| p + 1)
        };
        let rest = len - cut;
        if self.buf.len() < rest {
            self.buf.resize(rest, 0);
        }
        self.buf[..rest].copy_from_slice(&buf[cut..len]);
        self.pos = 0;
        self.end = rest;
        self.base = base + cut as i64;
        let open_end = cut > 0 && buf[cut - 1] != b'\n';
        chunk.set_block(cut, base, open_end);
        if let Some(e) = failed {
            if cut == 0 {
                return Err(e);
            }
            self.failed = Some(e);
        }
        let pull = if self.eof {
            Pull::Exhausted
        } else {
            Pull::Paused
        };
        Ok((pull, (cut > 0).then_some(base + cut as i64)))
    }

    /// Hands lines to `each` until it returns false or the input has no complete line left.
    pub fn pull(&mut self, each: &mut dyn FnMut(&Message<'_>) -> bool) -> std::io::Result<Pull> {
        // A plain file that was at its end may have grown since.
        self.eof = false;
        loop {
            if let Some(nl) = memchr::memchr(b'\n', &self.buf[self.pos..self.end]) {
                let offset = self.base + self.pos as i64;
                let msg = Message {
                    offset,
                    next_offset: offset + nl as i64 + 1,
                    payload: &self.buf[self.pos..self.pos + nl],
                    key: None,
                    timestamp: None,
                    schema: None,
                };
                self.pos += nl + 1;
                if !each(&msg) {
                    return Ok(Pull::Paused);
                }
                continue;
            }
            if self.eof {
                if self.codec != Codec::Plain && self.pos < self.end {
                    // The last line of an immutable stream needs no newline.
                    let offset = self.base + self.pos as i64;
                    let len = self.end - self.pos;
                    let msg = Message {
                        offset,
                        next_offset: offset + len as i64,
                        payload: &self.buf[self.pos..self.end],
                        key: None,
                        timestamp: None,
                        schema: None,
                    };
                    self.pos = self.end;
                    if !each(&msg) {
                        return Ok(Pull::Paused);
                    }
                }
                // What is left of a plain file is an incomplete last line, read later.
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
                match self.input.read(&mut self.buf[self.end..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.eof = n == 0;
            if self.eof && self.codec != Codec::Plain {
                self.finished = true;
            }
            self.end += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines(r: &mut LineReader) -> (Vec<(i64, i64, String)>, Pull) {
        let mut v = Vec::new();
        let pull = r
            .pull(&mut |m| {
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

    fn tmp(name: &str, data: &[u8]) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("setl-lines-{}-{name}", std::process::id()));
        std::fs::write(&p, data).unwrap();
        p
    }

    #[test]
    fn a_growing_plain_file_and_its_incomplete_last_line() {
        let p = tmp("plain.ndjson", b"one\ntwo\r\n\nthree-partial");
        let mut r = LineReader::open(File::open(&p).unwrap(), Codec::Plain, 0, 4).unwrap();
        let (got, pull) = lines(&mut r);
        assert_eq!(pull, Pull::Exhausted);
        assert_eq!(
            got,
            vec![
                (0, 4, "one".into()),
                (4, 9, "two\r".into()),
                (9, 10, "".into())
            ]
        );
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"\nfour\n")
            .unwrap();
        assert_eq!(
            lines(&mut r).0,
            vec![(10, 24, "three-partial".into()), (24, 29, "four".into())]
        );
        let mut again = LineReader::open(File::open(&p).unwrap(), Codec::Plain, 24, 1024).unwrap();
        assert_eq!(lines(&mut again).0, vec![(24, 29, "four".into())]);
    }

    #[test]
    fn compressed_streams_with_offsets_in_the_decompressed_bytes() {
        let text = b"a\nbb\nccc";
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text).unwrap();
        let p = tmp("x.ndjson.gz", &gz.finish().unwrap());
        assert_eq!(Codec::of(&p), Codec::Gzip);
        let mut r = LineReader::open(File::open(&p).unwrap(), Codec::Gzip, 0, 1024).unwrap();
        let (got, pull) = lines(&mut r);
        assert_eq!(pull, Pull::Exhausted);
        assert!(r.finished());
        assert_eq!(
            got,
            vec![
                (0, 2, "a".into()),
                (2, 5, "bb".into()),
                (5, 8, "ccc".into())
            ]
        );
        let mut r = LineReader::open(File::open(&p).unwrap(), Codec::Gzip, 5, 1024).unwrap();
        assert_eq!(lines(&mut r).0, vec![(5, 8, "ccc".into())]);
        assert!(LineReader::open(File::open(&p).unwrap(), Codec::Gzip, 99, 1024).is_err());
        // A damaged stream is an error of the read, never a silent end.
        let mut damaged = std::fs::read(&p).unwrap();
        let n = damaged.len();
        damaged.truncate(n - 6);
        let q = tmp("damaged.ndjson.gz", &damaged);
        let mut r = LineReader::open(File::open(&q).unwrap(), Codec::Gzip, 0, 1024).unwrap();
        assert!(r.pull(&mut |_| true).is_err());
    }
}
