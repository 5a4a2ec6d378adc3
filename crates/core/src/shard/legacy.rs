//! The open windows version 0.1 stored (format 1: tumbling windows of the default job only),
//! still readable so a job checkpointed by that version resumes after an upgrade.

use crate::aggregate::{AggState, SumState};
use crate::codec::{CodecError, Reader};
use crate::window::PaneStore;

/// Open windows: (start, key, count, values, sum, compensation, min, max) each, into `stores`
/// (new ones for the default job's tumbling windows) by `route`.
pub(super) fn decode_windows_into(
    stores: &mut [PaneStore],
    route: &dyn Fn(&[u8]) -> usize,
    data: &[u8],
) -> Result<(), CodecError> {
    let mut r = Reader { b: data, i: 0 };
    r.u8()?;
    for _ in 0..r.count()? {
        let start = r.i64()?;
        let key: Box<[u8]> = r.bytes()?.into();
        let (count, values) = (r.i64()?, r.i64()?);
        let (sum, comp, min, max) = (r.f64()?, r.f64()?, r.f64()?, r.f64()?);
        let has = values > 0;
        let states: Box<[AggState]> = Box::new([
            AggState::Count(count),
            AggState::Sum(SumState {
                n: values,
                sum,
                comp,
            }),
            AggState::Min(has.then_some(min)),
            AggState::Max(has.then_some(max)),
        ]);
        stores
            .get_mut(route(&key))
            .ok_or(CodecError("no store for a key"))?
            .insert_states(start, &key, states);
    }
    r.end()
}
