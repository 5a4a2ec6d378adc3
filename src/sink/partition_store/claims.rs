//! Claims of a `subscribe` run's partitions: the owners of partitions as their state rows
//! say, and a claim that replaces the partitions' state rows under the next generation (see
//! [`super`] on fencing).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use duckdb::Connection;
use streaming_etl_core::{EtlError, Result};
use streaming_etl_runtime::group::{parse_settings, Claim, PartitionSnapshot};

use super::{duck, now_ms, LakeStore, Owner};

/// A state row as a claim reads it.
struct StoredRow {
    partition: i32,
    generation: i64,
    owner: String,
    seq: i64,
    next_offset: Option<i64>,
    max_event_time_ms: Option<i64>,
    last_delivery_ms: Option<i64>,
    watermark_ms: Option<i64>,
    open_windows: Option<Vec<u8>>,
    settings: Option<String>,
}

impl LakeStore {
    /// The current owner of each of `partitions` (the newest of its state rows), read in one
    /// query.
    pub(super) fn owners(
        &self,
        conn: &Connection,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, Owner>> {
        let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT \"partition\", generation, owner, seq FROM {} WHERE job = ? AND \"partition\" IN ({})",
                self.state,
                list.join(", ")
            ))
            .map_err(duck(&self.state))?;
        let rows = stmt
            .query_map(duckdb::params![self.job], |r| {
                Ok((
                    r.get::<_, i32>(0)?,
                    Owner {
                        generation: r.get(1)?,
                        owner: r.get(2)?,
                        seq: r.get(3)?,
                    },
                ))
            })
            .map_err(duck(&self.state))?
            .collect::<duckdb::Result<Vec<_>>>()
            .map_err(duck(&self.state))?;
        let mut newest: BTreeMap<i32, Owner> = BTreeMap::new();
        for (p, o) in rows {
            let newer = newest
                .get(&p)
                .is_none_or(|n| (o.generation, &o.owner) > (n.generation, &n.owner));
            if newer {
                newest.insert(p, o);
            }
        }
        Ok(newest)
    }

    /// Claims `partitions` in one transaction: their newest state rows read in one query, the
    /// anchor row replaced once, their rows replaced under the next generations.
    pub(super) fn try_claim(
        &self,
        conn: &Connection,
        partitions: &[i32],
        owner: &str,
    ) -> Result<Vec<Claim>> {
        let st = &self.state;
        let list: Vec<String> = partitions.iter().map(i32::to_string).collect();
        let list = list.join(", ");
        conn.execute_batch("BEGIN TRANSACTION").map_err(duck(st))?;
        let rows = conn
            .prepare(&format!(
                "SELECT \"partition\", generation, owner, seq, next_offset, max_event_time_ms, last_delivery_ms, watermark_ms, open_windows, settings FROM {st} WHERE job = ? AND \"partition\" IN ({list})"
            ))
            .map_err(duck(st))?
            .query_map(duckdb::params![self.job], |r| {
                Ok(StoredRow {
                    partition: r.get(0)?,
                    generation: r.get(1)?,
                    owner: r.get(2)?,
                    seq: r.get(3)?,
                    next_offset: r.get(4)?,
                    max_event_time_ms: r.get(5)?,
                    last_delivery_ms: r.get(6)?,
                    watermark_ms: r.get(7)?,
                    open_windows: r.get(8)?,
                    settings: r.get(9)?,
                })
            })
            .map_err(duck(st))?
            .collect::<duckdb::Result<Vec<_>>>()
            .map_err(duck(st))?;
        // A partition's newest row: the highest generation, then the highest owner (two rows
        // of one partition exist only between a claim and its retry).
        let mut newest: BTreeMap<i32, StoredRow> = BTreeMap::new();
        for row in rows {
            if newest
                .get(&row.partition)
                .is_none_or(|n| (row.generation, &row.owner) > (n.generation, &n.owner))
            {
                newest.insert(row.partition, row);
            }
        }
        let mut claims = Vec::with_capacity(partitions.len());
        for &partition in partitions {
            let (generation, seq, stored) = match newest.remove(&partition) {
                Some(row) => {
                    if let Some(text) = row.settings.filter(|t| *t != self.settings_text) {
                        let stored = parse_settings(&text);
                        let (setting, was, now) = stored
                            .as_ref()
                            .and_then(|s| s.first_difference(&self.settings))
                            .unwrap_or_else(|| {
                                ("settings".into(), text.clone(), self.settings_text.clone())
                            });
                        return Err(EtlError::SettingsChanged {
                            job: self.job.clone(),
                            setting,
                            stored: was,
                            requested: now,
                        });
                    }
                    let snapshot = row.next_offset.map(|next_offset| PartitionSnapshot {
                        seq: row.seq,
                        next_offset,
                        max_event_time_ms: row.max_event_time_ms,
                        last_delivery_ms: row.last_delivery_ms.unwrap_or_else(now_ms),
                        watermark_ms: row.watermark_ms.unwrap_or(streaming_etl_core::NO_WATERMARK),
                        open_windows: row.open_windows,
                    });
                    (row.generation, row.seq, snapshot)
                }
                None => (0, 0, None),
            };
            claims.push((
                Claim {
                    partition,
                    generation: generation + 1,
                    stored,
                },
                seq,
            ));
        }
        // Claims of one lake serialize on the anchor row (see the module's comment).
        conn.execute_batch(&format!(
            "DELETE FROM {st} WHERE job = '' AND \"partition\" = -1; INSERT INTO {st} (job, \"partition\", generation, owner, seq) VALUES ('', -1, 0, '', 0)"
        ))
        .map_err(duck(st))?;
        conn.execute(
            &format!("DELETE FROM {st} WHERE job = ? AND \"partition\" IN ({list})"),
            duckdb::params![self.job],
        )
        .map_err(duck(st))?;
        let mut insert = conn
            .prepare(&format!(
                "INSERT INTO {st} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ))
            .map_err(duck(st))?;
        let now = now_ms();
        for (claim, seq) in &claims {
            let s = claim.stored.as_ref();
            insert
                .execute(duckdb::params![
                    self.job,
                    claim.partition,
                    claim.generation,
                    owner,
                    seq,
                    s.map(|s| s.next_offset),
                    s.and_then(|s| s.max_event_time_ms),
                    s.map(|s| s.last_delivery_ms),
                    s.map(|s| s.watermark_ms),
                    s.and_then(|s| s.open_windows.clone()),
                    self.settings_text,
                    now,
                ])
                .map_err(duck(st))?;
        }
        drop(insert);
        conn.execute_batch("COMMIT").map_err(duck(st))?;
        Ok(claims.into_iter().map(|(c, _)| c).collect())
    }
}
