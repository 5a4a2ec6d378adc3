//! Parsing a chunk: each message's event time, key (and the key's hash) and aggregate inputs,
//! or why it is a dead letter. What a message parses to depends on nothing but the message, so
//! any thread may parse any chunk: the merge order, which events are late and where a run
//! resumes are exactly those of parsing one message at a time.

use crate::aggregate::Input;
use crate::chunk::{Chunk, OwnedInput, Rejected, PARSED};
use crate::config::{EngineConfig, MAX_AGGREGATES};
use crate::format::RecordDecoder;
use crate::record::{with_inputs, FieldPlan, Reject};
use crate::window::hash_key;

/// A decoder and the job's field plan (one per thread that parses).
pub(crate) struct ChunkParser {
    decoder: RecordDecoder,
    plan: FieldPlan,
    n: usize,
    key: Vec<u8>,
}

impl ChunkParser {
    pub fn new(cfg: &EngineConfig) -> ChunkParser {
        let plan = FieldPlan::new(cfg);
        ChunkParser {
            decoder: plan.decoder(),
            plan,
            n: cfg.aggregates.len().min(MAX_AGGREGATES),
            key: Vec::new(),
        }
    }

    /// Parses every message of `c` (a block of lines is split into its messages first).
    pub fn parse(&mut self, c: &mut Chunk) {
        c.split_lines();
        let n = self.n;
        c.n_inputs = n;
        for i in 0..c.len() {
            let (a, b) = c.spans[i];
            let msg_key = c.msg_key_spans[i].map(|(s, e)| &c.msg_keys[s..e]);
            let payload = &c.payload[a..b];
            let (time, rest) = match self.decoder.decode(payload, c.schemas[i]) {
                Err(e) => (Err(Reject::Syntax(e)), Ok(())),
                Ok(fields) => match self.plan.time(&fields, c.timestamps[i]) {
                    Err(r) => (Err(r), Ok(())),
                    Ok(t) => {
                        let rest = with_inputs(n, |inputs| {
                            let rest = self
                                .plan
                                .key(&fields, msg_key, &mut self.key)
                                .and_then(|()| self.plan.inputs(&fields, inputs));
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
                c.status.push(c.rejects.len() as u32);
                c.rejects.push(r);
            } else {
                c.status.push(PARSED);
            }
            c.key_ends.push(c.keys.len());
        }
    }
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
        ChunkParser::new(&cfg()).parse(&mut c);
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
        c.inputs(0, &mut inputs[..4]);
        assert!(matches!(inputs[1], Input::Num(v) if v == 2.5));
        assert_eq!(c.message(1).payload, b"not json");
        assert_eq!(c.message(4).key, Some(b"kafka-key".as_slice()));
    }
}
