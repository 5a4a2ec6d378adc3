//! The events a statement can read at all, known before it runs: NULL tests of its typed
//! columns that any event it reads passes (a window join's `p.id = a.seller` reads no event
//! whose `id` and `seller` are both NULL). The engine places and stages only the events that
//! pass, as if the statement's WHERE had dropped the others: they are in no window and not late,
//! and the watermarks still advance on them.
#![forbid(unsafe_code)]

use crate::columns::{OwnedTyped, TypedColumn};

/// A NULL test of a typed column, by its name: the column is (not) NULL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NullTest {
    pub column: String,
    pub not_null: bool,
}

/// Any of these groups, each all of its tests (empty: every event).
pub type NullTests = Vec<Vec<NullTest>>;

/// [`NullTests`] resolved to the places of the typed columns in a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prefilter {
    any: Vec<Vec<(usize, bool)>>,
}

impl Prefilter {
    /// None when every event passes (no tests, a group without tests, or a column the chunk
    /// does not have).
    pub(crate) fn new(tests: &NullTests, columns: &[TypedColumn]) -> Option<Prefilter> {
        if tests.is_empty() || tests.iter().any(Vec::is_empty) {
            return None;
        }
        let any = tests
            .iter()
            .map(|all| {
                all.iter()
                    .map(|t| {
                        let at = columns.iter().position(|c| c.name == t.column)?;
                        Some((at, t.not_null))
                    })
                    .collect::<Option<Vec<_>>>()
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Prefilter { any })
    }

    /// Whether an event with these typed values may be read (a value still waiting for
    /// DuckDB's conversion is taken as not NULL).
    #[inline]
    pub(crate) fn passes(&self, typed: &[OwnedTyped]) -> bool {
        self.any.iter().any(|all| {
            all.iter().all(|&(at, not_null)| {
                let null = matches!(typed.get(at), Some(OwnedTyped::Null) | None);
                null != not_null
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test(column: &str, not_null: bool) -> NullTest {
        NullTest {
            column: column.into(),
            not_null,
        }
    }

    #[test]
    fn any_group_of_null_tests_passes() {
        let columns = vec![
            TypedColumn::new(crate::FieldPath::parse("a").unwrap(), "pid", "BIGINT"),
            TypedColumn::new(crate::FieldPath::parse("b").unwrap(), "seller", "BIGINT"),
        ];
        let tests = vec![vec![test("pid", true)], vec![test("seller", true)]];
        let f = Prefilter::new(&tests, &columns).unwrap();
        assert!(f.passes(&[OwnedTyped::Int(1), OwnedTyped::Null]));
        assert!(f.passes(&[OwnedTyped::Null, OwnedTyped::Int(2)]));
        assert!(!f.passes(&[OwnedTyped::Null, OwnedTyped::Null]));
        assert!(f.passes(&[OwnedTyped::Pending, OwnedTyped::Null]));
        let both = vec![vec![test("pid", true), test("seller", false)]];
        let f = Prefilter::new(&both, &columns).unwrap();
        assert!(f.passes(&[OwnedTyped::Int(1), OwnedTyped::Null]));
        assert!(!f.passes(&[OwnedTyped::Int(1), OwnedTyped::Int(2)]));
        assert!(Prefilter::new(&vec![vec![test("pid", true)], vec![]], &columns).is_none());
        assert!(Prefilter::new(&vec![vec![test("nope", true)]], &columns).is_none());
        assert!(Prefilter::new(&Vec::new(), &columns).is_none());
    }
}
