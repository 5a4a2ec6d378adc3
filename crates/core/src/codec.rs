//! The one binary codec of checkpoint data: little-endian integers and floats, length-prefixed
//! bytes, and a reader that turns every truncation or bad length into a [`CodecError`] (a
//! damaged checkpoint is an error, never a wrong value or a panic).

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("corrupt checkpoint data: {0}")]
pub struct CodecError(pub &'static str);

pub(crate) struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    #[inline]
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    #[inline]
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub(crate) fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    #[inline]
    pub(crate) fn f64(&mut self, v: f64) {
        self.0.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    #[inline]
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
}

pub(crate) struct Reader<'a> {
    pub b: &'a [u8],
    pub i: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .i
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(CodecError("truncated"))?;
        let s = &self.b[self.i..end];
        self.i = end;
        Ok(s)
    }
    #[inline]
    pub(crate) fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    #[inline]
    pub(crate) fn u32(&mut self) -> Result<u32, CodecError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    #[inline]
    pub(crate) fn u64(&mut self) -> Result<u64, CodecError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    #[inline]
    pub(crate) fn i64(&mut self) -> Result<i64, CodecError> {
        self.u64().map(|v| v as i64)
    }
    #[inline]
    pub(crate) fn i32(&mut self) -> Result<i32, CodecError> {
        i32::try_from(self.i64()?).map_err(|_| CodecError("partition out of range"))
    }
    #[inline]
    pub(crate) fn f64(&mut self) -> Result<f64, CodecError> {
        self.u64().map(f64::from_bits)
    }
    #[inline]
    pub(crate) fn count(&mut self) -> Result<usize, CodecError> {
        let n = usize::try_from(self.u64()?).map_err(|_| CodecError("bad count"))?;
        // A count can never exceed the bytes left (every item takes at least one byte).
        if n > self.b.len().saturating_sub(self.i) {
            return Err(CodecError("bad count"));
        }
        Ok(n)
    }
    #[inline]
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.count()?;
        self.take(n)
    }
    #[inline]
    pub(crate) fn string(&mut self) -> Result<String, CodecError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| CodecError("invalid text"))
    }
    pub(crate) fn end(&self) -> Result<(), CodecError> {
        if self.i == self.b.len() {
            Ok(())
        } else {
            Err(CodecError("trailing bytes"))
        }
    }
}
