//! A statement's windows in a job of several statements over one read. The engine reads and
//! decodes each event once and keeps one set of partition watermarks; each statement (a layer)
//! places the event in windows of its own kind and size, by its own keys, in shards of its own,
//! exactly as the statement run alone would. A job of one statement, or of parameters, has one
//! layer: the job's own.

use std::sync::Arc;

use crate::chunk::Chunk;
use crate::codec::{CodecError, Reader, Writer};
use crate::config::EngineConfig;
use crate::pool::Actor;
use crate::prefilter::Prefilter;
use crate::rows::{ColumnType, Rows};
use crate::shard::{Shard, ShardWork, Windows};
use crate::state::{Batch, OutputSchemas};
use crate::watermark::NO_WATERMARK;

/// The first byte of the open windows of a job of several statements (a job of one stores its
/// windows' own form, whose first byte is their format's version, 1 or 2).
const LAYERS_FORMAT: u8 = 0x4c;

pub(crate) struct Layer {
    pub cfg: Arc<EngineConfig>,
    /// Its place among the statements of a job of several (None: the job's own windows).
    pub index: Option<usize>,
    /// The place of its first aggregate among the job's (a job of several decodes the inputs
    /// of all its statements' aggregates, one after the other).
    pub inputs_from: usize,
    /// A job of several: where a flush moved this statement's watermark (each statement's own,
    /// as if run alone: a flush closes its last windows, which end where its windows do). A
    /// job of one raises the job's watermark instead.
    pub floor_ms: i64,
    pub schemas: OutputSchemas,
    pub staged_types: Vec<ColumnType>,
    /// The events it can read at all (None: every event), by the job's typed columns.
    pub prefilter: Option<Prefilter>,
}

impl Layer {
    /// The layers of a job: its statements', or its own.
    pub(crate) fn of(cfg: &Arc<EngineConfig>) -> Vec<Layer> {
        let job = Arc::clone(cfg);
        let one = |cfg: Arc<EngineConfig>, index, inputs_from| Layer {
            schemas: cfg.schemas(),
            staged_types: cfg.staged_schema().types(),
            prefilter: Prefilter::new(&cfg.prefilter, &job.columns),
            cfg,
            index,
            inputs_from,
            floor_ms: NO_WATERMARK,
        };
        if cfg.layers.is_empty() {
            return vec![one(Arc::clone(cfg), None, 0)];
        }
        let mut from = 0;
        cfg.layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let layer = one(Arc::new(l.clone()), Some(i), from);
                from += l.aggregates.len();
                layer
            })
            .collect()
    }

    /// Whether it reads message `i` of the chunk at all (see [`Prefilter`]).
    #[inline]
    pub(crate) fn reads(&self, chunk: &Chunk, i: usize) -> bool {
        self.prefilter
            .as_ref()
            .is_none_or(|f| f.passes(chunk.typed(i)))
    }

    /// The watermark this layer's windows close by, the job's being `global_ms`.
    #[inline]
    pub(crate) fn watermark(&self, global_ms: i64) -> i64 {
        global_ms.max(self.floor_ms)
    }

    /// Moves the layer's output from its shards into `out` (the batch, or its layer's part).
    pub(crate) fn take_output(&self, shards: &[Actor<Shard, ShardWork>], out: &mut Batch) {
        let stages = self.cfg.stages();
        if stages && out.staged.rows.types() != self.staged_types.as_slice() {
            out.staged.rows = Rows::new(self.staged_types.clone());
        }
        let mut live: Option<i64> = None;
        for s in shards {
            let mut st = s.state();
            out.windows.take_from(&mut st.out.windows);
            out.late.take_from(&mut st.out.late);
            if stages {
                out.staged.rows.take_from(&mut st.out.staged);
                if let Some(p) = st.windows.first_live_pane() {
                    live = Some(live.map_or(p, |l| l.min(p)));
                }
            }
        }
        out.staged.live_from_pane_ms = live;
    }
}

/// A layer's floor and its stored windows (None: a new job).
pub(crate) type Stored<'a> = (i64, Option<&'a [u8]>);

/// The checkpoint form of a job's open windows (`windows`: its shards', layer after layer): a
/// job of one, its windows' own form; a job of several statements, each one's floor and its
/// windows' own form.
pub(crate) fn encode(layers: &[Layer], windows: &[&Windows], out: &mut Vec<u8>) {
    if layers.iter().all(|l| l.index.is_none()) {
        Windows::encode_all(windows, out);
        return;
    }
    let mut w = Writer(out);
    w.u8(LAYERS_FORMAT);
    w.u64(layers.len() as u64);
    let per_layer = (windows.len() / layers.len()).max(1);
    for (l, shards) in layers.iter().zip(windows.chunks(per_layer)) {
        let mut form = Vec::new();
        Windows::encode_all(shards, &mut form);
        w.i64(l.floor_ms);
        w.bytes(&form);
    }
}

/// Each layer's floor and stored windows, from what `encode` (a job of several) or the
/// windows' own form (a job of one) stored; `None`: a new job.
pub(crate) fn decode<'a>(
    data: Option<&'a [u8]>,
    layers: &[Layer],
) -> Result<Vec<Stored<'a>>, CodecError> {
    let several = layers.iter().any(|l| l.index.is_some());
    let Some(data) = data else {
        return Ok(layers.iter().map(|_| (NO_WATERMARK, None)).collect());
    };
    if !several {
        if data.first() == Some(&LAYERS_FORMAT) {
            return Err(CodecError("open windows of a job of several statements"));
        }
        return Ok(vec![(NO_WATERMARK, Some(data))]);
    }
    let mut r = Reader { b: data, i: 0 };
    if r.u8()? != LAYERS_FORMAT {
        return Err(CodecError("open windows of a job of one statement"));
    }
    if r.count()? != layers.len() {
        return Err(CodecError("open windows of another number of statements"));
    }
    let mut out = Vec::with_capacity(layers.len());
    for _ in layers {
        let floor = r.i64()?;
        out.push((floor, Some(r.bytes()?)));
    }
    r.end()?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyColumn;
    use crate::decode::FieldPath;

    fn job(statements: usize) -> Arc<EngineConfig> {
        let mut cfg = EngineConfig::for_tests(1000, 0);
        for i in 0..statements {
            let mut l = cfg.clone();
            l.keys = vec![KeyColumn {
                path: FieldPath::parse("k").expect("a path"),
                name: format!("k{i}"),
            }];
            cfg.layers.push(l);
        }
        Arc::new(cfg)
    }

    #[test]
    fn each_statement_gets_its_floor_and_windows_back() {
        let layers = Layer::of(&job(2));
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[1].inputs_from, layers[0].cfg.aggregates.len());
        let mut layers = layers;
        layers[0].floor_ms = 5;
        let windows: Vec<Windows> = layers.iter().map(|l| Windows::new(&l.cfg, 0)).collect();
        let mut one = Vec::new();
        Windows::encode_all(&[&windows[0]], &mut one);
        let mut out = Vec::new();
        encode(&layers, &windows.iter().collect::<Vec<_>>(), &mut out);
        let back = decode(Some(&out), &layers).expect("decodes");
        assert_eq!(
            back,
            vec![(5, Some(&one[..])), (NO_WATERMARK, Some(&one[..]))]
        );
        assert!(decode(Some(&out[..out.len() - 1]), &layers).is_err());
        // Another number of statements, or a job of one, is not this job's state.
        assert!(decode(Some(&out), &Layer::of(&job(3))).is_err());
        assert!(decode(Some(&out), &Layer::of(&job(0))).is_err());
        assert!(decode(Some(&[2, 0]), &layers).is_err());
        assert_eq!(decode(None, &layers).expect("new").len(), 2);
    }

    mod as_alone {
        //! A job of several statements writes, for each, what the statement alone writes.
        use crate::columns::TypedColumn;
        use crate::config::{EngineConfig, KeyColumn, WindowKind};
        use crate::decode::FieldPath;
        use crate::engine::{Engine, PartitionProgress, Restored};
        use crate::pipeline::{read_cycle, CycleLimits, ReadState, Stop};
        use crate::pool::Pool;
        use crate::rows::OwnedCell;
        use crate::source::memory::MemorySource;
        use crate::state::Batch;
        use crate::watermark::{PartitionClock, NO_WATERMARK};
        use std::sync::Arc;

        fn p(s: &str) -> FieldPath {
            FieldPath::parse(s).expect("a path")
        }

        /// A statement: its window, and its keys among the typed columns `k` and `g`.
        fn statement(window: WindowKind, window_ms: i64, keys: &[&str]) -> EngineConfig {
            let mut c = EngineConfig::for_tests(window_ms, 150);
            c.window = window;
            c.columns = vec![
                TypedColumn::new(p("key"), "k", "VARCHAR"),
                TypedColumn::new(p("g"), "g", "BIGINT"),
            ];
            c.keys = keys
                .iter()
                .map(|k| KeyColumn {
                    path: p(if *k == "k" { "key" } else { "g" }),
                    name: format!("__se_{k}"),
                })
                .collect();
            c.default_key = false;
            c.null_keys = true;
            c.late_updates_ms = Some(400);
            c
        }

        fn statements() -> Vec<EngineConfig> {
            let mut staged = statement(WindowKind::Tumbling, 1000, &["k"]);
            staged.stage_all = true;
            vec![
                staged,
                statement(WindowKind::Hopping { hop_ms: 500 }, 2000, &["g", "k"]),
                statement(WindowKind::Session, 300, &["g"]),
            ]
        }

        fn together() -> EngineConfig {
            let layers = statements();
            let mut c = layers[0].clone();
            c.keys = Vec::new();
            c.aggregates = layers.iter().flat_map(|l| l.aggregates.clone()).collect();
            c.layers = layers;
            c
        }

        /// Events of three partitions, out of order within `lateness` and beyond it, some
        /// with a NULL `g`.
        fn data(from: i64, n: i64) -> Vec<Vec<String>> {
            (0..3)
                .map(|part| {
                    (0..n)
                        .map(|i| {
                            let t = from + i * 97 + part * 31 - if i % 7 == 3 { 900 } else { 0 };
                            let g = if i % 5 == 0 {
                                "null".to_string()
                            } else {
                                (i % 3).to_string()
                            };
                            format!(
                                r#"{{"key":"k{}","g":{g},"event_time_ms":{t},"payload":{{"value":{}}}}}"#,
                                (i + part) % 4,
                                i % 11
                            )
                        })
                        .collect()
                })
                .collect()
        }

        type Out = Vec<(
            Vec<Vec<OwnedCell>>,
            Vec<Vec<OwnedCell>>,
            Vec<Vec<OwnedCell>>,
        )>;

        /// Two bounded runs (the second reads more), each stopping every `stop_every`
        /// messages and resuming from the engine's checkpoint form, each flushed at its end:
        /// per statement, its window rows, late events and staged events, sorted.
        fn run(cfg: &EngineConfig, statements: usize, stop_every: u64) -> Out {
            let pool = Arc::new(Pool::new(2));
            let fresh = |r| Engine::with_pool(cfg, r, 0, "t", Arc::clone(&pool)).expect("engine");
            let mut eng = fresh(Restored {
                floor_ms: NO_WATERMARK,
                partitions: (0..3)
                    .map(|i| PartitionProgress {
                        partition: i,
                        next_offset: 0,
                        clock: PartitionClock::new(None, 0),
                    })
                    .collect(),
                open_windows: None,
            });
            let mut out: Out = vec![Default::default(); statements];
            for all in [data(0, 60), {
                let mut more = data(0, 60);
                for (m, extra) in more.iter_mut().zip(data(6_500, 40)) {
                    m.extend(extra);
                }
                more
            }] {
                loop {
                    let starts: Vec<i64> = eng.progress().iter().map(|p| p.next_offset).collect();
                    let mut src = MemorySource::new(all.clone(), &starts);
                    let mut state = ReadState::new(3);
                    let limits = CycleLimits::for_tests(stop_every);
                    let stop =
                        read_cycle(&mut eng, &mut src, &mut state, &limits, &|| 0).expect("reads");
                    if stop == Stop::CaughtUp {
                        eng.flush().expect("flushes");
                    }
                    let mut b = Batch::empty(&eng.cfg().schemas());
                    eng.take_output(&mut b).expect("output");
                    let parts: Vec<&Batch> = if b.layers.is_empty() {
                        vec![&b]
                    } else {
                        b.layers.iter().collect()
                    };
                    for (o, part) in out.iter_mut().zip(parts) {
                        o.0.extend(part.windows.to_vec());
                        o.1.extend(part.late.to_vec());
                        o.2.extend(part.staged.rows.to_vec());
                    }
                    let mut open = Vec::new();
                    eng.encode_open_windows(&mut open).expect("encodes");
                    let (progress, floor) = (eng.progress(), eng.watermark_ms());
                    eng = fresh(Restored {
                        floor_ms: floor,
                        partitions: progress,
                        open_windows: Some(open),
                    });
                    if stop == Stop::CaughtUp {
                        break;
                    }
                }
            }
            for o in &mut out {
                for rows in [&mut o.0, &mut o.1, &mut o.2] {
                    rows.sort_by_key(|r| format!("{r:?}"));
                }
            }
            out
        }

        #[test]
        fn each_statement_writes_what_it_writes_alone() {
            for stop_every in [u64::MAX, 23] {
                let set = run(&together(), 3, stop_every);
                for (i, alone) in statements().iter().enumerate() {
                    let one = run(alone, 1, stop_every).remove(0);
                    assert!(!one.0.is_empty() && !one.1.is_empty(), "statement {i}");
                    assert_eq!(one.2.is_empty(), i > 0, "statement {i} stages");
                    assert_eq!(set[i], one, "statement {i}, stopping every {stop_every}");
                }
            }
        }
    }
}
