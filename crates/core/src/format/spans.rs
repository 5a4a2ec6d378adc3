//! Where the binary decoders put the fields they find: the job's paths as bit masks, and
//! [`Out`], which fills the same spans the JSON decoder fills.

use std::io::Write;

use crate::decode::{FieldPath, Kind, Span};

/// Every path's bit.
pub(crate) fn all_paths(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The paths whose segment at `depth` is `name`: those that end there, and those that go on.
pub(crate) fn masks(paths: &[FieldPath], depth: usize, name: &[u8]) -> (u64, u64) {
    let (mut leaf, mut deeper) = (0, 0);
    for (i, p) in paths.iter().enumerate().take(64) {
        let segs = p.segments();
        if segs.get(depth).map(|s| &s[..]) == Some(name) {
            if segs.len() == depth + 1 {
                leaf |= 1 << i;
            } else {
                deeper |= 1 << i;
            }
        }
    }
    (leaf, deeper)
}

/// Where a binary decoder puts the fields it finds: the same spans the JSON decoder fills
/// (strings in the message itself; numbers rendered into the scratch buffer as JSON writes
/// them, so the rest of the pipeline reads every format alike).
pub(crate) struct Out<'a> {
    pub spans: &'a mut [Span],
    pub scratch: &'a mut Vec<u8>,
    /// Where the record starts in the message (after the wire-format header).
    pub base: usize,
    /// Paths given a value.
    pub found: u64,
    /// Paths only numeric aggregates read (a float there needs no text).
    pub numbers_only: u64,
}

impl Out<'_> {
    #[inline]
    fn each(&mut self, mask: u64, span: Span) {
        let mut m = mask;
        while m != 0 {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            if let Some(s) = self.spans.get_mut(i) {
                *s = span;
            }
        }
        self.found |= mask;
    }

    /// A value with no text (null, an object, an array).
    #[inline]
    pub fn set(&mut self, mask: u64, kind: Kind) {
        if mask != 0 {
            self.each(mask, Span::new(kind, 0, 0, false, false));
        }
    }

    /// Text copied into the scratch buffer.
    #[inline]
    pub fn set_scratch(&mut self, mask: u64, kind: Kind, text: &[u8], integer: bool) {
        if mask != 0 {
            let start = self.scratch.len();
            self.scratch.extend_from_slice(text);
            self.each(
                mask,
                Span::new(kind, start, self.scratch.len(), true, integer),
            );
        }
    }

    /// An integer (`timestamp`: epoch milliseconds of a timestamp type: an event time as is).
    #[inline]
    pub fn set_int(&mut self, mask: u64, v: i64, timestamp: bool) {
        if mask != 0 {
            let start = self.scratch.len();
            if v < 0 {
                self.scratch.push(b'-');
            }
            digits(self.scratch, v.unsigned_abs());
            let mut s = Span::new(Kind::Number, start, self.scratch.len(), true, true);
            s.timestamp = timestamp;
            self.each(mask, s);
        }
    }

    #[inline]
    pub fn set_uint(&mut self, mask: u64, v: u64) {
        if mask != 0 {
            let start = self.scratch.len();
            digits(self.scratch, v);
            self.each(
                mask,
                Span::new(Kind::Number, start, self.scratch.len(), true, true),
            );
        }
    }

    /// A floating-point number; NaN and infinities are not numbers JSON can write, so they
    /// read as nulls would.
    #[inline]
    pub fn set_float(&mut self, mask: u64, v: f64) {
        let text = mask & !self.numbers_only != 0;
        self.float(mask, v.is_finite(), Some(v), |out| {
            if text {
                let _ = write!(out, "{v:?}");
            }
        });
    }

    /// A 32-bit float, written with the digits it was given (0.1, not 0.10000000149011612),
    /// which is what it reads as.
    #[inline]
    pub fn set_f32(&mut self, mask: u64, v: f32) {
        self.float(mask, v.is_finite(), None, |out| {
            let _ = write!(out, "{v:?}");
        });
    }

    #[inline]
    fn float(
        &mut self,
        mask: u64,
        finite: bool,
        number: Option<f64>,
        text: impl FnOnce(&mut Vec<u8>),
    ) {
        if mask == 0 {
            return;
        }
        if !finite {
            return self.set(mask, Kind::Null);
        }
        let start = self.scratch.len();
        text(self.scratch);
        let mut s = Span::new(Kind::Number, start, self.scratch.len(), true, false);
        s.number = number;
        self.each(mask, s);
    }

    /// A string (or bytes) at `pos` in the record: text when it is UTF-8, else binary data.
    #[inline]
    pub fn set_raw(&mut self, mask: u64, pos: usize, s: &[u8]) {
        if mask != 0 {
            let kind = if std::str::from_utf8(s).is_ok() {
                Kind::String
            } else {
                Kind::Bytes
            };
            let start = self.base + pos;
            self.each(mask, Span::new(kind, start, start + s.len(), false, false));
        }
    }
}

/// The decimal digits of `v`, appended (what `write!` does, without its formatting machinery).
#[inline]
fn digits(out: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}
