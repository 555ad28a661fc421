//! Removing an injected secret from a response before the guest sees it.
//!
//! A server may echo what it received: an error page quoting the request, a debug endpoint
//! reflecting headers. The broker replaces every occurrence of the secret and of the injected
//! header value with `[redacted]`, in header values, body and trailers, in the reversible forms a
//! standard server produces when it reflects a header:
//!
//! - as is;
//! - base64, standard and URL-safe alphabets, of the value alone **and inside a longer string**:
//!   for each of the three byte alignments the value can start at, the characters that depend only
//!   on the value's bytes (so `base64("Authorization: PVEAPIToken=…")` is caught too);
//! - hex (either case);
//! - percent-encoded, as URLs and forms encode it (either case of hex digits);
//! - JSON-escaped (`\/`, and the `\u00XX` escapes of HTML-safe encoders and of encoders that
//!   escape every non-alphanumeric character);
//! - HTML-escaped (named and numeric entities, as Python's and Go's escapers write them).
//!
//! Matching ignores ASCII case (hex and percent-encoding come in both cases); a false positive
//! only hides bytes that were not secret. It does so by folding: the patterns are kept in
//! lowercase and each piece of text is scanned through a lowercase copy of it (the same length,
//! so positions carry over), which finds exactly what a case-insensitive automaton finds. Folded,
//! the patterns fit aho-corasick's SIMD searcher (Teddy), which redacts a clean 4 KiB answer
//! about 5 times faster than the automaton and a 256 KiB one about 10 times (`benches/redact.rs`);
//! where it cannot be built (another CPU, too many patterns) the automaton does the same search.
//! Compressed bodies are not scanned at all: the broker asks for and accepts only the identity
//! encoding on credentialed requests (see the crate docs).
//!
//! The body is redacted while it streams: each chunk is scanned together with the last
//! `longest pattern - 1` bytes held back from the previous chunk, so an occurrence split across
//! chunk boundaries is still found. Memory stays one chunk plus that tail, whatever the body size.
//! All patterns are found in one pass (Aho-Corasick, leftmost-longest).

use std::fmt;
use std::fmt::Write as _;
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind, packed};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};
use zeroize::Zeroizing;

/// What an echoed secret is replaced with.
pub const REDACTED: &[u8] = b"[redacted]";

/// The shortest base64 fragment used as a pattern: shorter ones would hide innocent text and
/// reveal little anyway.
const MIN_FRAGMENT: usize = 8;

/// The patterns to remove for one secret. Cheap to clone (the matcher is shared).
#[derive(Clone)]
pub struct Redactor {
    /// Every form of the secret and of the header value, in lowercase, found in one
    /// leftmost-longest pass over folded text.
    matcher: Matcher,
    patterns: usize,
    longest: usize,
}

/// One search, two engines: the SIMD searcher where it can be built, else the automaton.
#[derive(Clone)]
enum Matcher {
    Packed(packed::Searcher),
    Automaton(AhoCorasick),
}

impl Matcher {
    /// The SIMD searcher, if it can be built here for these patterns.
    fn packed(patterns: &[Zeroizing<Vec<u8>>]) -> Option<Self> {
        packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostLongest)
            .builder()
            .extend(patterns.iter().map(|pattern| pattern.as_slice()))
            .build()
            .map(Self::Packed)
    }

    fn automaton(patterns: &[Zeroizing<Vec<u8>>], secret: &str) -> Self {
        // The automaton's own prefilters pick bytes that are common in JSON and slow it down.
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .prefilter(false)
            .build(patterns.iter().map(|pattern| pattern.as_slice()))
            // Built from a fixed set of non-empty byte strings: it cannot fail, and if it ever
            // did, a redactor matching nothing would leak, so match the secret alone instead.
            .unwrap_or_else(|_| {
                AhoCorasick::new([secret.to_ascii_lowercase()])
                    .expect("a single non-empty literal always builds")
            });
        Self::Automaton(automaton)
    }

    /// Calls `found` with each leftmost-longest occurrence in `folded`, in order.
    fn each(&self, folded: &[u8], mut found: impl FnMut(Range<usize>)) {
        match self {
            Self::Packed(searcher) => searcher
                .find_iter(folded)
                .for_each(|occurrence| found(occurrence.range())),
            Self::Automaton(automaton) => automaton
                .find_iter(folded)
                .for_each(|occurrence| found(occurrence.range())),
        }
    }
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let engine = match &self.matcher {
            Matcher::Packed(_) => "packed",
            Matcher::Automaton(_) => "automaton",
        };
        write!(f, "Redactor({} patterns, {engine})", self.patterns)
    }
}

impl Redactor {
    /// Patterns for `secret` and for the header value it was injected as.
    pub fn new(secret: &str, header_value: &str) -> Self {
        Self::with_engine(secret, header_value, true)
    }

    /// `packed`: use the SIMD searcher where it can be built (false only to test the automaton).
    fn with_engine(secret: &str, header_value: &str, packed: bool) -> Self {
        let mut patterns: Vec<Zeroizing<Vec<u8>>> = Vec::new();
        for plain in [secret, header_value] {
            forms(plain.as_bytes(), &mut patterns);
        }
        patterns.retain(|pattern| !pattern.is_empty());
        for pattern in &mut patterns {
            pattern.make_ascii_lowercase();
        }
        patterns.sort_by(|a, b| a.as_slice().cmp(b.as_slice()));
        patterns.dedup_by(|a, b| a.as_slice() == b.as_slice());
        let longest = patterns
            .iter()
            .map(|pattern| pattern.len())
            .max()
            .unwrap_or(0);
        Self {
            matcher: packed
                .then(|| Matcher::packed(&patterns))
                .flatten()
                .unwrap_or_else(|| Matcher::automaton(&patterns, secret)),
            patterns: patterns.len(),
            longest,
        }
    }

    fn longest(&self) -> usize {
        self.longest
    }

    /// `data` with every occurrence replaced, or `None` when there is none.
    pub fn redact(&self, data: &[u8]) -> Option<Vec<u8>> {
        self.redact_with(data, &mut Zeroizing::new(Vec::new()))
    }

    /// [`Redactor::redact`], with room for the lowercase copy reused across calls.
    fn redact_with(&self, data: &[u8], folded: &mut Vec<u8>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let done = self.replace(data, folded, &mut out);
        if done == 0 {
            return None;
        }
        out.extend_from_slice(&data[done..]);
        Some(out)
    }

    /// Puts `data` up to the end of its last occurrence into `out`, each occurrence replaced;
    /// returns where that end is (0: none). `folded` is room for the lowercase copy scanned.
    fn replace(&self, data: &[u8], folded: &mut Vec<u8>, out: &mut impl BufMut) -> usize {
        folded.clear();
        folded.extend(data.iter().map(u8::to_ascii_lowercase));
        let mut done = 0;
        self.matcher.each(folded, |found| {
            out.put_slice(&data[done..found.start]);
            out.put_slice(REDACTED);
            done = found.end;
        });
        done
    }

    /// A redactor for one streamed body.
    pub fn stream(self) -> StreamRedactor {
        StreamRedactor {
            redactor: self,
            held: BytesMut::new(),
            folded: Zeroizing::new(Vec::new()),
        }
    }
}

/// Every reversible form of `plain` a standard server writes when it reflects it.
fn forms(plain: &[u8], out: &mut Vec<Zeroizing<Vec<u8>>>) {
    out.push(Zeroizing::new(plain.to_vec()));
    for engine in [&STANDARD, &URL_SAFE] {
        out.push(Zeroizing::new(engine.encode(plain).into_bytes()));
    }
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        out.push(Zeroizing::new(engine.encode(plain).into_bytes()));
        for fragment in base64_fragments(engine, plain) {
            out.push(fragment);
        }
    }
    out.push(Zeroizing::new(hex::encode(plain).into_bytes()));
    out.push(Zeroizing::new(percent_encoded(plain, false)));
    out.push(Zeroizing::new(percent_encoded(plain, true)));
    out.push(Zeroizing::new(escaped(plain, |c| match c {
        b'/' => Some("\\/".into()),
        _ => None,
    })));
    out.push(Zeroizing::new(escaped(plain, |c| match c {
        b'<' | b'>' | b'&' | b'\'' | b'"' | b'=' | b'+' | b'/' => {
            Some(format!("\\u{:04x}", u32::from(c)))
        }
        _ => None,
    })));
    out.push(Zeroizing::new(escaped(plain, |c| {
        (!c.is_ascii_alphanumeric()).then(|| format!("\\u{:04x}", u32::from(c)))
    })));
    // Python's html.escape and Go's html.EscapeString / html/template.
    out.push(Zeroizing::new(escaped(plain, |c| match c {
        b'&' => Some("&amp;".into()),
        b'<' => Some("&lt;".into()),
        b'>' => Some("&gt;".into()),
        b'"' => Some("&quot;".into()),
        b'\'' => Some("&#x27;".into()),
        _ => None,
    })));
    out.push(Zeroizing::new(escaped(plain, |c| match c {
        b'&' => Some("&amp;".into()),
        b'<' => Some("&lt;".into()),
        b'>' => Some("&gt;".into()),
        b'"' => Some("&#34;".into()),
        b'\'' => Some("&#39;".into()),
        b'+' => Some("&#43;".into()),
        b'=' => Some("&#61;".into()),
        _ => None,
    })));
}

/// The base64 characters that depend only on `plain`'s bytes, for each of the three alignments
/// `plain` can have inside a longer encoded string.
fn base64_fragments(
    engine: &base64::engine::GeneralPurpose,
    plain: &[u8],
) -> Vec<Zeroizing<Vec<u8>>> {
    let mut fragments = Vec::new();
    for offset in 0..3usize {
        let mut shifted = Zeroizing::new(vec![0u8; offset]);
        shifted.extend_from_slice(plain);
        let encoded = Zeroizing::new(engine.encode(shifted.as_slice()).into_bytes());
        // Character i covers bits 6i..6i+6 of the shifted input; it depends on `plain` alone when
        // those bits lie inside bytes offset..offset+len.
        let first = (8 * offset).div_ceil(6);
        let end = (8 * (offset + plain.len())) / 6;
        if end > first && end - first >= MIN_FRAGMENT {
            fragments.push(Zeroizing::new(encoded[first..end].to_vec()));
        }
    }
    fragments
}

/// Percent-encoding of everything but RFC 3986's unreserved characters (`encodeURIComponent`
/// also keeps `!*'()`), with `+` for a space in the form variant.
fn percent_encoded(plain: &[u8], form: bool) -> Vec<u8> {
    let mut out = String::with_capacity(plain.len() * 3);
    for &byte in plain {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else if form && byte == b' ' {
            out.push('+');
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out.into_bytes()
}

/// `plain` with each byte `escape` names replaced by its escape.
fn escaped(plain: &[u8], escape: impl Fn(u8) -> Option<String>) -> Vec<u8> {
    let mut out = Vec::with_capacity(plain.len());
    for &byte in plain {
        match escape(byte) {
            Some(replacement) => out.extend_from_slice(replacement.as_bytes()),
            None => out.push(byte),
        }
    }
    out
}

/// Redacts a body chunk by chunk, holding back just enough bytes to catch a split occurrence.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Redactor,
    /// Raw bytes not yet emitted: possibly the start of an occurrence.
    held: BytesMut,
    /// The lowercase copy scanned, kept between chunks (zeroed on drop: it may hold a secret).
    folded: Zeroizing<Vec<u8>>,
}

impl StreamRedactor {
    /// Takes the next chunk; returns what can be emitted now.
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        self.held.extend_from_slice(chunk);
        let data = &self.held[..];
        let mut out = BytesMut::with_capacity(data.len());
        let done = self.redactor.replace(data, &mut self.folded, &mut out);
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
    let mut folded = Zeroizing::new(Vec::new());
    for value in headers.values_mut() {
        if let Some(clean) = redactor.redact_with(value.as_bytes(), &mut folded) {
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

    fn header() -> String {
        format!("PVEAPIToken={SECRET}")
    }

    fn redactor() -> Redactor {
        Redactor::new(SECRET, &header())
    }

    fn clean(text: &str) -> String {
        let out = redactor().redact(text.as_bytes());
        String::from_utf8(out.unwrap_or_else(|| text.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn replaces_plain_and_base64_forms() {
        let b64 = STANDARD_NO_PAD.encode(SECRET);
        let text = format!("a {SECRET} b {b64} c {}", header());
        assert_eq!(clean(&text), "a [redacted] b [redacted] c [redacted]");
        assert_eq!(redactor().redact(b"nothing here"), None);
    }

    #[test]
    fn both_base64_alphabets_are_replaced() {
        // This secret's standard and URL-safe encodings differ ('+' and '/' against '-' and '_').
        let secret = "k??>?>~~k??>?>~~";
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
    fn base64_of_a_longer_string_is_caught_at_every_alignment() {
        for prefix in [
            "",
            "A",
            "Au",
            "Authorization: ",
            "Authorization: x",
            "x: yz",
        ] {
            for suffix in ["", "\r\n", "\r\nAccept: */*\r\n"] {
                let reflected = format!("{prefix}{}{suffix}", header());
                for engine in [&STANDARD, &URL_SAFE, &STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
                    let encoded = engine.encode(&reflected);
                    let out = clean(&encoded);
                    assert!(out.contains("[redacted]"), "{prefix:?} {suffix:?}: {out}");
                    // What is left cannot be decoded back into the secret: all but at most three
                    // base64 characters of the header value's encoding are gone.
                    let left = out.replace("[redacted]", "");
                    let core = 4 * header().len() / 3 - 3;
                    assert!(left.len() + core <= encoded.len(), "{out}");
                }
            }
        }
    }

    #[test]
    fn hex_percent_json_and_html_echoes_are_caught() {
        let reflected = [
            hex::encode(SECRET),
            hex::encode(SECRET).to_uppercase(),
            "root%40pam%21op%3D0f1e2d3c-aaaa-bbbb-cccc-1234567890ab".to_owned(),
            "root%40pam%21op%3d0f1e2d3c-aaaa-bbbb-cccc-1234567890ab".to_owned(),
            "PVEAPIToken%3Droot%40pam%21op%3D0f1e2d3c-aaaa-bbbb-cccc-1234567890ab".to_owned(),
            "root@pam!op\\u003d0f1e2d3c-aaaa-bbbb-cccc-1234567890ab".to_owned(),
            "root\\u0040pam\\u0021op\\u003d0f1e2d3c\\u002daaaa\\u002dbbbb\\u002dcccc\\u002d1234567890ab"
                .to_owned(),
            "root@pam!op&#61;0f1e2d3c-aaaa-bbbb-cccc-1234567890ab".to_owned(),
        ];
        for form in reflected {
            let out = clean(&format!("{{\"echo\":\"{form}\"}}"));
            assert_eq!(out, "{\"echo\":\"[redacted]\"}", "{form}");
        }
        // JSON's escaped slash and HTML entities, for a secret that has those characters.
        let secret = "a/b<c>&d\"e'f+g=h1234";
        let redactor = Redactor::new(secret, secret);
        for form in [
            "a\\/b<c>&d\"e'f+g=h1234",
            "a/b&lt;c&gt;&amp;d&quot;e&#x27;f+g=h1234",
            "a/b&lt;c&gt;&amp;d&#34;e&#39;f&#43;g&#61;h1234",
            "a\\u002fb\\u003cc\\u003e\\u0026d\\u0022e\\u0027f\\u002bg\\u003dh1234",
        ] {
            assert_eq!(
                redactor.redact(form.as_bytes()).unwrap(),
                REDACTED,
                "{form}"
            );
        }
    }

    #[test]
    fn streaming_catches_occurrences_split_at_every_boundary() {
        let body = format!(
            "{{\"echo\":\"{}\",\"again\":\"{SECRET}\",\"b64\":\"{}\"}}",
            header(),
            STANDARD.encode(format!("Authorization: {}", header()))
        );
        let expected = clean(&body);
        assert_eq!(expected.matches("[redacted]").count(), 3, "{expected}");
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
    fn any_case_of_a_form_is_caught() {
        let mixed: String = SECRET
            .chars()
            .enumerate()
            .map(|(i, c)| {
                if i % 2 == 0 {
                    c.to_ascii_uppercase()
                } else {
                    c
                }
            })
            .collect();
        for form in [SECRET.to_uppercase(), mixed, header().to_lowercase()] {
            assert_eq!(clean(&format!("<{form}>")), "<[redacted]>", "{form}");
        }
    }

    /// The SIMD searcher and the automaton it falls back to find the same occurrences.
    #[test]
    fn both_engines_redact_alike() {
        let packed = redactor();
        let automaton = Redactor::with_engine(SECRET, &header(), false);
        #[cfg(target_arch = "x86_64")]
        assert!(format!("{packed:?}").contains("packed"), "{packed:?}");
        assert!(format!("{automaton:?}").contains("automaton"));
        let b64 = STANDARD.encode(format!("Authorization: {}", header()));
        let mut texts = vec![
            String::new(),
            "short".to_owned(),
            format!("{{\"echo\":\"{}\",\"b64\":\"{b64}\"}}", header()),
            format!("{}{SECRET}{}", hex::encode(SECRET), SECRET.to_uppercase()),
            format!("{}x{}", &SECRET[..20], &SECRET[20..]),
        ];
        // Every split of the header value by a near miss, and long clean stretches around it.
        let value = header();
        for cut in 1..value.len() {
            let (head, tail) = value.split_at(cut);
            texts.push(format!("{}{head}~{tail}{head}{tail}", "a".repeat(cut * 7)));
        }
        for text in &texts {
            assert_eq!(
                packed.redact(text.as_bytes()),
                automaton.redact(text.as_bytes()),
                "{text}"
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
