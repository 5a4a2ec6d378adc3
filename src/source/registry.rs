//! The schema registry client: Confluent's REST API (`GET /schemas/ids/{id}`, references by
//! `GET /subjects/{subject}/versions/{version}`), as Confluent Schema Registry, Apicurio's
//! `ccompat` API and Redpanda serve it. A source asks for each schema id once, the first time
//! a record names it, before the record goes further; what it gets goes into the run's
//! [`SchemaCache`].

use std::sync::Arc;
use std::time::Duration;

use streaming_etl_core::{RegisteredSchema, SchemaCache, SchemaType};

use crate::params::RegistryParams;

/// A reference chain deeper than this is refused (a registry's references loop).
const MAX_REFERENCE_DEPTH: usize = 16;

pub struct Registry {
    url: String,
    auth: Option<String>,
    agent: ureq::Agent,
    cache: Arc<SchemaCache>,
}

impl Registry {
    pub fn new(params: &RegistryParams, cache: &Arc<SchemaCache>) -> Result<Registry, String> {
        // Always the system OpenSSL (native-tls) with the system's roots unless
        // ssl.ca.location names others: ureq's own default provider is not built in.
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(params.timeout_ms)))
            .http_status_as_error(false)
            .tls_config(tls(params)?);
        Ok(Registry {
            url: params.url.trim_end_matches('/').to_string(),
            auth: params.user_info.as_deref().map(basic_auth),
            agent: config.build().into(),
            cache: cache.clone(),
        })
    }

    /// Makes sure the cache knows `id` (a schema, or that the registry has none with it).
    pub fn resolve(&self, id: u32) -> Result<(), String> {
        if self.cache.contains(id) {
            return Ok(());
        }
        let schema = self.fetch(&format!("/schemas/ids/{id}?format=serialized"), 0)?;
        self.cache.add(id, schema.as_ref()).map_err(|e| {
            format!(
                "schema id {id} from schema registry '{}' cannot be read: {e}",
                self.url
            )
        })
    }

    /// A schema and its references; None: the registry answered 404.
    fn fetch(&self, path: &str, depth: usize) -> Result<Option<RegisteredSchema>, String> {
        if depth > MAX_REFERENCE_DEPTH {
            return Err(format!(
                "schema references nest deeper than {MAX_REFERENCE_DEPTH} levels"
            ));
        }
        let url = format!("{}{path}", self.url);
        let mut req = self.agent.get(&url);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let failed = |e: String| format!("schema registry '{}': GET {path} failed: {e}", self.url);
        let mut resp = req.call().map_err(|e| failed(e.to_string()))?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| failed(e.to_string()))?;
        if status == 404 {
            return Ok(None);
        }
        if status != 200 {
            return Err(failed(format!("HTTP {status}: {}", body.trim())));
        }
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| failed(format!("not JSON: {e}")))?;
        let text = v
            .get("schema")
            .and_then(|s| s.as_str())
            .ok_or_else(|| failed("the answer has no 'schema'".into()))?;
        let kind = match v.get("schemaType").and_then(|t| t.as_str()) {
            None | Some("AVRO") => SchemaType::Avro,
            Some("PROTOBUF") => SchemaType::Protobuf,
            Some(_) => SchemaType::Json,
        };
        let mut references = Vec::new();
        for r in v
            .get("references")
            .and_then(|r| r.as_array())
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let field = |k: &str| r.get(k).cloned().unwrap_or(serde_json::Value::Null);
            let (Some(name), Some(subject)) = (
                field("name").as_str().map(str::to_string),
                field("subject").as_str().map(str::to_string),
            ) else {
                return Err(failed("a reference without name or subject".into()));
            };
            let version = match field("version") {
                serde_json::Value::Number(n) => n.to_string(),
                serde_json::Value::String(s) => s,
                _ => "latest".into(),
            };
            let path = format!(
                "/subjects/{}/versions/{version}?format=serialized",
                encode_segment(&subject)
            );
            let Some(dep) = self.fetch(&path, depth + 1)? else {
                return Err(failed(format!(
                    "its reference '{name}' (subject '{subject}' version {version}) is not in the registry"
                )));
            };
            references.extend(dep.references);
            references.push((name, dep.text));
        }
        Ok(Some(RegisteredSchema {
            kind,
            text: text.to_string(),
            references,
        }))
    }
}

fn basic_auth(user_info: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(user_info)
    )
}

/// A subject as one URL path segment.
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn tls(params: &RegistryParams) -> Result<ureq::tls::TlsConfig, String> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};
    let read = |what: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("cannot read {what} '{path}': {e}"))
    };
    let mut b = TlsConfig::builder()
        .provider(TlsProvider::NativeTls)
        .root_certs(RootCerts::PlatformVerifier);
    if let Some(ca) = &params.ca_location {
        let pem = read("ssl.ca.location", ca)?;
        let certs = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect::<Vec<Certificate<'static>>>();
        if certs.is_empty() {
            return Err(format!("ssl.ca.location '{ca}' holds no PEM certificate"));
        }
        b = b.root_certs(RootCerts::new_with_certs(&certs));
    }
    if let Some(cert) = &params.certificate_location {
        let key_path = params
            .key_location
            .as_deref()
            .ok_or("ssl.certificate.location needs ssl.key.location")?;
        let pem = read("ssl.certificate.location", cert)?;
        let chain = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect::<Vec<_>>();
        let key = PrivateKey::from_pem(&read("ssl.key.location", key_path)?)
            .map_err(|e| format!("ssl.key.location '{key_path}': {e}"))?;
        b = b.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
    }
    Ok(b.build())
}
