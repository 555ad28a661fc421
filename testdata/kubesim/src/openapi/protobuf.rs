//! `/openapi/v2` as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! the only form client-go asks for: the JSON document encoded as gnostic's
//! `openapi.v2.Document` message (`openapiv2/OpenAPIv2.proto`), the part kubectl reads:
//! `swagger`, `info`, `paths` (operations, parameters, responses) and `definitions` (schemas),
//! with `x-` keys as vendor extensions whose value is their JSON (YAML) text. kubectl older
//! than 1.27 validates from it; newer ones for a `kind: List`.

use serde_json::{Map, Value};

/// A protobuf message being written: fields appended in any order.
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut value: u64) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    fn tag(&mut self, field: u32, wire: u8) {
        self.varint((u64::from(field) << 3) | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, bytes: &[u8]) {
        self.tag(field, 2);
        self.varint(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn string(&mut self, field: u32, text: &str) {
        self.bytes(field, text.as_bytes());
    }

    fn message(&mut self, field: u32, message: Message) {
        self.bytes(field, &message.0);
    }

    fn boolean(&mut self, field: u32, value: bool) {
        self.tag(field, 0);
        self.varint(u64::from(value));
    }

    fn int64(&mut self, field: u32, value: i64) {
        self.tag(field, 0);
        self.varint(value as u64);
    }

    fn double(&mut self, field: u32, value: f64) {
        self.tag(field, 1);
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// A string field from `object[key]` when it is a string.
    fn string_of(&mut self, field: u32, object: &Map<String, Value>, key: &str) {
        if let Some(text) = object.get(key).and_then(Value::as_str) {
            self.string(field, text);
        }
    }

    fn bool_of(&mut self, field: u32, object: &Map<String, Value>, key: &str) {
        if let Some(value) = object.get(key).and_then(Value::as_bool) {
            self.boolean(field, value);
        }
    }

    fn int_of(&mut self, field: u32, object: &Map<String, Value>, key: &str) {
        if let Some(value) = object.get(key).and_then(Value::as_i64) {
            self.int64(field, value);
        }
    }

    fn double_of(&mut self, field: u32, object: &Map<String, Value>, key: &str) {
        if let Some(value) = object.get(key).and_then(Value::as_f64) {
            self.double(field, value);
        }
    }

    fn strings_of(&mut self, field: u32, object: &Map<String, Value>, key: &str) {
        for text in object
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            self.string(field, text);
        }
    }

    /// Every `x-` key of `object` as a repeated `NamedAny` field.
    fn extensions(&mut self, field: u32, object: &Map<String, Value>) {
        for (key, value) in object.iter().filter(|(k, _)| k.starts_with("x-")) {
            let mut named = Message::default();
            named.string(1, key);
            named.message(2, any(value));
            self.message(field, named);
        }
    }
}

/// `Any { yaml }`: the value's JSON, which is YAML.
fn any(value: &Value) -> Message {
    let mut message = Message::default();
    message.string(2, &value.to_string());
    message
}

fn object(value: &Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

/// `openapi.v2.Schema`.
fn schema(value: &Value) -> Message {
    let s = object(value);
    let mut m = Message::default();
    m.string_of(1, &s, "$ref");
    m.string_of(2, &s, "format");
    m.string_of(3, &s, "title");
    m.string_of(4, &s, "description");
    if let Some(default) = s.get("default") {
        m.message(5, any(default));
    }
    m.double_of(6, &s, "multipleOf");
    m.double_of(7, &s, "maximum");
    m.bool_of(8, &s, "exclusiveMaximum");
    m.double_of(9, &s, "minimum");
    m.bool_of(10, &s, "exclusiveMinimum");
    m.int_of(11, &s, "maxLength");
    m.int_of(12, &s, "minLength");
    m.string_of(13, &s, "pattern");
    m.int_of(14, &s, "maxItems");
    m.int_of(15, &s, "minItems");
    m.bool_of(16, &s, "uniqueItems");
    m.int_of(17, &s, "maxProperties");
    m.int_of(18, &s, "minProperties");
    m.strings_of(19, &s, "required");
    for value in s
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(20, any(value));
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(allowed)) => {
            let mut item = Message::default();
            item.boolean(2, *allowed);
            m.message(21, item);
        }
        Some(inner @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(inner));
            m.message(21, item);
        }
        _ => {}
    }
    match s.get("type") {
        Some(Value::String(kind)) => {
            let mut item = Message::default();
            item.string(1, kind);
            m.message(22, item);
        }
        Some(Value::Array(kinds)) => {
            let mut item = Message::default();
            for kind in kinds.iter().filter_map(Value::as_str) {
                item.string(1, kind);
            }
            m.message(22, item);
        }
        _ => {}
    }
    match s.get("items") {
        Some(inner @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(inner));
            m.message(23, item);
        }
        Some(Value::Array(list)) => {
            let mut item = Message::default();
            for inner in list {
                item.message(1, schema(inner));
            }
            m.message(23, item);
        }
        _ => {}
    }
    if let Some(Value::Object(properties)) = s.get("properties") {
        let mut all = Message::default();
        for (name, inner) in properties {
            all.message(1, named(name, schema(inner)));
        }
        m.message(25, all);
    }
    m.bool_of(27, &s, "readOnly");
    if let Some(example) = s.get("example") {
        m.message(30, any(example));
    }
    m.extensions(31, &s);
    m
}

fn named(name: &str, value: Message) -> Message {
    let mut m = Message::default();
    m.string(1, name);
    m.message(2, value);
    m
}

/// `openapi.v2.ParametersItem` for one Swagger 2.0 parameter.
fn parameter(value: &Value) -> Message {
    let p = object(value);
    let mut inner = Message::default();
    let wrapped = if p.get("in").and_then(Value::as_str) == Some("body") {
        inner.string_of(1, &p, "description");
        inner.string_of(2, &p, "name");
        inner.string_of(3, &p, "in");
        inner.bool_of(4, &p, "required");
        if let Some(s) = p.get("schema") {
            inner.message(5, schema(s));
        }
        inner.extensions(6, &p);
        let mut parameter = Message::default();
        parameter.message(1, inner);
        parameter
    } else {
        // Query and path parameters share the first fields; then `type` is 6 or 5.
        let query = p.get("in").and_then(Value::as_str) != Some("path");
        inner.bool_of(1, &p, "required");
        inner.string_of(2, &p, "in");
        inner.string_of(3, &p, "description");
        inner.string_of(4, &p, "name");
        let (type_field, unique_field) = if query { (6, 20) } else { (5, 19) };
        inner.string_of(type_field, &p, "type");
        inner.string_of(type_field + 1, &p, "format");
        inner.bool_of(unique_field, &p, "uniqueItems");
        let mut non_body = Message::default();
        non_body.message(if query { 3 } else { 4 }, inner);
        let mut parameter = Message::default();
        parameter.message(2, non_body);
        parameter
    };
    let mut item = Message::default();
    item.message(1, wrapped);
    item
}

/// `openapi.v2.Operation`.
fn operation(value: &Value) -> Message {
    let o = object(value);
    let mut m = Message::default();
    m.strings_of(1, &o, "tags");
    m.string_of(2, &o, "summary");
    m.string_of(3, &o, "description");
    m.string_of(5, &o, "operationId");
    m.strings_of(6, &o, "produces");
    m.strings_of(7, &o, "consumes");
    for p in o
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(8, parameter(p));
    }
    if let Some(Value::Object(responses)) = o.get("responses") {
        let mut all = Message::default();
        for (code, response) in responses {
            let r = object(response);
            let mut body = Message::default();
            body.string_of(1, &r, "description");
            if let Some(s) = r.get("schema") {
                let mut item = Message::default();
                item.message(1, schema(s));
                body.message(2, item);
            }
            let mut value = Message::default();
            value.message(1, body);
            all.message(1, named(code, value));
        }
        m.message(9, all);
    }
    m.strings_of(10, &o, "schemes");
    m.extensions(13, &o);
    m
}

/// `openapi.v2.PathItem`.
fn path_item(value: &Value) -> Message {
    let item = object(value);
    let mut m = Message::default();
    for (field, verb) in [
        (2, "get"),
        (3, "put"),
        (4, "post"),
        (5, "delete"),
        (6, "options"),
        (7, "head"),
        (8, "patch"),
    ] {
        if let Some(op) = item.get(verb) {
            m.message(field, operation(op));
        }
    }
    for p in item
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(9, parameter(p));
    }
    m.extensions(10, &item);
    m
}

/// The Swagger 2.0 document (as [`super::v2`] builds it) as an `openapi.v2.Document`.
pub(crate) fn encode(document: &Value) -> Vec<u8> {
    let d = object(document);
    let mut m = Message::default();
    m.string_of(1, &d, "swagger");
    if let Some(info) = d.get("info") {
        let i = object(info);
        let mut message = Message::default();
        message.string_of(1, &i, "title");
        message.string_of(2, &i, "version");
        m.message(2, message);
    }
    if let Some(Value::Object(paths)) = d.get("paths") {
        let mut all = Message::default();
        for (path, item) in paths {
            all.message(2, named(path, path_item(item)));
        }
        m.message(8, all);
    }
    if let Some(Value::Object(definitions)) = d.get("definitions") {
        let mut all = Message::default();
        for (name, s) in definitions {
            all.message(1, named(name, schema(s)));
        }
        m.message(9, all);
    }
    m.extensions(16, &d);
    m.0
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The fields of one message: (number, wire type, payload) where the payload of a varint is
    /// its value's bytes as written.
    fn fields(mut bytes: &[u8]) -> Vec<(u64, u8, Vec<u8>)> {
        fn varint(bytes: &mut &[u8]) -> u64 {
            let mut value = 0;
            let mut shift = 0;
            loop {
                let byte = bytes[0];
                *bytes = &bytes[1..];
                value |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    return value;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let key = varint(&mut bytes);
            let wire = (key & 7) as u8;
            let payload = match wire {
                0 => varint(&mut bytes).to_le_bytes().to_vec(),
                1 => {
                    let (head, rest) = bytes.split_at(8);
                    bytes = rest;
                    head.to_vec()
                }
                2 => {
                    let len = usize::try_from(varint(&mut bytes)).unwrap();
                    let (head, rest) = bytes.split_at(len);
                    bytes = rest;
                    head.to_vec()
                }
                other => panic!("wire type {other}"),
            };
            out.push((key >> 3, wire, payload));
        }
        out
    }

    fn field(bytes: &[u8], number: u64) -> Vec<Vec<u8>> {
        fields(bytes)
            .into_iter()
            .filter(|(n, _, _)| *n == number)
            .map(|(_, _, p)| p)
            .collect()
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_document_encodes_as_gnostics_openapi_v2_message() {
        let document = json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.34.0"},
            "paths": {"/api/v1/namespaces/{namespace}/configmaps/{name}": {
                "parameters": [{"name": "name", "in": "path", "required": true, "type": "string"}],
                "patch": {
                    "operationId": "patchConfigMap",
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "type": "string"},
                        {"name": "body", "in": "body", "required": true,
                         "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMap"}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                },
            }},
            "definitions": {"io.k8s.api.core.v1.ConfigMap": {
                "type": "object",
                "required": ["data"],
                "properties": {
                    "data": {"type": "object", "additionalProperties": {"type": "string"}},
                    "immutable": {"type": "boolean"},
                    "size": {"type": "integer", "maximum": 3.5, "minLength": 300},
                },
                "x-kubernetes-group-version-kind": [{"group": "", "kind": "ConfigMap", "version": "v1"}],
            }},
        });
        let bytes = encode(&document);
        assert_eq!(text(&field(&bytes, 1)[0]), "2.0");
        assert_eq!(text(&field(&field(&bytes, 2)[0], 2)[0]), "v1.34.0");

        let definitions = &field(&bytes, 9)[0];
        let named = &field(definitions, 1)[0];
        assert_eq!(text(&field(named, 1)[0]), "io.k8s.api.core.v1.ConfigMap");
        let schema = &field(named, 2)[0];
        assert_eq!(text(&field(&field(schema, 22)[0], 1)[0]), "object");
        assert_eq!(text(&field(schema, 19)[0]), "data");
        let extension = &field(schema, 31)[0];
        assert_eq!(
            text(&field(extension, 1)[0]),
            "x-kubernetes-group-version-kind"
        );
        let yaml = text(&field(&field(extension, 2)[0], 2)[0]).to_string();
        assert_eq!(
            serde_json::from_str::<Value>(&yaml).unwrap()[0]["kind"],
            "ConfigMap"
        );
        let properties: Vec<String> = field(&field(schema, 25)[0], 1)
            .iter()
            .map(|p| text(&field(p, 1)[0]).to_string())
            .collect();
        assert_eq!(properties, ["data", "immutable", "size"]);
        let size = &field(&field(&field(schema, 25)[0], 1)[2], 2)[0];
        assert_eq!(field(size, 7)[0], 3.5_f64.to_le_bytes());
        assert_eq!(field(size, 12)[0], 300_u64.to_le_bytes());
        let data = &field(&field(&field(schema, 25)[0], 1)[0], 2)[0];
        let additional = &field(&field(data, 21)[0], 1)[0];
        assert_eq!(text(&field(&field(additional, 22)[0], 1)[0]), "string");

        let path = &field(&field(&bytes, 8)[0], 2)[0];
        assert_eq!(
            text(&field(path, 1)[0]),
            "/api/v1/namespaces/{namespace}/configmaps/{name}"
        );
        let item = &field(path, 2)[0];
        let path_parameter = &field(&field(&field(&field(item, 9)[0], 1)[0], 2)[0], 4)[0];
        assert_eq!(text(&field(path_parameter, 4)[0]), "name");
        let patch = &field(item, 8)[0];
        assert_eq!(text(&field(patch, 5)[0]), "patchConfigMap");
        let parameters = field(patch, 8);
        let query = &field(&field(&field(&parameters[0], 1)[0], 2)[0], 3)[0];
        assert_eq!(text(&field(query, 4)[0]), "fieldValidation");
        assert_eq!(text(&field(query, 6)[0]), "string");
        let body = &field(&field(&parameters[1], 1)[0], 1)[0];
        assert_eq!(text(&field(body, 3)[0]), "body");
        let reference = &field(body, 5)[0];
        assert_eq!(
            text(&field(reference, 1)[0]),
            "#/definitions/io.k8s.api.core.v1.ConfigMap"
        );
        assert_eq!(
            text(&field(&field(patch, 13)[0], 1)[0]),
            "x-kubernetes-action"
        );
    }
}
