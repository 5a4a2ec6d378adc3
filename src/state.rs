//! The checkpoint model: what a job must remember between cycles and runs (settings, each
//! partition's next offset and event-time progress, the watermark floor, the open windows) and
//! the output rows of one cycle, with the compact binary form they are stored in.

use crate::window::{Aggregate, ClosedWindow};

/// The settings a job's state only makes sense with; a run with other ones is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSettings {
    pub source: String,
    pub window_ms: i64,
    pub lateness_ms: i64,
    pub key_field: String,
    pub time_field: String,
    pub value_field: String,
}

/// One partition's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    /// What the partition is: the file's absolute path for the file source, empty for Kafka.
    pub name: String,
    pub next_offset: i64,
    pub max_event_time_ms: Option<i64>,
    /// Wall clock (epoch ms) of the last delivery, or of when the job first saw the partition.
    pub last_delivery_ms: i64,
    /// The end offset the source last reported (file size, Kafka high watermark).
    pub end_offset: Option<i64>,
}

/// A message that arrived after the watermark passed its window.
#[derive(Debug, Clone, PartialEq)]
pub struct LateRow {
    pub key: String,
    pub event_time_ms: i64,
    pub ingest_time_ms: i64,
    pub payload: String,
    pub window_start_ms: i64,
    pub window_end_ms: i64,
    pub watermark_ms: i64,
    pub partition: i32,
    pub offset: i64,
}

/// A message that could not be decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadRow {
    pub partition: i32,
    pub offset: i64,
    pub ingest_time_ms: i64,
    pub raw: Vec<u8>,
    pub error: String,
}

/// The output of one checkpoint cycle, applied to DuckDB as one transaction.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Batch {
    pub windows: Vec<ClosedWindow>,
    pub late: Vec<LateRow>,
    pub dead: Vec<DeadRow>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty() && self.late.is_empty() && self.dead.is_empty()
    }

    pub fn clear(&mut self) {
        self.windows.clear();
        self.late.clear();
        self.dead.clear();
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer(out);
        w.u8(FORMAT);
        w.u64(self.windows.len() as u64);
        for win in &self.windows {
            w.i64(win.start_ms);
            w.i64(win.end_ms);
            w.bytes(win.key.as_bytes());
            w.agg(&win.agg);
        }
        w.u64(self.late.len() as u64);
        for r in &self.late {
            w.bytes(r.key.as_bytes());
            w.i64(r.event_time_ms);
            w.i64(r.ingest_time_ms);
            w.bytes(r.payload.as_bytes());
            w.i64(r.window_start_ms);
            w.i64(r.window_end_ms);
            w.i64(r.watermark_ms);
            w.i64(i64::from(r.partition));
            w.i64(r.offset);
        }
        w.u64(self.dead.len() as u64);
        for r in &self.dead {
            w.i64(i64::from(r.partition));
            w.i64(r.offset);
            w.i64(r.ingest_time_ms);
            w.bytes(&r.raw);
            w.bytes(r.error.as_bytes());
        }
    }

    pub fn decode(data: &[u8]) -> Result<Batch, CodecError> {
        let mut r = Reader { b: data, i: 0 };
        r.format()?;
        let mut batch = Batch::default();
        for _ in 0..r.count()? {
            batch.windows.push(ClosedWindow {
                start_ms: r.i64()?,
                end_ms: r.i64()?,
                key: r.string()?.into_boxed_str(),
                agg: r.agg()?,
            });
        }
        for _ in 0..r.count()? {
            batch.late.push(LateRow {
                key: r.string()?,
                event_time_ms: r.i64()?,
                ingest_time_ms: r.i64()?,
                payload: r.string()?,
                window_start_ms: r.i64()?,
                window_end_ms: r.i64()?,
                watermark_ms: r.i64()?,
                partition: r.i32()?,
                offset: r.i64()?,
            });
        }
        for _ in 0..r.count()? {
            batch.dead.push(DeadRow {
                partition: r.i32()?,
                offset: r.i64()?,
                ingest_time_ms: r.i64()?,
                raw: r.bytes()?.to_vec(),
                error: r.string()?,
            });
        }
        r.end()?;
        Ok(batch)
    }
}

/// Encodes open windows for the checkpoint.
pub fn encode_windows<'a>(
    windows: impl Iterator<Item = (i64, &'a str, &'a Aggregate)>,
    count: usize,
    out: &mut Vec<u8>,
) {
    let mut w = Writer(out);
    w.u8(FORMAT);
    w.u64(count as u64);
    for (start, key, agg) in windows {
        w.i64(start);
        w.bytes(key.as_bytes());
        w.agg(agg);
    }
}

/// Decodes open windows written by [`encode_windows`].
pub fn decode_windows(data: &[u8]) -> Result<Vec<(i64, Box<str>, Aggregate)>, CodecError> {
    let mut r = Reader { b: data, i: 0 };
    r.format()?;
    let n = r.count()?;
    let mut out = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        out.push((r.i64()?, r.string()?.into_boxed_str(), r.agg()?));
    }
    r.end()?;
    Ok(out)
}

/// Version of the binary form, stored first so that a future change can read old checkpoints.
const FORMAT: u8 = 1;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("corrupt checkpoint data: {0}")]
pub struct CodecError(&'static str);

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn agg(&mut self, a: &Aggregate) {
        self.i64(a.count);
        self.i64(a.values);
        self.f64(a.sum);
        self.f64(a.compensation);
        self.f64(a.min);
        self.f64(a.max);
    }
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .i
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(CodecError("truncated"))?;
        let s = &self.b[self.i..end];
        self.i = end;
        Ok(s)
    }
    fn format(&mut self) -> Result<(), CodecError> {
        match self.take(1)? {
            [FORMAT] => Ok(()),
            _ => Err(CodecError("unknown format version")),
        }
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        let s = self.take(8)?;
        Ok(u64::from_le_bytes([
            s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
        ]))
    }
    fn i64(&mut self) -> Result<i64, CodecError> {
        self.u64().map(|v| v as i64)
    }
    fn i32(&mut self) -> Result<i32, CodecError> {
        i32::try_from(self.i64()?).map_err(|_| CodecError("partition out of range"))
    }
    fn f64(&mut self) -> Result<f64, CodecError> {
        self.u64().map(f64::from_bits)
    }
    fn count(&mut self) -> Result<usize, CodecError> {
        usize::try_from(self.u64()?).map_err(|_| CodecError("bad count"))
    }
    fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.count()?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, CodecError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| CodecError("invalid text"))
    }
    fn agg(&mut self) -> Result<Aggregate, CodecError> {
        Ok(Aggregate {
            count: self.i64()?,
            values: self.i64()?,
            sum: self.f64()?,
            compensation: self.f64()?,
            min: self.f64()?,
            max: self.f64()?,
        })
    }
    fn end(&self) -> Result<(), CodecError> {
        if self.i == self.b.len() {
            Ok(())
        } else {
            Err(CodecError("trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Batch {
        let mut agg = Aggregate::default();
        agg.add(Some(1.25));
        agg.add(None);
        Batch {
            windows: vec![ClosedWindow {
                start_ms: -1000,
                end_ms: 0,
                key: "k€".into(),
                agg,
            }],
            late: vec![LateRow {
                key: "k".into(),
                event_time_ms: 5,
                ingest_time_ms: 6,
                payload: "{\"a\":1}".into(),
                window_start_ms: 0,
                window_end_ms: 1000,
                watermark_ms: 2000,
                partition: 3,
                offset: 99,
            }],
            dead: vec![DeadRow {
                partition: 1,
                offset: 0,
                ingest_time_ms: 7,
                raw: vec![0xff, 0, 1],
                error: "not JSON".into(),
            }],
        }
    }

    #[test]
    fn batches_round_trip() {
        let b = sample();
        let mut buf = Vec::new();
        b.encode(&mut buf);
        assert_eq!(Batch::decode(&buf).unwrap(), b);
    }

    #[test]
    fn corrupt_data_is_an_error_not_a_panic() {
        let mut buf = Vec::new();
        sample().encode(&mut buf);
        for cut in 0..buf.len() {
            assert!(Batch::decode(&buf[..cut]).is_err());
        }
        let mut bad = buf.clone();
        bad[0] = 9;
        assert_eq!(
            Batch::decode(&bad),
            Err(CodecError("unknown format version"))
        );
        let mut huge = vec![FORMAT];
        huge.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Batch::decode(&huge).is_err());
    }

    #[test]
    fn open_windows_round_trip() {
        let mut a = Aggregate::default();
        a.add(Some(2.0));
        let ws = [(0i64, "a", &a), (1000, "b", &a)];
        let mut buf = Vec::new();
        encode_windows(ws.iter().copied(), ws.len(), &mut buf);
        let back = decode_windows(&buf).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!((back[1].0, &*back[1].1, back[1].2), (1000, "b", a));
    }
}
