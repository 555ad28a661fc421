//! Removing an injected secret from a response before the guest sees it.
//!
//! A server may echo what it received (an error page quoting the request, a debug header). The
//! broker replaces every occurrence of the secret, of the injected header value, and of their
//! base64 forms (standard and URL-safe alphabets, unpadded) with `[redacted]`, in header values,
//! body and trailers.
//!
//! The body is redacted while it streams: each chunk is scanned together with the last
//! `longest pattern - 1` bytes held back from the previous chunk, so an occurrence split across
//! chunk boundaries is still found. Memory stays one chunk plus that tail, whatever the body size.
//!
//! Limits: base64 of a longer string that merely contains the secret (for example
//! `base64("user:secret")`) is not recognised unless aligned; percent-encoded echoes are not
//! recognised.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use memchr::memmem;
use zeroize::Zeroizing;

/// What an echoed secret is replaced with.
pub const REDACTED: &[u8] = b"[redacted]";

/// The byte patterns to remove for one request's secret.
pub struct Redactor {
    /// Longest first, so that a longer pattern wins over a shorter one starting at the same byte.
    patterns: Vec<Zeroizing<Vec<u8>>>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Redactor({} patterns)", self.patterns.len())
    }
}

impl Redactor {
    /// Patterns for `secret` and for the header value it was injected as.
    pub fn new(secret: &str, header_value: &str) -> Self {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for plain in [secret, header_value] {
            patterns.push(Zeroizing::new(plain.as_bytes().to_vec()));
            patterns.push(Zeroizing::new(STANDARD_NO_PAD.encode(plain).into_bytes()));
            patterns.push(Zeroizing::new(URL_SAFE_NO_PAD.encode(plain).into_bytes()));
        }
        patterns.retain(|pattern| !pattern.is_empty());
        patterns.sort_by(|a, b| {
            b.len()
                .cmp(&a.len())
                .then_with(|| a.as_slice().cmp(b.as_slice()))
        });
        patterns.dedup_by(|a, b| a.as_slice() == b.as_slice());
        Self { patterns }
    }

    fn longest(&self) -> usize {
        self.patterns.first().map_or(0, |pattern| pattern.len())
    }

    /// The earliest occurrence of any pattern in `haystack` at or after `from`: (start, length).
    fn next_match(&self, haystack: &[u8], from: usize) -> Option<(usize, usize)> {
        self.patterns
            .iter()
            .filter_map(|pattern| {
                memmem::find(&haystack[from..], pattern).map(|at| (from + at, pattern.len()))
            })
            // Earliest start; at equal starts the longer pattern (listed first) wins.
            .min_by_key(|&(start, len)| (start, usize::MAX - len))
    }

    /// `data` with every occurrence replaced, or `None` when there is none.
    pub fn redact(&self, data: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let mut done = 0;
        while let Some((start, len)) = self.next_match(data, done) {
            out.extend_from_slice(&data[done..start]);
            out.extend_from_slice(REDACTED);
            done = start + len;
        }
        if done == 0 {
            return None;
        }
        out.extend_from_slice(&data[done..]);
        Some(out)
    }

    /// A redactor for one streamed body.
    pub fn stream(self) -> StreamRedactor {
        StreamRedactor {
            redactor: self,
            held: BytesMut::new(),
        }
    }
}

/// Redacts a body chunk by chunk, holding back just enough bytes to catch a split occurrence.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Redactor,
    /// Raw bytes not yet emitted: possibly the start of an occurrence.
    held: BytesMut,
}

impl StreamRedactor {
    /// Takes the next chunk; returns what can be emitted now.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.held.extend_from_slice(chunk);
        let data = &self.held[..];
        let mut out = BytesMut::with_capacity(data.len());
        let mut done = 0;
        while let Some((start, len)) = self.redactor.next_match(data, done) {
            out.extend_from_slice(&data[done..start]);
            out.extend_from_slice(REDACTED);
            done = start + len;
        }
        // Whatever is left holds no whole occurrence; its last `longest - 1` bytes may begin one.
        let keep = self.redactor.longest().saturating_sub(1);
        let emit_until = done.max(data.len().saturating_sub(keep));
        out.extend_from_slice(&data[done..emit_until]);
        self.held.advance(emit_until);
        out.freeze()
    }

    /// The patterns this stream removes.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Ends the body; returns the held-back tail (which holds no occurrence).
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

/// Redacts every header value in place. A value that contained the secret becomes a valid value
/// (the replacement is plain ASCII) and is marked sensitive.
pub fn redact_headers(redactor: &Redactor, headers: &mut HeaderMap) {
    for value in headers.values_mut() {
        if let Some(clean) = redactor.redact(value.as_bytes()) {
            // Removing bytes from a valid value and inserting ASCII keeps it valid.
            if let Ok(mut clean) = HeaderValue::from_bytes(&clean) {
                clean.set_sensitive(true);
                *value = clean;
            } else {
                *value = HeaderValue::from_static("[redacted]");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "root@pam!op=0f1e2d3c-aaaa-bbbb-cccc-1234567890ab";

    fn redactor() -> Redactor {
        Redactor::new(SECRET, &format!("PVEAPIToken={SECRET}"))
    }

    #[test]
    fn replaces_plain_and_base64_forms() {
        let b64 = STANDARD_NO_PAD.encode(SECRET);
        let text = format!("a {SECRET} b {b64} c PVEAPIToken={SECRET}");
        let out = String::from_utf8(redactor().redact(text.as_bytes()).unwrap()).unwrap();
        assert_eq!(out, "a [redacted] b [redacted] c [redacted]");
        assert_eq!(redactor().redact(b"nothing here"), None);
    }

    #[test]
    fn both_base64_alphabets_are_replaced() {
        // This secret's standard and URL-safe encodings differ ('+' and '/' against '-' and '_').
        let secret = "k??>?>~~";
        let standard = STANDARD_NO_PAD.encode(secret);
        let url_safe = URL_SAFE_NO_PAD.encode(secret);
        assert_ne!(standard, url_safe);
        let redactor = Redactor::new(secret, secret);
        for form in [standard, url_safe] {
            assert_eq!(
                redactor.redact(form.as_bytes()).unwrap(),
                REDACTED,
                "{form}"
            );
        }
    }

    #[test]
    fn streaming_catches_occurrences_split_at_every_boundary() {
        let body = format!("{{\"echo\":\"PVEAPIToken={SECRET}\",\"again\":\"{SECRET}\"}}");
        let expected = String::from_utf8(redactor().redact(body.as_bytes()).unwrap()).unwrap();
        for chunk_size in 1..body.len() {
            let mut stream = redactor().stream();
            let mut out = Vec::new();
            for chunk in body.as_bytes().chunks(chunk_size) {
                out.extend_from_slice(&stream.push(chunk));
            }
            out.extend_from_slice(&stream.finish());
            assert_eq!(
                String::from_utf8(out).unwrap(),
                expected,
                "chunk size {chunk_size}"
            );
        }
    }

    #[test]
    fn streaming_passes_clean_bodies_through_unchanged() {
        let mut stream = redactor().stream();
        let body = b"x".repeat(10_000);
        let mut out = Vec::new();
        for chunk in body.chunks(333) {
            out.extend_from_slice(&stream.push(chunk));
        }
        out.extend_from_slice(&stream.finish());
        assert_eq!(out, body);
    }
}
