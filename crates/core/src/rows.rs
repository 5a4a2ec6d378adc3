//! Output rows. Each output table is declared once, as a [`TableSchema`] (column names, types
//! and primary key); its rows are kept in a compact binary encoding derived from that schema.
//! The same bytes are the engine's output buffer, the checkpoint outbox's format and what the
//! DuckDB sink reads, so a column cannot be written in one order and read in another.

use std::fmt;

use crate::codec::{CodecError, Reader};

/// The SQL types of output columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Boolean,
    Integer,
    BigInt,
    Double,
    Varchar,
    Blob,
    /// `DOUBLE[]`, carried as its text (`[0.5, 2.0]`); the table's column casts it on insert.
    DoubleList,
}

impl ColumnType {
    /// The DuckDB type name.
    pub fn sql(self) -> &'static str {
        match self {
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Integer => "INTEGER",
            ColumnType::BigInt => "BIGINT",
            ColumnType::Double => "DOUBLE",
            ColumnType::Varchar => "VARCHAR",
            ColumnType::Blob => "BLOB",
            ColumnType::DoubleList => "DOUBLE[]",
        }
    }

    fn code(self) -> u8 {
        match self {
            ColumnType::Boolean => 1,
            ColumnType::Integer => 2,
            ColumnType::BigInt => 3,
            ColumnType::Double => 4,
            ColumnType::Varchar => 5,
            ColumnType::Blob => 6,
            ColumnType::DoubleList => 7,
        }
    }

    fn from_code(c: u8) -> Option<ColumnType> {
        Some(match c {
            1 => ColumnType::Boolean,
            2 => ColumnType::Integer,
            3 => ColumnType::BigInt,
            4 => ColumnType::Double,
            5 => ColumnType::Varchar,
            6 => ColumnType::Blob,
            7 => ColumnType::DoubleList,
            _ => return None,
        })
    }
}

/// One column of an output table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    /// The type of its values in the rows.
    pub ty: ColumnType,
    pub role: Role,
}

/// How a column of the rows meets the table's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Role {
    /// The table's column has the rows' type and takes their values.
    #[default]
    Plain,
    /// The table's column has this DuckDB type, and the rows' text is cast to it (a typed key).
    Cast(String),
    /// The table's column has this DuckDB type and DuckDB computes its value (an aggregate over
    /// the window's staged events); the rows hold NULL in its place.
    Computed(String),
    /// In the rows only, not in the table: what the sink needs to compute the others.
    Hidden,
    /// In the table only: every row takes this SQL value (the job's name, in a table several
    /// jobs share). The rows have no slot for it, so such columns come after all of theirs.
    Given { sql_type: String, value: String },
}

impl Column {
    pub fn new(name: &str, ty: ColumnType) -> Column {
        Column {
            name: name.to_string(),
            ty,
            role: Role::Plain,
        }
    }

    /// The column's DuckDB type in the table (None for a hidden one).
    pub fn sql_type(&self) -> Option<&str> {
        match &self.role {
            Role::Plain => Some(self.ty.sql()),
            Role::Cast(t) | Role::Computed(t) | Role::Given { sql_type: t, .. } => Some(t),
            Role::Hidden => None,
        }
    }
}

/// An output table's shape: its columns in order and its primary key (column names, in key
/// order; empty for a table without one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSchema {
    pub columns: Vec<Column>,
    pub primary_key: Vec<String>,
}

fn columns(list: &[(&str, ColumnType)]) -> Vec<Column> {
    list.iter()
        .map(|&(name, ty)| Column::new(name, ty))
        .collect()
}

impl TableSchema {
    pub fn new(list: &[(&str, ColumnType)], primary_key: &[&str]) -> TableSchema {
        TableSchema {
            columns: columns(list),
            primary_key: primary_key.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// `late_events` (SPEC section 5).
    pub fn late_events() -> TableSchema {
        use ColumnType::*;
        TableSchema::new(
            &[
                ("key", Varchar),
                ("event_time_ms", BigInt),
                ("ingest_time_ms", BigInt),
                ("payload_json", Varchar),
                ("window_start_ms", BigInt),
                ("window_end_ms", BigInt),
                ("watermark_ms", BigInt),
                ("topic", Varchar),
                ("partition", Integer),
                ("offset", BigInt),
            ],
            &["topic", "partition", "offset"],
        )
    }

    /// `dead_letters` (SPEC section 5).
    pub fn dead_letters() -> TableSchema {
        use ColumnType::*;
        TableSchema::new(
            &[
                ("topic", Varchar),
                ("partition", Integer),
                ("offset", BigInt),
                ("ingest_time_ms", BigInt),
                ("raw", Blob),
                ("error", Varchar),
            ],
            &["topic", "partition", "offset"],
        )
    }

    /// The types of the rows' columns (a given column has no place in them).
    pub fn types(&self) -> Vec<ColumnType> {
        self.columns
            .iter()
            .filter(|c| !matches!(c.role, Role::Given { .. }))
            .map(|c| c.ty)
            .collect()
    }

    /// The same table with a column every row of which takes `value` (a SQL literal), last;
    /// `key`: it leads the primary key (a table shared by jobs: its key names the job).
    pub fn with_given(&self, name: &str, sql_type: &str, value: &str, key: bool) -> TableSchema {
        let mut s = self.clone();
        let mut c = Column::new(name, ColumnType::Varchar);
        c.role = Role::Given {
            sql_type: sql_type.to_string(),
            value: value.to_string(),
        };
        s.columns.push(c);
        if key && !s.primary_key.is_empty() {
            s.primary_key.insert(0, name.to_string());
        }
        s
    }

    /// The columns the table has (all but the hidden ones), with their place in the rows.
    pub fn table_columns(&self) -> impl Iterator<Item = (usize, &Column)> {
        self.columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.role != Role::Hidden)
    }

    /// Whether every column of the rows is the table's as it is (no cast, computed or hidden
    /// column): the rows can be inserted as they are.
    pub fn plain(&self) -> bool {
        self.columns.iter().all(|c| c.role == Role::Plain)
    }

    /// The same table without a primary key (append mode).
    pub fn without_key(&self) -> TableSchema {
        TableSchema {
            columns: self.columns.clone(),
            primary_key: Vec::new(),
        }
    }
}

/// One value of a row, borrowed from where it is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Cell<'a> {
    Null,
    Bool(bool),
    I32(i32),
    I64(i64),
    F64(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
}

impl Cell<'_> {
    /// Whether the cell can be stored in a column of type `ty` (NULL fits everywhere).
    pub fn fits(&self, ty: ColumnType) -> bool {
        matches!(
            (self, ty),
            (Cell::Null, _)
                | (Cell::Bool(_), ColumnType::Boolean)
                | (Cell::I32(_), ColumnType::Integer)
                | (Cell::I64(_), ColumnType::BigInt)
                | (Cell::F64(_), ColumnType::Double)
                | (Cell::Str(_), ColumnType::Varchar | ColumnType::DoubleList)
                | (Cell::Bytes(_), ColumnType::Blob)
        )
    }
}

impl fmt::Display for Cell<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Bool(b) => write!(f, "{b}"),
            Cell::I32(v) => write!(f, "{v}"),
            Cell::I64(v) => write!(f, "{v}"),
            Cell::F64(v) => write!(f, "{v}"),
            Cell::Str(s) => f.write_str(s),
            Cell::Bytes(b) => write!(f, "{}", String::from_utf8_lossy(b)),
        }
    }
}

/// Rows of one table, encoded. A value written with a type its column does not have is not
/// dropped: the rows remember the first such mistake and [`Rows::check`] reports it, which
/// fails the cycle (it is a bug, never bad input).
#[derive(Debug, Clone)]
pub struct Rows {
    types: Vec<ColumnType>,
    buf: Vec<u8>,
    len: usize,
    error: Option<String>,
    /// The most bytes held since the buffer was last looked at, and the clears since (see
    /// [`Rows::clear`]).
    peak: usize,
    clears: u32,
}

impl PartialEq for Rows {
    fn eq(&self, other: &Rows) -> bool {
        self.types == other.types
            && self.len == other.len
            && self.buf == other.buf
            && self.error == other.error
    }
}

/// Every this many clears, a buffer that holds more than twice what it needed since (and more
/// than `KEEP_BYTES`) is shrunk to that: rows reused cycle after cycle do not keep one cycle's
/// peak for the rest of a long run.
const SHRINK_EVERY: u32 = 16;
const KEEP_BYTES: usize = 1 << 20;

/// Where [`Rows::each_from`] goes on from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowCursor {
    byte: usize,
    row: usize,
}

const NULL: u8 = 0;
const VALUE: u8 = 1;

impl Rows {
    pub fn new(types: Vec<ColumnType>) -> Rows {
        Rows {
            types,
            buf: Vec::new(),
            len: 0,
            error: None,
            peak: 0,
            clears: 0,
        }
    }

    pub fn types(&self) -> &[ColumnType] {
        &self.types
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Encoded size in bytes.
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    pub fn clear(&mut self) {
        self.peak = self.peak.max(self.buf.len());
        self.clears += 1;
        if self.clears >= SHRINK_EVERY {
            let need = self.peak.max(KEEP_BYTES);
            if self.buf.capacity() > 2 * need {
                self.buf = Vec::with_capacity(self.peak);
            }
            (self.peak, self.clears) = (0, 0);
        }
        self.buf.clear();
        self.len = 0;
        self.error = None;
    }

    /// The bytes its buffer holds.
    pub fn held_bytes(&self) -> usize {
        self.buf.capacity()
    }

    /// Starts a row; the writer must be given every column, in order, then finished.
    #[inline]
    pub(crate) fn row(&mut self) -> RowWriter<'_> {
        let start = self.buf.len();
        RowWriter {
            rows: self,
            col: 0,
            start,
            ok: true,
            done: false,
        }
    }

    /// Appends the rows of `other` (of the same types) and empties it.
    pub(crate) fn take_from(&mut self, other: &mut Rows) {
        if self.error.is_none() {
            if other.types != self.types {
                self.error = Some("rows of another table appended".into());
            } else {
                self.error = other.error.take();
            }
        }
        self.buf.extend_from_slice(&other.buf);
        self.len += other.len;
        other.clear();
    }

    /// Appends a row given as cells.
    pub fn push(&mut self, cells: &[Cell<'_>]) {
        let mut w = self.row();
        for c in cells {
            w.cell(*c);
        }
        w.finish();
    }

    /// The first type mistake made while writing, if any.
    pub fn check(&self) -> Result<(), String> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Calls `f` with each row's cells, in order.
    pub fn each<E>(
        &self,
        mut f: impl FnMut(&[Cell<'_>]) -> Result<(), E>,
    ) -> Result<Result<(), E>, CodecError> {
        let mut at = RowCursor::default();
        Ok(self
            .each_from(&mut at, self.len, |_, cells| f(cells))?
            .map(|_| ()))
    }

    /// Calls `f` with the index (counted from `at`) and cells of each of the next `max` rows
    /// after `at`, and moves `at` past them: the rows a chunk at a time. Returns how many rows
    /// it visited (fewer than `max` at the end).
    pub fn each_from<E>(
        &self,
        at: &mut RowCursor,
        max: usize,
        mut f: impl FnMut(usize, &[Cell<'_>]) -> Result<(), E>,
    ) -> Result<Result<usize, E>, CodecError> {
        let mut r = Reader {
            b: &self.buf,
            i: at.byte,
        };
        let n = max.min(self.len.saturating_sub(at.row));
        let mut cells: Vec<Cell<'_>> = Vec::with_capacity(self.types.len());
        for i in 0..n {
            cells.clear();
            for &ty in &self.types {
                cells.push(read_cell(&mut r, ty)?);
            }
            if let Err(e) = f(i, &cells) {
                return Ok(Err(e));
            }
        }
        (at.byte, at.row) = (r.i, at.row + n);
        if at.row == self.len && r.i != self.buf.len() {
            return Err(CodecError("trailing bytes"));
        }
        Ok(Ok(n))
    }

    /// Every row as owned cells (tests and small tables).
    pub fn to_vec(&self) -> Vec<Vec<OwnedCell>> {
        let mut out = Vec::with_capacity(self.len);
        let _ = self.each(|cells| {
            out.push(cells.iter().map(OwnedCell::from).collect());
            Ok::<(), ()>(())
        });
        out
    }

    /// Appends the encoded form (types, row count, bytes) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
        out.extend(self.types.iter().map(|t| t.code()));
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        out.extend_from_slice(&(self.buf.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.buf);
    }

    /// Decodes what [`Rows::encode`] wrote at `data[*at..]`, checking every row against the
    /// types (so that a damaged checkpoint is an error, never a wrong value).
    pub fn decode(data: &[u8], at: &mut usize) -> Result<Rows, CodecError> {
        let mut r = Reader { b: data, i: *at };
        let ncols = r.u32()? as usize;
        let types = r
            .take(ncols)?
            .iter()
            .map(|&c| ColumnType::from_code(c).ok_or(CodecError("unknown column type")))
            .collect::<Result<Vec<_>, _>>()?;
        let len = usize::try_from(r.u64()?).map_err(|_| CodecError("bad row count"))?;
        let bytes = usize::try_from(r.u64()?).map_err(|_| CodecError("bad length"))?;
        let buf = r.take(bytes)?.to_vec();
        *at = r.i;
        let rows = Rows {
            types,
            buf,
            len,
            error: None,
            peak: 0,
            clears: 0,
        };
        rows.each(|_| Ok::<(), ()>(()))?
            .map_err(|()| CodecError("unreadable row"))?;
        Ok(rows)
    }
}

/// Writes one row into [`Rows`], column by column.
pub(crate) struct RowWriter<'a> {
    rows: &'a mut Rows,
    col: usize,
    start: usize,
    ok: bool,
    done: bool,
}

impl RowWriter<'_> {
    #[inline]
    fn expect(&mut self, cell: &Cell<'_>) -> bool {
        let ok = match self.rows.types.get(self.col) {
            Some(&ty) => cell.fits(ty),
            None => false,
        };
        if !ok {
            self.ok = false;
        }
        if !ok && self.rows.error.is_none() {
            self.rows.error = Some(format!(
                "output row: column {} written as {cell:?}, declared {:?}",
                self.col,
                self.rows.types.get(self.col)
            ));
        }
        self.col += 1;
        ok
    }

    #[inline]
    pub(crate) fn cell(&mut self, cell: Cell<'_>) -> &mut Self {
        if self.expect(&cell) {
            let b = &mut self.rows.buf;
            match cell {
                Cell::Null => b.push(NULL),
                Cell::Bool(v) => b.extend_from_slice(&[VALUE, u8::from(v)]),
                Cell::I32(v) => {
                    b.push(VALUE);
                    b.extend_from_slice(&v.to_le_bytes());
                }
                Cell::I64(v) => {
                    b.push(VALUE);
                    b.extend_from_slice(&v.to_le_bytes());
                }
                Cell::F64(v) => {
                    b.push(VALUE);
                    b.extend_from_slice(&v.to_bits().to_le_bytes());
                }
                Cell::Str(s) => {
                    b.push(VALUE);
                    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    b.extend_from_slice(s.as_bytes());
                }
                Cell::Bytes(s) => {
                    b.push(VALUE);
                    b.extend_from_slice(&(s.len() as u32).to_le_bytes());
                    b.extend_from_slice(s);
                }
            }
        }
        self
    }

    #[inline]
    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.cell(Cell::I64(v))
    }

    #[inline]
    pub(crate) fn i32(&mut self, v: i32) -> &mut Self {
        self.cell(Cell::I32(v))
    }

    #[inline]
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.cell(Cell::Str(v))
    }

    #[inline]
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.cell(Cell::Bytes(v))
    }

    #[inline]
    pub(crate) fn opt_str(&mut self, v: Option<&str>) -> &mut Self {
        self.cell(v.map_or(Cell::Null, Cell::Str))
    }

    /// Ends the row. A row with too few or too many columns is dropped and recorded as an
    /// error (see [`Rows::check`]).
    #[inline]
    pub(crate) fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        if self.col != self.rows.types.len() && self.rows.error.is_none() {
            self.rows.error = Some(format!(
                "output row has {} columns, the table {}",
                self.col,
                self.rows.types.len()
            ));
        }
        if self.col != self.rows.types.len() || !self.ok {
            self.rows.buf.truncate(self.start);
            return;
        }
        self.rows.len += 1;
    }
}

impl Drop for RowWriter<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// An owned copy of a [`Cell`].
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedCell {
    Null,
    Bool(bool),
    I32(i32),
    I64(i64),
    F64(f64),
    Str(String),
    Bytes(Vec<u8>),
}

impl From<&Cell<'_>> for OwnedCell {
    fn from(c: &Cell<'_>) -> Self {
        match *c {
            Cell::Null => OwnedCell::Null,
            Cell::Bool(v) => OwnedCell::Bool(v),
            Cell::I32(v) => OwnedCell::I32(v),
            Cell::I64(v) => OwnedCell::I64(v),
            Cell::F64(v) => OwnedCell::F64(v),
            Cell::Str(s) => OwnedCell::Str(s.to_string()),
            Cell::Bytes(b) => OwnedCell::Bytes(b.to_vec()),
        }
    }
}

/// One cell of [`Rows`]' encoding: a null/value tag, then the value.
#[inline]
fn read_cell<'a>(r: &mut Reader<'a>, ty: ColumnType) -> Result<Cell<'a>, CodecError> {
    {
        match r.take(1)?[0] {
            NULL => return Ok(Cell::Null),
            VALUE => {}
            _ => return Err(CodecError("bad cell tag")),
        }
        Ok(match ty {
            ColumnType::Boolean => Cell::Bool(r.take(1)?[0] != 0),
            ColumnType::Integer => {
                let s = r.take(4)?;
                Cell::I32(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
            }
            ColumnType::BigInt => Cell::I64(r.u64()? as i64),
            ColumnType::Double => Cell::F64(f64::from_bits(r.u64()?)),
            ColumnType::Varchar | ColumnType::DoubleList => {
                let n = r.u32()? as usize;
                let s = r.take(n)?;
                Cell::Str(std::str::from_utf8(s).map_err(|_| CodecError("invalid text"))?)
            }
            ColumnType::Blob => {
                let n = r.u32()? as usize;
                Cell::Bytes(r.take(n)?)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_reused_cycle_after_cycle_gives_back_a_peak() {
        let mut r = Rows::new(vec![ColumnType::Varchar]);
        let long = "x".repeat(1000);
        for _ in 0..20_000 {
            r.push(&[Cell::Str(&long)]);
        }
        let peak = r.held_bytes();
        assert!(peak > 16 << 20);
        for _ in 0..SHRINK_EVERY * 2 {
            r.clear();
            r.push(&[Cell::Str("small")]);
        }
        assert!(r.held_bytes() <= 2 * KEEP_BYTES, "{}", r.held_bytes());
        // A buffer that needs its size every cycle keeps it.
        let mut steady = Rows::new(vec![ColumnType::Varchar]);
        for _ in 0..SHRINK_EVERY * 2 {
            steady.clear();
            for _ in 0..5_000 {
                steady.push(&[Cell::Str(&long)]);
            }
        }
        assert!(steady.held_bytes() >= 5_000 * 1000);
    }

    fn sample() -> Rows {
        let mut r = Rows::new(TableSchema::dead_letters().types());
        r.row()
            .str("t")
            .i32(3)
            .i64(-7)
            .i64(1)
            .bytes(&[0xff, 0])
            .str("bad €")
            .finish();
        r.row()
            .str("t")
            .i32(0)
            .i64(0)
            .i64(2)
            .cell(Cell::Null)
            .str("")
            .finish();
        r
    }

    #[test]
    fn rows_round_trip_through_the_encoding() {
        let r = sample();
        assert_eq!(r.len(), 2);
        assert!(r.check().is_ok());
        let mut buf = vec![9];
        r.encode(&mut buf);
        let mut at = 1;
        let back = Rows::decode(&buf, &mut at).unwrap();
        assert_eq!(at, buf.len());
        assert_eq!(back.to_vec(), r.to_vec());
        assert_eq!(r.to_vec()[0][4], OwnedCell::Bytes(vec![0xff, 0]));
        assert_eq!(r.to_vec()[1][4], OwnedCell::Null);
    }

    #[test]
    fn rows_read_a_chunk_at_a_time_are_the_rows_read_at_once() {
        let mut r = Rows::new(vec![ColumnType::BigInt, ColumnType::Varchar]);
        for i in 0..7 {
            r.row().i64(i).str(&format!("k{i}")).finish();
        }
        let mut at = RowCursor::default();
        let mut seen = Vec::new();
        let mut chunks = Vec::new();
        loop {
            let n = r
                .each_from(&mut at, 3, |i, cells| {
                    seen.push((i, cells.iter().map(OwnedCell::from).collect::<Vec<_>>()));
                    Ok::<(), ()>(())
                })
                .unwrap()
                .unwrap();
            if n == 0 {
                break;
            }
            chunks.push(n);
        }
        assert_eq!(chunks, [3, 3, 1]);
        assert_eq!(
            seen.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2, 0]
        );
        let rows: Vec<_> = seen.into_iter().map(|(_, c)| c).collect();
        assert_eq!(rows, r.to_vec());
    }

    #[test]
    fn damaged_encodings_are_errors() {
        let mut buf = Vec::new();
        sample().encode(&mut buf);
        for cut in 0..buf.len() {
            assert!(Rows::decode(&buf[..cut], &mut 0).is_err(), "cut at {cut}");
        }
        let mut bad = buf.clone();
        bad[4] = 99;
        assert!(Rows::decode(&bad, &mut 0).is_err());
    }

    #[test]
    fn a_wrong_type_or_arity_is_reported_not_dropped() {
        let mut r = Rows::new(vec![ColumnType::BigInt, ColumnType::Varchar]);
        r.row().i64(1).str("a").finish();
        r.row().str("x").str("a").finish();
        assert!(r.check().unwrap_err().contains("column 0"));
        let mut r = Rows::new(vec![ColumnType::BigInt, ColumnType::Varchar]);
        r.row().i64(1).finish();
        assert!(r.check().is_err());
        assert_eq!(r.len(), 0);
    }
}
