//! How window rows are written: start, end, key columns, aggregates, and for a job whose rows
//! are written more than once (`emit := 'update'`, `late_updates_ms`) the tail `final`,
//! `revision` (1, 2, ... per key and window start) and `retracted` (a session absorbed by
//! another: its row is withdrawn).

use std::sync::Arc;

use crate::aggregate::{AggSpec, AggState};
use crate::record::key_parts;
use crate::rows::Rows;

/// The end of a row with revisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tail {
    /// The window is closed (its row changes again only by a late update).
    pub closed: bool,
    pub revision: i64,
    pub retracted: bool,
    /// A late correction of a closed window (not the row its close wrote).
    pub correction: bool,
}

/// How a job's window rows are shaped: key columns, aggregates, whether rows carry a [`Tail`].
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    pub nkeys: usize,
    pub aggs: Arc<[AggSpec]>,
    pub revisions: bool,
    /// Rows end with a hidden flag: whether the row is a late correction (a job whose DuckDB
    /// aggregates see a correction's late events, and not the close's; see `config`).
    pub corrections: bool,
}

impl Shape {
    pub fn new(nkeys: usize, aggs: &[AggSpec], revisions: bool) -> Shape {
        Shape {
            nkeys,
            aggs: aggs.into(),
            revisions,
            corrections: false,
        }
    }

    /// Writes one window row: start, end, the key columns, the aggregates (NULL when `states`
    /// is None: a retraction), then the tail when rows have one.
    pub fn write(
        &self,
        out: &mut Rows,
        start: i64,
        end: i64,
        key: &[u8],
        states: Option<&[AggState]>,
        tail: Tail,
    ) {
        let mut row = out.row();
        row.i64(start).i64(end);
        for part in key_parts(key, self.nkeys) {
            row.opt_str(part);
        }
        match states {
            Some(states) => {
                for (a, s) in self.aggs.iter().zip(states) {
                    s.write(a, &mut row);
                }
            }
            None => {
                for _ in self.aggs.iter() {
                    row.cell(crate::rows::Cell::Null);
                }
            }
        }
        if self.revisions {
            row.cell(crate::rows::Cell::Bool(tail.closed))
                .i64(tail.revision)
                .cell(crate::rows::Cell::Bool(tail.retracted));
        }
        if self.corrections {
            row.cell(crate::rows::Cell::Bool(tail.correction));
        }
        row.finish();
    }

    /// The final row of a window (as `emit := 'close'` writes it, with its revision).
    pub fn write_final(
        &self,
        out: &mut Rows,
        start: i64,
        end: i64,
        key: &[u8],
        states: &[AggState],
        revision: i64,
    ) {
        let tail = Tail {
            closed: true,
            revision,
            retracted: false,
            correction: false,
        };
        self.write(out, start, end, key, Some(states), tail);
    }
}
