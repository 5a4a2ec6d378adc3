//! Parsing a chunk: each message's event time, key (and the key's hash) and aggregate inputs,
//! or why it is a dead letter. What a message parses to depends on nothing but the message, so
//! any thread may parse any chunk: the merge order, which events are late and where a run
//! resumes are exactly those of parsing one message at a time.

use std::collections::HashMap;

use crate::aggregate::Input;
use crate::chunk::{Ask, Chunk, LayerKeys, OwnedInput, Rejected, PARSED};
use crate::columns::{from_answer, Converted, OwnedTyped, ResolverHandle};
use crate::config::{EngineConfig, MAX_AGGREGATES};
use crate::error::{EtlError, Result};
use crate::format::RecordDecoder;
use crate::record::{push_typed_key, with_inputs, FieldPlan, Reject};
use crate::time::{MAX_EVENT_TIME_MS, MIN_EVENT_TIME_MS};
use crate::window::hash_key;

/// DuckDB's answers for the values of a chunk it was asked about, by (message, typed column).
type Answers = HashMap<(u32, u32), std::result::Result<Converted<'static>, String>>;

/// A decoder and the job's field plan (one per thread that parses).
pub(crate) struct ChunkParser {
    decoder: RecordDecoder,
    plan: FieldPlan,
    n: usize,
    key: Vec<u8>,
    resolver: ResolverHandle,
    /// A job of several statements: each one's key columns (their places among the typed).
    layers: Vec<Vec<usize>>,
}

impl ChunkParser {
    pub fn new(cfg: &EngineConfig) -> ChunkParser {
        let plan = FieldPlan::new(cfg);
        ChunkParser {
            decoder: plan.decoder(),
            plan,
            n: cfg.aggregates.len().min(MAX_AGGREGATES),
            key: Vec::new(),
            resolver: cfg.resolver.clone(),
            layers: cfg
                .layers
                .iter()
                .map(|l| {
                    // By name: two typed columns may read one field.
                    l.keys
                        .iter()
                        .filter_map(|k| l.typed_key(k))
                        .filter_map(|t| cfg.columns.iter().position(|c| c.name == t.name))
                        .collect()
                })
                .collect(),
        }
    }

    /// Parses every message of `c` (a block of lines is split into its messages first). Values
    /// of typed columns only DuckDB can convert are asked in one call for the whole chunk,
    /// which is then parsed again with the answers. Fails only when DuckDB cannot be asked.
    pub fn parse(&mut self, c: &mut Chunk) -> Result<()> {
        c.split_lines();
        c.n_inputs = self.n;
        c.n_typed = self.plan.typed().len();
        self.parse_messages(c, &Answers::new());
        if !c.asks.is_empty() {
            let answers = self.ask(&c.asks)?;
            c.unparse();
            self.parse_messages(c, &answers);
        }
        self.layer_keys(c);
        Ok(())
    }

    /// Each statement's keys of a job of several statements, from the typed columns each
    /// message parsed to (their keys are typed columns).
    fn layer_keys(&self, c: &mut Chunk) {
        if self.layers.is_empty() {
            return;
        }
        c.layers.resize_with(self.layers.len(), LayerKeys::default);
        let n = c.n_typed;
        for (out, cols) in c.layers.iter_mut().zip(&self.layers) {
            for (i, &status) in c.status.iter().enumerate() {
                let from = out.keys.len();
                if status == PARSED {
                    let typed = c.typed.get(i * n..(i + 1) * n).unwrap_or(&[]);
                    for &j in cols {
                        let v = typed.get(j).copied().unwrap_or(OwnedTyped::Null);
                        push_typed_key(v, &c.texts, cols.len(), &mut out.keys);
                    }
                }
                out.ends.push(out.keys.len());
                out.hashes.push(hash_key(&out.keys[from..]));
            }
        }
    }

    /// DuckDB's answers for a chunk's values (one call per column type).
    fn ask(&self, asks: &[Ask]) -> Result<Answers> {
        let resolver = self.resolver.0.as_ref().ok_or_else(|| {
            EtlError::Internal("a typed value needs DuckDB, and no resolver was given".into())
        })?;
        let mut answers = Answers::new();
        let typed = self.plan.typed();
        for (j, col) in typed.iter().enumerate() {
            let these: Vec<&Ask> = asks.iter().filter(|a| a.column as usize == j).collect();
            if these.is_empty() {
                continue;
            }
            let json: Vec<&str> = these.iter().map(|a| a.json.as_str()).collect();
            let got = resolver.resolve(&col.sql_type, &json).map_err(|e| {
                EtlError::Internal(format!("converting values to {}: {e}", col.sql_type))
            })?;
            if got.len() != these.len() {
                return Err(EtlError::Internal(format!(
                    "converting values to {}: {} answers for {} values",
                    col.sql_type,
                    got.len(),
                    these.len()
                )));
            }
            for (a, answer) in these.into_iter().zip(got) {
                let v = match answer {
                    Ok(text) => from_answer(col.repr, &a.json, &text).ok_or_else(|| {
                        format!("DuckDB converted it to '{text}', which does not read back")
                    }),
                    Err(why) => Err(why),
                };
                answers.insert((a.at, a.column), v);
            }
        }
        Ok(answers)
    }

    /// One pass over the chunk's messages.
    fn parse_messages(&mut self, c: &mut Chunk, answers: &Answers) {
        let n = self.n;
        for i in 0..c.len() {
            let (a, b) = c.spans[i];
            let msg_key = c.msg_key_spans[i].map(|(s, e)| &c.msg_keys[s..e]);
            let payload = &c.payload[a..b];
            let typed_from = c.typed.len();
            let tombstone = self.decoder.is_tombstone(payload, msg_key);
            let decoded =
                self.decoder
                    .decode_message(payload, c.schemas[i], msg_key, c.timestamps[i]);
            let (time, rest) = match decoded {
                Err(e) => (Err(Reject::Syntax(e)), Ok(())),
                // (A tombstone has no time field of its own: its record's timestamp is its time.)
                Ok(fields) => match self.plan.time(&fields, c.timestamps[i]).or_else(|r| {
                    match c.timestamps[i] {
                        Some(t)
                            if tombstone
                                && (MIN_EVENT_TIME_MS..=MAX_EVENT_TIME_MS).contains(&t) =>
                        {
                            Ok(t)
                        }
                        _ => Err(r),
                    }
                }) {
                    Err(r) => (Err(r), Ok(())),
                    Ok(t) => {
                        let rest = with_inputs(n, |inputs| {
                            let out = TypedOut {
                                typed: &mut c.typed,
                                texts: &mut c.texts,
                                asks: &mut c.asks,
                                reasons: &mut c.reasons,
                                record: (payload, c.schemas[i]),
                                msg_key,
                            };
                            let typed = own_typed(&self.plan, &fields, i as u32, answers, out);
                            let rest = typed
                                .and_then(|()| {
                                    let cells = (&c.typed[typed_from..], &c.texts[..]);
                                    self.plan.key(&fields, msg_key, cells, &mut self.key)
                                })
                                .and_then(|_| self.plan.inputs(&fields, inputs))
                                .map(|()| {
                                    for &(k, j) in self.plan.typed_inputs() {
                                        if let (Some(slot), Some(v)) =
                                            (inputs.get_mut(k), c.typed.get(typed_from + j))
                                        {
                                            *slot = self.plan.typed_input(k, v);
                                        }
                                    }
                                });
                            if rest.is_ok() {
                                c.keys.extend_from_slice(&self.key);
                                for input in inputs.iter() {
                                    c.inputs.push(own(input, &mut c.texts));
                                }
                            }
                            rest
                        });
                        (Ok(t), rest)
                    }
                },
            };
            let rejected = match (time, rest) {
                (Ok(t), Ok(())) => {
                    c.time.push(t);
                    c.hashes.push(hash_key(&self.key));
                    None
                }
                (Err(r), _) => Some(Rejected::Time(r)),
                (Ok(t), Err(r)) => {
                    c.time.push(t);
                    Some(Rejected::Rest(r))
                }
            };
            if let Some(r) = rejected {
                c.time.resize(i + 1, 0);
                c.hashes.push(0);
                c.inputs.extend(std::iter::repeat_n(OwnedInput::Skip, n));
                c.typed.truncate(typed_from);
                c.typed
                    .extend(std::iter::repeat_n(OwnedTyped::Null, c.n_typed));
                c.status.push(c.rejects.len() as u32);
                c.rejects.push(r);
            } else {
                c.status.push(PARSED);
            }
            c.key_ends.push(c.keys.len());
        }
    }
}

/// Where a message's typed columns go in its chunk, and the message (its bytes and schema).
struct TypedOut<'c> {
    typed: &'c mut Vec<OwnedTyped>,
    texts: &'c mut Vec<u8>,
    asks: &'c mut Vec<Ask>,
    reasons: &'c mut Vec<String>,
    record: (&'c [u8], Option<u32>),
    /// The Kafka message key, if the message has one.
    msg_key: Option<&'c [u8]>,
}

/// Converts message `i`'s typed columns into the chunk (a value only DuckDB can convert is
/// pending, and asked about, unless `answers` has it).
fn own_typed(
    plan: &FieldPlan,
    fields: &crate::decode::Fields<'_>,
    i: u32,
    answers: &Answers,
    c: TypedOut<'_>,
) -> std::result::Result<(), Reject> {
    for j in 0..plan.typed().len() {
        let answered;
        let v = match answers.get(&(i, j as u32)) {
            Some(Ok(v)) => {
                answered = v.clone();
                answered
            }
            Some(Err(why)) => {
                let json = match plan.convert(fields, j)? {
                    Converted::Ask(json) if json.is_empty() => {
                        plan.binary_field_json(c.record.0, c.record.1, j)
                    }
                    Converted::Ask(json) => json,
                    _ => String::new(),
                };
                return Err(unconverted(c, plan.unconverted(j, &json, why)));
            }
            None => plan.convert(fields, j)?,
        };
        let cell = match v {
            Converted::Null => match c.msg_key.filter(|_| plan.typed()[j].message_key) {
                Some(k) => {
                    let start = c.texts.len() as u32;
                    // (An Avro or Protobuf key of the registry, magic byte 0 first: its JSON.)
                    let json = (k.first() == Some(&0))
                        .then(|| plan.message_key_json(k))
                        .flatten();
                    match (json, std::str::from_utf8(k)) {
                        (Some(json), _) => c.texts.extend_from_slice(json.as_bytes()),
                        (None, Ok(k)) => c.texts.extend_from_slice(k.as_bytes()),
                        (None, Err(_)) => return Err(Reject::KeyNotUtf8),
                    }
                    OwnedTyped::Text(start, c.texts.len() as u32)
                }
                None => OwnedTyped::Null,
            },
            Converted::Bool(b) => OwnedTyped::Bool(b),
            Converted::Int(x) => OwnedTyped::Int(x),
            Converted::Double(x) => OwnedTyped::Double(x),
            Converted::Text(t) => {
                let start = c.texts.len() as u32;
                c.texts.extend_from_slice(t.as_bytes());
                OwnedTyped::Text(start, c.texts.len() as u32)
            }
            Converted::Ask(json) => {
                // A record, map or array of an Avro or Protobuf message: its JSON rendering.
                let json = if json.is_empty() {
                    plan.binary_field_json(c.record.0, c.record.1, j)
                } else {
                    json
                };
                c.asks.push(Ask {
                    at: i,
                    column: j as u32,
                    json,
                });
                OwnedTyped::Pending
            }
            Converted::Refused(why) => {
                return Err(unconverted(c, plan.unconverted(j, "(binary data)", why)));
            }
        };
        c.typed.push(cell);
    }
    Ok(())
}

/// A dead letter whose reason is `why` (kept in the chunk).
fn unconverted(c: TypedOut<'_>, why: String) -> Reject {
    c.reasons.push(why);
    Reject::Unconverted((c.reasons.len() - 1) as u32)
}

/// An input kept in the chunk (its text in the chunk's arena).
#[inline]
fn own(input: &Input<'_>, texts: &mut Vec<u8>) -> OwnedInput {
    let mut keep = |s: &str| {
        let start = texts.len() as u32;
        texts.extend_from_slice(s.as_bytes());
        (start, texts.len() as u32)
    };
    match *input {
        Input::Skip => OwnedInput::Skip,
        Input::Num(v) => OwnedInput::Num(v),
        Input::Text(s) => {
            let (a, b) = keep(s);
            OwnedInput::Text(a, b)
        }
        Input::Hash(h) => OwnedInput::Hash(h),
        Input::Arg(by, s) => {
            let (a, b) = keep(s);
            OwnedInput::Arg(by, a, b)
        }
        Input::Present => OwnedInput::Present,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Message;

    fn cfg() -> EngineConfig {
        EngineConfig::for_tests(1000, 0)
    }

    #[test]
    fn a_chunk_parses_as_messages_one_at_a_time_do() {
        let mut c = Chunk::default();
        let lines = [
            r#"{"key":"a","event_time_ms":1500,"payload":{"value":2.5}}"#,
            "not json",
            r#"{"key":"b","event_time_ms":"x"}"#,
            r#"{"key":7,"event_time_ms":2500}"#,
            r#"{"event_time_ms":2500}"#,
        ];
        for (i, l) in lines.iter().enumerate() {
            c.push(&Message {
                offset: i as i64,
                next_offset: i as i64 + 1,
                payload: l.as_bytes(),
                key: (i == 4).then_some(b"kafka-key".as_slice()),
                timestamp: None,
                schema: None,
            });
        }
        ChunkParser::new(&cfg()).parse(&mut c).unwrap();
        assert_eq!(c.parsed(0), Ok(1500));
        assert!(matches!(
            c.parsed(1),
            Err(Rejected::Time(Reject::Syntax(_)))
        ));
        assert!(matches!(c.parsed(2), Err(Rejected::Time(_))));
        assert_eq!(c.parsed(3), Ok(2500));
        assert_eq!(c.key(4), b"kafka-key");
        assert_eq!(c.key(3), b"7");
        assert_eq!(c.hashes[3], hash_key(b"7"));
        let mut inputs = [Input::Skip; MAX_AGGREGATES];
        c.inputs_from(0, 0, &mut inputs[..4]);
        assert!(matches!(inputs[1], Input::Num(v) if v == 2.5));
        assert_eq!(c.message(1).payload, b"not json");
        assert_eq!(c.message(4).key, Some(b"kafka-key".as_slice()));
    }
}
