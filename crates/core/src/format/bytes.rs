//! Reading a binary record's bytes, shared by the Avro and Protobuf decoders (and the varints
//! both encode integers with): taking bytes off the record, and why a record does not decode.

/// Why a binary record does not decode (the text goes into the dead letter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadError {
    Bad(&'static str),
    TooDeep,
}

/// The `n` bytes at `b[*i..]`, moving `i` past them.
#[inline]
pub(crate) fn take<'a>(b: &'a [u8], i: &mut usize, n: usize) -> Result<&'a [u8], ReadError> {
    let end = i
        .checked_add(n)
        .filter(|&e| e <= b.len())
        .ok_or(ReadError::Bad("unexpected end of data"))?;
    let s = &b[*i..end];
    *i = end;
    Ok(s)
}

/// `N` bytes at `b[*i..]` (a fixed-width little-endian number), moving `i` past them.
#[inline]
pub(crate) fn array<const N: usize>(b: &[u8], i: &mut usize) -> Result<[u8; N], ReadError> {
    let mut a = [0u8; N];
    a.copy_from_slice(take(b, i, N)?);
    Ok(a)
}
