//! Base-128 varints, as Avro (zigzag longs) and Protobuf (plain and zigzag) encode integers.

use super::bytes::ReadError;

const TRUNCATED: ReadError = ReadError::Bad("unexpected end of data");

/// An unsigned varint of at most 10 bytes at `b[*i..]`.
#[inline]
pub(crate) fn unsigned(b: &[u8], i: &mut usize) -> Result<u64, ReadError> {
    let mut v = 0u64;
    for shift in (0..70).step_by(7) {
        let byte = *b.get(*i).ok_or(TRUNCATED)?;
        *i += 1;
        if shift == 63 && byte > 1 {
            return Err(ReadError::Bad("a varint longer than 64 bits"));
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(ReadError::Bad("a varint longer than 10 bytes"))
}

/// A zigzag-encoded signed varint.
#[inline]
pub(crate) fn zigzag(b: &[u8], i: &mut usize) -> Result<i64, ReadError> {
    let u = unsigned(b, i)?;
    Ok(unzigzag(u))
}

#[inline]
pub(crate) fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip_and_truncation_is_an_error() {
        let enc = |mut v: u64| {
            let mut out = Vec::new();
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    out.push(b);
                    return out;
                }
                out.push(b | 0x80);
            }
        };
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let b = enc(v);
            let mut i = 0;
            assert_eq!(unsigned(&b, &mut i), Ok(v));
            assert_eq!(i, b.len());
            let mut i = 0;
            assert!(unsigned(&b[..b.len() - 1], &mut i).is_err());
        }
        for (z, v) in [(0u64, 0i64), (1, -1), (2, 1), (3, -2), (u64::MAX, i64::MIN)] {
            assert_eq!(unzigzag(z), v);
        }
    }
}
