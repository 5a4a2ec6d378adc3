//! A background job's call: the arguments it was started with, kept so that the job can be
//! listed (its secrets hidden) and started again after a restart exactly as it was called, with
//! the extension's settings as they stood when it started. DuckDB's own settings (the sandbox's
//! among them) are read again at every start: a restart never widens what the database allows.

use serde_json::{json, Map, Value};
use streaming_etl_core::{EtlError, Result};

use crate::host::args::{Arg, Args};
use crate::params::{RUN_PARAMS, SETTINGS};

/// Shown in place of a secret.
pub const HIDDEN: &str = "<hidden>";

/// The arguments of a call of `streaming_etl_run` or `streaming_etl_sql`.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub function: String,
    positional: Vec<Arg>,
    named: Vec<(String, Arg)>,
    settings: Vec<(String, Arg)>,
}

impl Call {
    /// The arguments of `function` as the call gave them (named ones by the run's parameter
    /// table; NULL counts as not given), and the extension's settings in force.
    pub fn capture(function: &str, args: &dyn Args, positional: usize) -> Call {
        Call {
            function: function.to_string(),
            positional: (0..positional).filter_map(|i| args.positional(i)).collect(),
            named: RUN_PARAMS
                .iter()
                .filter_map(|p| match args.named(p.name) {
                    None | Some(Arg::Null) => None,
                    Some(a) => Some((p.name.to_string(), a)),
                })
                .collect(),
            settings: SETTINGS
                .iter()
                .filter_map(|s| args.setting(s.name).map(|a| (s.name.to_string(), a)))
                .collect(),
        }
    }

    /// The call as SQL, with secrets (passwords, keys, tokens, credentials in URLs) hidden.
    pub fn shown(&self) -> String {
        let mut parts: Vec<String> = self.positional.iter().map(literal).collect();
        for (name, arg) in &self.named {
            let arg = hide_secrets(name, arg);
            parts.push(format!("{name} := {}", literal(&arg)));
        }
        format!("{}({})", self.function, parts.join(", "))
    }

    /// The call as text to store (JSON).
    pub fn encode(&self) -> String {
        let pairs = |v: &[(String, Arg)]| {
            Value::Array(v.iter().map(|(k, a)| json!([k, to_json(a)])).collect())
        };
        json!({
            "function": self.function,
            "positional": self.positional.iter().map(to_json).collect::<Vec<_>>(),
            "named": pairs(&self.named),
            "settings": pairs(&self.settings),
        })
        .to_string()
    }

    /// A call stored by [`Call::encode`].
    pub fn decode(text: &str) -> Result<Call> {
        let bad =
            || EtlError::Internal(format!("a recorded background job cannot be read: {text}"));
        let v: Value = serde_json::from_str(text).map_err(|_| bad())?;
        let pairs = |v: &Value| -> Option<Vec<(String, Arg)>> {
            v.as_array()?
                .iter()
                .map(|p| Some((p.get(0)?.as_str()?.to_string(), from_json(p.get(1)?)?)))
                .collect()
        };
        let call = || -> Option<Call> {
            Some(Call {
                function: v.get("function")?.as_str()?.to_string(),
                positional: v
                    .get("positional")?
                    .as_array()?
                    .iter()
                    .map(from_json)
                    .collect::<Option<_>>()?,
                named: pairs(v.get("named")?)?,
                settings: pairs(v.get("settings")?)?,
            })
        };
        call().ok_or_else(bad)
    }

    /// The call's arguments, for binding it again; DuckDB's own settings are read from `live`
    /// (the statement that starts it again).
    pub fn replayed<'a>(&'a self, live: &'a dyn Args) -> Replayed<'a> {
        Replayed { call: self, live }
    }
}

/// A recorded call bound again (see [`Call::replayed`]).
pub struct Replayed<'a> {
    call: &'a Call,
    live: &'a dyn Args,
}

impl Args for Replayed<'_> {
    fn positional(&self, idx: usize) -> Option<Arg> {
        self.call.positional.get(idx).cloned()
    }

    fn named(&self, name: &str) -> Option<Arg> {
        self.call
            .named
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
    }

    fn setting(&self, name: &str) -> Option<Arg> {
        if SETTINGS.iter().any(|s| s.name == name) {
            return self
                .call
                .settings
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, a)| a.clone());
        }
        self.live.setting(name)
    }
}

/// Whether a librdkafka property or registry option holds a secret.
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "jaas",
        "token",
        "key.pem",
        "credentials",
        "user.info",
        "api.key",
    ]
    .iter()
    .any(|s| k.contains(s))
}

/// `arg` of the named parameter `name`, with secrets hidden: a map's secret values, and a URL's
/// user and password.
fn hide_secrets(name: &str, arg: &Arg) -> Arg {
    match arg {
        Arg::Map(entries) => Arg::Map(
            entries
                .iter()
                .map(|(k, v)| match k {
                    Arg::Text(key) if is_secret_key(key) => (k.clone(), Arg::Text(HIDDEN.into())),
                    _ => (k.clone(), v.clone()),
                })
                .collect(),
        ),
        Arg::Text(t) if name == "schema_registry" || name == "brokers" => {
            Arg::Text(hide_url_user(t))
        }
        other => other.clone(),
    }
}

/// `scheme://user:password@host/...` without its user information.
fn hide_url_user(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{HIDDEN}@{}", &rest[at + 1..]),
        None => text.to_string(),
    }
}

/// A value as a SQL literal.
fn literal(a: &Arg) -> String {
    match a {
        Arg::Null => "NULL".into(),
        Arg::Bool(b) => b.to_string(),
        Arg::Int(i) => i.to_string(),
        Arg::Text(s) => format!("'{}'", s.replace('\'', "''")),
        Arg::List(items) => format!(
            "[{}]",
            items.iter().map(literal).collect::<Vec<_>>().join(", ")
        ),
        Arg::Map(entries) => format!(
            "MAP {{{}}}",
            entries
                .iter()
                .map(|(k, v)| format!("{}: {}", literal(k), literal(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn to_json(a: &Arg) -> Value {
    match a {
        Arg::Null => Value::Null,
        Arg::Bool(b) => json!(b),
        Arg::Int(i) => json!(i),
        Arg::Text(s) => json!(s),
        Arg::List(items) => Value::Array(items.iter().map(to_json).collect()),
        Arg::Map(entries) => {
            let mut m = Map::new();
            m.insert(
                "map".into(),
                Value::Array(
                    entries
                        .iter()
                        .map(|(k, v)| json!([to_json(k), to_json(v)]))
                        .collect(),
                ),
            );
            Value::Object(m)
        }
    }
}

fn from_json(v: &Value) -> Option<Arg> {
    Some(match v {
        Value::Null => Arg::Null,
        Value::Bool(b) => Arg::Bool(*b),
        Value::Number(n) => Arg::Int(n.as_i64()?),
        Value::String(s) => Arg::Text(s.clone()),
        Value::Array(items) => Arg::List(items.iter().map(from_json).collect::<Option<_>>()?),
        Value::Object(m) => Arg::Map(
            m.get("map")?
                .as_array()?
                .iter()
                .map(|p| Some((from_json(p.get(0)?)?, from_json(p.get(1)?)?)))
                .collect::<Option<_>>()?,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Given {
        positional: Vec<Arg>,
        named: Vec<(&'static str, Arg)>,
        settings: Vec<(&'static str, Arg)>,
    }

    impl Args for Given {
        fn positional(&self, idx: usize) -> Option<Arg> {
            self.positional.get(idx).cloned()
        }
        fn named(&self, name: &str) -> Option<Arg> {
            self.named
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, a)| a.clone())
        }
        fn setting(&self, name: &str) -> Option<Arg> {
            self.settings
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, a)| a.clone())
        }
    }

    fn t(s: &str) -> Arg {
        Arg::Text(s.into())
    }

    fn given() -> Given {
        Given {
            positional: vec![t("orders"), Arg::Int(1000), Arg::Int(200)],
            named: vec![
                ("follow", Arg::Bool(true)),
                ("group_by", Arg::List(vec![t("region"), t("it's")])),
                ("partitions", Arg::List(vec![Arg::Int(0), Arg::Int(2)])),
                ("max_messages", Arg::Null),
                (
                    "kafka",
                    Arg::Map(vec![
                        (t("security.protocol"), t("SASL_SSL")),
                        (t("sasl.password"), t("hunter2")),
                        (t("sasl.oauthbearer.client.secret"), t("s3")),
                    ]),
                ),
                ("schema_registry", t("https://bob:pw@registry:8081/x@y")),
                ("not_a_parameter", t("ignored")),
            ],
            settings: vec![
                ("streaming_etl_brokers", t("kafka:9092")),
                ("enable_external_access", Arg::Bool(true)),
            ],
        }
    }

    #[test]
    fn a_call_is_shown_as_sql_without_its_secrets() {
        let call = Call::capture("streaming_etl_run", &given(), 3);
        let shown = call.shown();
        assert_eq!(
            shown,
            "streaming_etl_run('orders', 1000, 200, group_by := ['region', 'it''s'], follow := true, \
             partitions := [0, 2], kafka := MAP {'security.protocol': 'SASL_SSL', 'sasl.password': '<hidden>', \
             'sasl.oauthbearer.client.secret': '<hidden>'}, schema_registry := 'https://<hidden>@registry:8081/x@y')"
        );
        assert!(!shown.contains("hunter2") && !shown.contains("bob"));
    }

    #[test]
    fn a_recorded_call_replays_its_arguments_and_settings_and_reads_duckdbs_anew() {
        let call = Call::capture("streaming_etl_run", &given(), 3);
        let back = Call::decode(&call.encode()).unwrap();
        assert_eq!(back, call);
        let live = Given {
            positional: vec![],
            named: vec![],
            settings: vec![
                ("streaming_etl_brokers", t("elsewhere:9092")),
                ("enable_external_access", Arg::Bool(false)),
            ],
        };
        let r = back.replayed(&live);
        assert_eq!(r.positional(1), Some(Arg::Int(1000)));
        assert_eq!(r.positional(3), None);
        assert_eq!(r.named("follow"), Some(Arg::Bool(true)));
        assert_eq!(r.named("max_messages"), None);
        assert_eq!(r.named("not_a_parameter"), None);
        // The secrets are kept for the restart.
        assert!(matches!(r.named("kafka"), Some(Arg::Map(m)) if m[1].1 == t("hunter2")));
        // The extension's setting as it was; DuckDB's sandbox as it is now.
        assert_eq!(r.setting("streaming_etl_brokers"), Some(t("kafka:9092")));
        assert_eq!(r.setting("enable_external_access"), Some(Arg::Bool(false)));
        assert_eq!(r.setting("streaming_etl_checkpoint"), None);
    }

    #[test]
    fn an_unreadable_record_is_an_error_not_a_panic() {
        for text in [
            "",
            "{}",
            "[1]",
            r#"{"function":"f","positional":[1.5],"named":[],"settings":[]}"#,
        ] {
            assert!(Call::decode(text).is_err(), "{text}");
        }
    }
}
