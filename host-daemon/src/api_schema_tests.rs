//! The OpenAPI document's schemas are exactly the shared types' (a part of
//! `api_tests.rs`).

use super::*;
/// Name and schema of a shared type.
fn schema<T: ToSchema>() -> (String, Value) {
    (
        T::name().into_owned(),
        serde_json::to_value(T::schema()).unwrap(),
    )
}

/// Every type the document may hold a schema of.
fn shared_schemas() -> BTreeMap<String, Value> {
    [
        schema::<t::CreateSandbox>(),
        schema::<t::Sandbox>(),
        schema::<t::SandboxState>(),
        schema::<t::Priority>(),
        schema::<t::SnapshotRequest>(),
        schema::<t::ForkRequest>(),
        schema::<t::Forked>(),
        schema::<t::ExecRequest>(),
        schema::<t::ExecResult>(),
        schema::<t::ExecEvent>(),
        schema::<t::Encoding>(),
        schema::<t::FileStat>(),
        schema::<t::FileType>(),
        schema::<t::DirEntry>(),
        schema::<t::Uploaded>(),
        schema::<t::CreateTemplate>(),
        schema::<t::Template>(),
        schema::<t::TemplateState>(),
        schema::<t::TemplateDisk>(),
        schema::<t::Pool>(),
        schema::<t::SetPool>(),
        schema::<t::Stats>(),
        schema::<t::Usage>(),
        schema::<t::Limits>(),
        schema::<t::HostStats>(),
        schema::<t::Event>(),
        schema::<t::Health>(),
        schema::<t::UpdateSandbox>(),
        schema::<t::RenameRequest>(),
        schema::<t::Command>(),
        schema::<t::CommandState>(),
        schema::<t::SignalCommand>(),
        schema::<t::ErrorBody>(),
        schema::<t::ErrorDetail>(),
        schema::<t::ErrorCode>(),
        schema::<t::FnCallRequest>(),
        schema::<t::FnCallResult>(),
        schema::<t::FnCallStatus>(),
        schema::<t::CompileResult>(),
        schema::<t::BatchRequest>(),
        schema::<t::BatchItem>(),
        schema::<t::Language>(),
        schema::<t::PullImage>(),
        schema::<t::Image>(),
        schema::<t::ImageList>(),
        schema::<t::images::ImageLayer>(),
        schema::<t::images::ImageConfig>(),
        schema::<t::NetworkSpec>(),
        schema::<t::InputRequest>(),
        schema::<t::InputEvent>(),
    ]
    .into_iter()
    .collect()
}

#[test]
fn every_schema_is_the_shared_type() {
    let doc = document_json();
    let comps = doc["components"]["schemas"].as_object().unwrap();
    let shared = shared_schemas();
    for (name, s) in comps {
        assert_eq!(
            Some(s),
            shared.get(name),
            "components.schemas.{name} is not the schema of shoal_api's type"
        );
    }
    // Every reference resolves.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r.clone());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(doc, &mut all);
    for r in all {
        let name = r.strip_prefix("#/components/schemas/").unwrap_or(&r);
        assert!(comps.contains_key(name), "{r} does not resolve");
    }
}
