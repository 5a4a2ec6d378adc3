//! The three output tables of a job (windows, late events, dead letters) as one shape:
//! [`ByTable`] holds one thing per table, so names, schemas, rows and per-table flags are the
//! same type, walked in one order.

/// One `T` per output table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ByTable<T> {
    pub windows: T,
    pub late: T,
    pub dead: T,
}

impl<T> ByTable<T> {
    /// Each table's value through `f`.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> ByTable<U> {
        ByTable {
            windows: f(self.windows),
            late: f(self.late),
            dead: f(self.dead),
        }
    }

    /// Each table's value paired with its value in `other`.
    pub fn zip<U>(self, other: ByTable<U>) -> ByTable<(T, U)> {
        ByTable {
            windows: (self.windows, other.windows),
            late: (self.late, other.late),
            dead: (self.dead, other.dead),
        }
    }

    pub fn as_ref(&self) -> ByTable<&T> {
        ByTable {
            windows: &self.windows,
            late: &self.late,
            dead: &self.dead,
        }
    }

    pub fn as_mut(&mut self) -> ByTable<&mut T> {
        ByTable {
            windows: &mut self.windows,
            late: &mut self.late,
            dead: &mut self.dead,
        }
    }

    /// The values in table order: windows, late events, dead letters.
    pub fn iter(&self) -> std::array::IntoIter<&T, 3> {
        [&self.windows, &self.late, &self.dead].into_iter()
    }
}

/// The values in table order, owned.
impl<T> IntoIterator for ByTable<T> {
    type Item = T;
    type IntoIter = std::array::IntoIter<T, 3>;
    fn into_iter(self) -> Self::IntoIter {
        [self.windows, self.late, self.dead].into_iter()
    }
}

impl<'a, T> IntoIterator for &'a ByTable<T> {
    type Item = &'a T;
    type IntoIter = std::array::IntoIter<&'a T, 3>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_zip_and_iter_keep_the_table_order() {
        let names = ByTable {
            windows: "w",
            late: "l",
            dead: "d",
        };
        let lens = names.map(str::len);
        assert_eq!(lens.iter().copied().sum::<usize>(), 3);
        let both = names.zip(ByTable {
            windows: 1,
            late: 2,
            dead: 3,
        });
        assert_eq!(
            both.into_iter().collect::<Vec<_>>(),
            [("w", 1), ("l", 2), ("d", 3)]
        );
        let mut flags = ByTable::<bool>::default();
        *flags.as_mut().late = true;
        assert_eq!(flags.iter().collect::<Vec<_>>(), [&false, &true, &false]);
    }
}
