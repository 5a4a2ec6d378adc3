//! Decoding alone, on a bench file: the job's JSON decoder against the field's maintained SIMD
//! parsers for the fields a job reads (`key`, `event_time_ms`, `payload.value`). Each reader
//! yields the key as text, the time as an integer and the value as a double; all must agree on a
//! checksum of what they read. Prints one JSON line per reader: records/s and GB/s (best of
//! `rounds`, one thread).
//!
//! usage: json_libs_bench <file.ndjson> [records] [rounds]

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use serde::Deserialize;
use sonic_rs::{JsonValueTrait, PointerTree};
use streaming_etl_core::{parse_f64, parse_i64, Decoder, FieldPath};

#[derive(Deserialize)]
struct Payload {
    value: f64,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    event_time_ms: i64,
    payload: Payload,
}

/// serde_json driven by the job's paths at run time (a `DeserializeSeed`): the wanted members'
/// raw text, every other value skipped (`IgnoredAny`), as a decoder built on serde_json would.
mod runtime_paths {
    use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
    use serde_json::value::RawValue;
    use std::fmt;

    /// Paths as member names; `out[i]` gets path i's raw text.
    pub struct Seed<'p, 'o, 'de> {
        pub paths: &'p [Vec<&'p str>],
        pub depth: usize,
        /// Which paths are still on the way down (a bit each).
        pub live: u64,
        pub out: &'o mut [Option<&'de str>],
    }

    impl<'de> DeserializeSeed<'de> for Seed<'_, '_, 'de> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Seed<'_, '_, 'de> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                let mut leaf = None;
                let mut deeper = 0u64;
                for (i, p) in self.paths.iter().enumerate() {
                    if self.live & (1 << i) != 0 && p.get(self.depth) == Some(&name.as_ref()) {
                        if p.len() == self.depth + 1 {
                            leaf = Some(i);
                        } else {
                            deeper |= 1 << i;
                        }
                    }
                }
                if let Some(i) = leaf {
                    let raw: &'de RawValue = map.next_value()?;
                    self.out[i] = Some(raw.get());
                } else if deeper != 0 {
                    map.next_value_seed(Seed {
                        paths: self.paths,
                        depth: self.depth + 1,
                        live: deeper,
                        out: &mut *self.out,
                    })?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }
}

/// What a reader read from one message (the key's length, the time, the value); `None` when it
/// failed.
type Read = Option<(usize, i64, f64)>;

type Reader<'a> = Box<dyn FnMut(&[u8]) -> (u64, bool) + 'a>;

/// One pass of `read` over every line: records/s, checksum, failures.
fn pass(lines: &[&[u8]], read: &mut Reader<'_>) -> (f64, u64, usize) {
    let (mut sum, mut failed) = (0u64, 0usize);
    let t = Instant::now();
    for l in lines {
        let (h, ok) = read(l);
        sum = sum.wrapping_mul(31).wrapping_add(h);
        failed += usize::from(!ok);
    }
    (
        lines.len() as f64 / t.elapsed().as_secs_f64(),
        black_box(sum),
        failed,
    )
}

/// A message's part of the checksum, and whether it was read.
fn hashed(r: Read) -> (u64, bool) {
    match r {
        Some((k, t, v)) => (
            (k as u64).wrapping_add(t as u64).wrapping_add(v.to_bits()),
            true,
        ),
        None => (0, false),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: json_libs_bench <file.ndjson> [records] [rounds]");
        std::process::exit(2);
    };
    let n: usize = args
        .get(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3);
    let Ok(data) = std::fs::read(path) else {
        eprintln!("cannot read {path}");
        std::process::exit(2);
    };
    let lines: Vec<&[u8]> = data
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .take(n)
        .collect();
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    let mut readers: Vec<(&str, Reader<'_>)> = Vec::new();

    let paths: Vec<FieldPath> = ["key", "event_time_ms", "payload.value"]
        .iter()
        .filter_map(|p| FieldPath::parse(p))
        .collect();
    let mut ours = Decoder::new(paths);
    readers.push((
        "streaming_etl decoder",
        Box::new(move |l| {
            hashed(ours.decode(l).ok().and_then(|m| {
                Some((
                    m.get(0).text()?.len(),
                    parse_i64(m.get(1).bytes)?,
                    parse_f64(m.get(2).bytes)?,
                ))
            }))
        }),
    ));

    let mut tree = PointerTree::new();
    tree.add_path(["key"]);
    tree.add_path(["event_time_ms"]);
    tree.add_path(["payload", "value"]);
    readers.push((
        "sonic-rs get_many (lazy values)",
        Box::new(move |l| {
            let Ok(v) = sonic_rs::get_many(l, &tree) else {
                return (0, false);
            };
            let read = (|| {
                let (k, t, x) = (
                    v.first()?.as_ref()?,
                    v.get(1)?.as_ref()?,
                    v.get(2)?.as_ref()?,
                );
                Some((k.as_str()?.len(), t.as_i64()?, x.as_f64()?))
            })();
            hashed(read)
        }),
    ));

    readers.push((
        "sonic-rs object iterator (raw numbers)",
        Box::new(move |l| {
            let (mut k, mut t, mut x) = (None, None, None);
            for item in sonic_rs::to_object_iter(l) {
                let Ok((name, v)) = item else {
                    return (0, false);
                };
                match name.as_ref() {
                    "key" => k = v.as_str().map(|s| s.len()),
                    "event_time_ms" => t = v.as_i64(),
                    "payload" => {
                        for inner in sonic_rs::to_object_iter(v.as_raw_str()) {
                            let Ok((name, v)) = inner else {
                                return (0, false);
                            };
                            if name == "value" {
                                x = v.as_f64();
                            }
                        }
                    }
                    _ => {}
                }
            }
            hashed(k.zip(t).zip(x).map(|((k, t), x)| (k, t, x)))
        }),
    ));

    readers.push((
        "sonic-rs typed (serde)",
        Box::new(move |l| match sonic_rs::from_slice::<Event<'_>>(l) {
            Ok(e) => hashed(Some((e.key.len(), e.event_time_ms, e.payload.value))),
            Err(_) => hashed(None),
        }),
    ));

    let (mut buf, mut buffers) = (Vec::new(), simd_json::Buffers::default());
    readers.push((
        "simd-json tape",
        Box::new(move |l| {
            buf.clear();
            buf.extend_from_slice(l);
            let Ok(tape) = simd_json::to_tape_with_buffers(&mut buf, &mut buffers) else {
                return (0, false);
            };
            let v = tape.as_value();
            use simd_json::prelude::*;
            let read = (|| {
                let key = v.get("key")?;
                let k = key.as_str()?.len();
                let t = v.get("event_time_ms")?.as_i64()?;
                let x = v.get("payload")?.get("value")?.as_f64()?;
                Some((k, t, x))
            })();
            hashed(read)
        }),
    ));

    let (mut buf, mut buffers) = (Vec::new(), simd_json::Buffers::default());
    readers.push((
        "simd-json typed (serde)",
        Box::new(move |l| {
            buf.clear();
            buf.extend_from_slice(l);
            match simd_json::serde::from_slice_with_buffers::<Event<'_>>(&mut buf, &mut buffers) {
                Ok(e) => hashed(Some((e.key.len(), e.event_time_ms, e.payload.value))),
                Err(_) => hashed(None),
            }
        }),
    ));

    readers.push((
        "serde_json typed",
        Box::new(move |l| match serde_json::from_slice::<Event<'_>>(l) {
            Ok(e) => hashed(Some((e.key.len(), e.event_time_ms, e.payload.value))),
            Err(_) => hashed(None),
        }),
    ));

    let names: Vec<Vec<&str>> = vec![vec!["key"], vec!["event_time_ms"], vec!["payload", "value"]];
    readers.push((
        "serde_json, paths at run time (seed)",
        Box::new(move |l| {
            let mut out: [Option<&str>; 3] = [None; 3];
            let mut de = serde_json::Deserializer::from_slice(l);
            let seed = runtime_paths::Seed {
                paths: &names,
                depth: 0,
                live: 0b111,
                out: &mut out,
            };
            if serde::de::DeserializeSeed::deserialize(seed, &mut de).is_err() || de.end().is_err()
            {
                return (0, false);
            }
            let read = (|| {
                let k = out[0]?.strip_prefix('"')?.strip_suffix('"')?;
                Some((
                    k.len(),
                    parse_i64(out[1]?.as_bytes())?,
                    parse_f64(out[2]?.as_bytes())?,
                ))
            })();
            hashed(read)
        }),
    ));

    // Rounds alternate the readers, so a busy moment of the machine falls on all of them.
    let mut results: Vec<(&str, f64, u64, usize)> =
        readers.iter().map(|(n, _)| (*n, 0.0, 0, 0)).collect();
    for _ in 0..rounds {
        for ((_, read), res) in readers.iter_mut().zip(results.iter_mut()) {
            let (rate, sum, failed) = pass(&lines, read);
            *res = (res.0, res.1.max(rate), sum, failed);
        }
    }
    let reference = results.first().map(|r| r.2).unwrap_or(0);
    for (name, rate, sum, failed) in &results {
        println!(
            "{{\"reader\": \"{name}\", \"records\": {}, \"bytes\": {bytes}, \"records_per_sec\": {rate:.0}, \"gb_per_sec\": {:.3}, \"same_fields\": {}, \"failed\": {failed}}}",
            lines.len(),
            rate * bytes as f64 / lines.len() as f64 / 1e9,
            *sum == reference && *failed == 0
        );
    }
}
