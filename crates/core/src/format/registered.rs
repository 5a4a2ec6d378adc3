//! A schema as the schema registry serves it, and its kind: what the registry client (an
//! adapter) hands the [`SchemaCache`](super::SchemaCache) to compile.

/// The kind of a registered schema (the registry's `schemaType`; absent means Avro).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaType {
    Avro,
    Protobuf,
    Json,
}

impl SchemaType {
    pub fn name(self) -> &'static str {
        match self {
            SchemaType::Avro => "Avro",
            SchemaType::Protobuf => "Protobuf",
            SchemaType::Json => "JSON Schema",
        }
    }
}

/// A schema as the registry serves it: its text, and the schemas its references name (by the
/// reference's name: a `.proto` import path, or an Avro type's full name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredSchema {
    pub kind: SchemaType,
    pub text: String,
    pub references: Vec<(String, String)>,
}
