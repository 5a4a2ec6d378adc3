//! The open windows version 0.1 stored (format 1: tumbling windows of the default job only),
//! still readable so a job checkpointed by that version resumes after an upgrade.

use crate::aggregate::{AggState, SumState};
use crate::codec::{CodecError, Reader};
use crate::config::EngineConfig;
use crate::emit::Shape;
use crate::window::PaneStore;

/// Open windows: (start, key, count, values, sum, compensation, min, max) each.
pub(super) fn decode_windows(
    cfg: &EngineConfig,
    floor_ms: i64,
    data: &[u8],
) -> Result<PaneStore, CodecError> {
    let size = cfg.time.window_ms;
    let shape = Shape::new(1, &cfg.aggregates, false);
    let mut store = PaneStore::new(size, size, shape, floor_ms);
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
        store.insert_states(start, &key, states);
    }
    r.end()?;
    Ok(store)
}
