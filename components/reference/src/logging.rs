//! The `log` import: structured log lines that land in the host's tracing, inside the span of
//! the current call (the host adds provider, version, operation and proxy name).

use crate::egress::provider::log::{self, Field, Level};

/// Log at info level with `key = value` fields.
pub fn info(message: &str, fields: &[(&str, &str)]) {
    emit(Level::Info, message, fields);
}

/// Log at debug level with `key = value` fields.
pub fn debug(message: &str, fields: &[(&str, &str)]) {
    emit(Level::Debug, message, fields);
}

fn emit(level: Level, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<Field> = fields
        .iter()
        .map(|(key, value)| Field {
            key: key.to_string(),
            value: value.to_string(),
        })
        .collect();
    log::emit(level, message, &fields);
}
