//! The log interface: a guest's log lines, bounded and escaped, as `tracing` events.
//!
//! One implementation serves the interface under every name a contract version gives it:
//! `egress:provider/log@0.1.0` (contract 0.1.0's own) and `egress:log/log@0.1.0` (its own package
//! from contract 0.2.0 on); see `wit::LOG_INTERFACES`. It is defined by hand rather than through
//! `bindgen!`, which would lift a guest's whole message into the host before the host could cut
//! it.
//!
//! A guest's line is data from an untrusted party on its way to an operator's log and terminal, so:
//!
//! - **Bounded before it is read.** The message and fields arrive as lazy views into guest memory
//!   (`WasmStr`, `WasmList`): the host copies at most 4 KiB of a message, 32 fields, 128 bytes of a
//!   key and 1 KiB of a value, never the whole of what the guest passed. Lines and kept bytes per
//!   call are budgeted ([`crate::Limits::log_lines`], [`crate::Limits::log_bytes`]); past either,
//!   the call is stopped. (wasmtime's hostcall fuel, [`crate::Limits::transfer_bytes`], refuses an
//!   argument too big to even look at.)
//! - **Escaped.** Control characters (newline, carriage return, escape, …) and the Unicode
//!   direction overrides become visible escapes (`\n`, `\u{1b}`), so a guest cannot start a forged
//!   line in the host's log or send a sequence to a terminal.
//! - **Attributed.** Every event carries the provider's host-assigned identity (`provider`) and
//!   the operation, whatever the log level of the surrounding span.

use std::borrow::Cow;
use std::fmt::Write;

use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, Linker, WasmList, WasmStr};

use crate::egress::CallSite;
use crate::error::Budget;
use crate::limits::Limits;

/// Longest guest log message kept, in bytes; the rest is cut.
pub(crate) const MAX_MESSAGE: usize = 4 * 1024;
/// Fields kept per line.
const MAX_FIELDS: usize = 32;
/// Longest field key kept, in bytes.
const MAX_KEY: usize = 128;
/// Longest field value kept, in bytes.
const MAX_VALUE: usize = 1024;

/// The contract's `log.level`.
// Its values are made by lifting them from the guest, which the compiler cannot see.
#[allow(dead_code)]
#[derive(ComponentType, Lift, Clone, Copy, Debug, PartialEq, Eq)]
#[component(enum)]
#[repr(u8)]
enum Level {
    #[component(name = "trace")]
    Trace,
    #[component(name = "debug")]
    Debug,
    #[component(name = "info")]
    Info,
    #[component(name = "warn")]
    Warn,
    #[component(name = "error")]
    Error,
}

/// The contract's `log.field`, left in guest memory until read.
#[derive(ComponentType, Lift)]
#[component(record)]
struct Field {
    key: WasmStr,
    value: WasmStr,
}

/// What one call has logged, against its budget.
pub(crate) struct LogBudget {
    site: CallSite,
    lines: usize,
    bytes: usize,
    max_lines: usize,
    max_bytes: usize,
}

impl LogBudget {
    pub(crate) fn new(site: CallSite, limits: &Limits) -> LogBudget {
        LogBudget {
            site,
            lines: 0,
            bytes: 0,
            max_lines: limits.log_lines_limit(),
            max_bytes: limits.log_bytes_limit(),
        }
    }
}

/// Store data that has a log budget; implemented by the runtime's call state.
pub(crate) trait LogView {
    /// This call's log budget.
    fn log_budget(&mut self) -> &mut LogBudget;
    /// Record that the call exceeded `budget`, so it fails with that budget's error.
    fn exceeded(&mut self, budget: Budget, limit: u64);
}

/// Define `emit` of the log interface named `interface` (for example
/// `egress:provider/log@0.1.0`) in `linker`.
pub(crate) fn add_to_linker<T: LogView + 'static>(
    linker: &mut Linker<T>,
    interface: &str,
) -> wasmtime::Result<()> {
    linker.instance(interface)?.func_wrap(
        "emit",
        |store: StoreContextMut<'_, T>,
         (level, message, fields): (Level, WasmStr, WasmList<Field>)| {
            emit(store, level, &message, &fields)
        },
    )
}

fn emit<T: LogView + 'static>(
    mut store: StoreContextMut<'_, T>,
    level: Level,
    message: &WasmStr,
    fields: &WasmList<Field>,
) -> wasmtime::Result<()> {
    let message = escape(prefix(&message.to_str(&store)?, MAX_MESSAGE)).into_owned();
    let rendered = render_fields(&mut store, fields)?;
    let state = store.data_mut();
    charge(state, message.len() + rendered.len())?;
    trace_line(&state.log_budget().site, level, &message, &rendered);
    Ok(())
}

/// The first [`MAX_FIELDS`] of `fields` as `key=value` pairs, each bounded and escaped, and how
/// many more were cut.
fn render_fields<T: 'static>(
    store: &mut StoreContextMut<'_, T>,
    fields: &WasmList<Field>,
) -> wasmtime::Result<String> {
    let mut rendered = String::new();
    for index in 0..fields.len().min(MAX_FIELDS) {
        let Some(field) = fields.get(&mut *store, index) else {
            break;
        };
        let field = field?;
        let key = escape(prefix(&field.key.to_str(&*store)?, MAX_KEY)).into_owned();
        let value = field.value.to_str(&*store)?;
        if !rendered.is_empty() {
            rendered.push(' ');
        }
        render_field(&mut rendered, &key, prefix(&value, MAX_VALUE));
    }
    if fields.len() > MAX_FIELDS {
        let _ = write!(rendered, " (+{} fields cut)", fields.len() - MAX_FIELDS);
    }
    Ok(rendered)
}

/// Count one line of `bytes` against the call's log budget; past it, the call is stopped.
fn charge<T: LogView>(state: &mut T, bytes: usize) -> wasmtime::Result<()> {
    let budget = state.log_budget();
    budget.lines += 1;
    budget.bytes += bytes;
    let exceeded = if budget.lines > budget.max_lines {
        Some((Budget::LogLines, budget.max_lines as u64))
    } else if budget.bytes > budget.max_bytes {
        Some((Budget::LogBytes, budget.max_bytes as u64))
    } else {
        None
    };
    if let Some((kind, limit)) = exceeded {
        state.exceeded(kind, limit);
        return Err(crate::error::BudgetExceeded {
            budget: kind,
            limit,
        }
        .into());
    }
    Ok(())
}

/// One guest line as a `tracing` event at its level, attributed to the call's `site`.
fn trace_line(site: &CallSite, level: Level, message: &str, rendered: &str) {
    let (provider, operation) = (&*site.provider, site.operation);
    // Emitted inside the call's `provider_call` span (version, proxy, generation), and carrying
    // the provider and operation itself so a line is attributed at any level.
    match level {
        Level::Trace => {
            tracing::trace!(target: "egress_runtime::guest", provider, operation, fields = %rendered, "{message}")
        }
        Level::Debug => {
            tracing::debug!(target: "egress_runtime::guest", provider, operation, fields = %rendered, "{message}")
        }
        Level::Info => {
            tracing::info!(target: "egress_runtime::guest", provider, operation, fields = %rendered, "{message}")
        }
        Level::Warn => {
            tracing::warn!(target: "egress_runtime::guest", provider, operation, fields = %rendered, "{message}")
        }
        Level::Error => {
            tracing::error!(target: "egress_runtime::guest", provider, operation, fields = %rendered, "{message}")
        }
    }
}

/// Append `key=value`; a value that is empty or holds whitespace, quotes or `=` is quoted, and
/// control characters are escaped either way.
fn render_field(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push('=');
    if value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '"' || c == '=') {
        out.push('"');
        for c in value.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if needs_escape(c) => push_escaped(out, c),
                c => out.push(c),
            }
        }
        out.push('"');
    } else {
        out.push_str(&escape(value));
    }
}

/// Whether `c` must not reach a log sink as is: control characters (C0, DEL, C1) and the Unicode
/// marks that reorder a terminal line.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

/// `text` with every character [`needs_escape`] names replaced by a visible escape.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    if !text.contains(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
pub(crate) fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_render_as_key_value_pairs_quoting_when_needed() {
        let mut rendered = String::new();
        for (key, value) in [
            ("node", "pve1"),
            ("vmid", "123"),
            ("reason", "lock held"),
            ("empty", ""),
        ] {
            if !rendered.is_empty() {
                rendered.push(' ');
            }
            render_field(&mut rendered, key, value);
        }
        assert_eq!(
            rendered,
            r#"node=pve1 vmid=123 reason="lock held" empty="""#
        );
    }

    #[test]
    fn control_characters_and_direction_marks_become_visible_escapes() {
        assert_eq!(escape("plain text"), "plain text");
        assert_eq!(
            escape("ok\n2026-11-30T00:00:00Z  INFO forged"),
            "ok\\n2026-11-30T00:00:00Z  INFO forged"
        );
        assert_eq!(escape("a\r\tb"), "a\\r\\tb");
        assert_eq!(escape("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(escape("x\u{7f}\u{9b}y"), "x\\u{7f}\\u{9b}y");
        assert_eq!(escape("abc\u{202e}cba"), "abc\\u{202e}cba");
        assert_eq!(escape("héllo ✓"), "héllo ✓");

        let mut quoted = String::new();
        render_field(&mut quoted, "k", "a \"b\"\n\u{1b}c");
        assert_eq!(quoted, r#"k="a \"b\"\n\u{1b}c""#);
    }

    #[test]
    fn prefix_respects_character_boundaries() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("abc", 10), "abc");
    }
}
