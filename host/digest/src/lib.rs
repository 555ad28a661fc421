//! # egress-digest: one type for a sha256 digest
//!
//! A component's digest reaches the host in two written forms: bare lowercase hex (a file name,
//! the compile cache, a grant's pins) and `sha256:<hex>` (OCI references and descriptors, the
//! Kubernetes status). [`Digest`] is the value behind both: [`Digest::of`] hashes bytes,
//! [`Digest::parse`] reads either form, [`Display`](std::fmt::Display) writes `sha256:<hex>` and
//! [`Digest::hex`] the bare hex.
//!
//! A leaf crate, so that `egress-distribution` shares the type without depending on the runtime
//! (and wasmtime); `egress-runtime` re-exports it as `egress_runtime::Digest`.
//!
//! ```
//! use egress_digest::Digest;
//!
//! let digest = Digest::of(b"abc");
//! let hex = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
//! assert_eq!(digest.hex(), hex);
//! assert_eq!(digest.to_string(), format!("sha256:{hex}"));
//! assert_eq!(Digest::parse(hex), Ok(digest));
//! assert_eq!(format!("sha256:{hex}").parse(), Ok(digest));
//! ```

#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

/// The only algorithm there is, as the written form names it before its `:`.
const ALGORITHM: &str = "sha256";

/// A sha256 digest.
///
/// Parsed from `sha256:<64 hex digits>` or the 64 hex digits alone; upper-case hex digits are
/// accepted (a digest typed by hand), the prefix only in lower case, as OCI writes it. Written
/// back always in lower case, so parsing and writing normalises.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The sha256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// Read `text`: `sha256:<64 hex digits>` or the 64 hex digits alone.
    pub fn parse(text: &str) -> Result<Digest, ParseDigestError> {
        let refused = |problem| ParseDigestError {
            text: text.to_owned(),
            problem,
        };
        let hex = match text.split_once(':') {
            Some((ALGORITHM, hex)) => hex,
            Some((algorithm, _)) => return Err(refused(Problem::Algorithm(algorithm.to_owned()))),
            None => text,
        };
        if let Some(digit) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(refused(Problem::NotHex(digit)));
        }
        let mut bytes = [0; 32];
        // Every character is a hex digit by now: only the length can be wrong.
        hex::decode_to_slice(hex, &mut bytes).map_err(|_| refused(Problem::Length(hex.len())))?;
        Ok(Digest(bytes))
    }

    /// The 64 lowercase hex digits alone, without `sha256:`: for file names and the formats that
    /// carry bare hex.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl FromStr for Digest {
    type Err = ParseDigestError;

    /// As [`Digest::parse`].
    fn from_str(text: &str) -> Result<Digest, ParseDigestError> {
        Digest::parse(text)
    }
}

/// `sha256:<64 lowercase hex digits>`.
impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{ALGORITHM}:")?;
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a text is not a sha256 digest. Its message quotes the text, says what is wrong with it and
/// what a digest looks like.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a sha256 digest: {problem}; expected sha256:<64 hex digits> or the 64 hex digits alone"
)]
pub struct ParseDigestError {
    text: String,
    problem: Problem,
}

/// What is wrong with a text that is not a digest.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum Problem {
    #[error("the algorithm is {0:?}, not \"sha256\"")]
    Algorithm(String),
    #[error("{0:?} is not a hex digit")]
    NotHex(char),
    #[error("{0} hex digits")]
    Length(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    fn problem(text: &str) -> Problem {
        Digest::parse(text).unwrap_err().problem
    }

    #[test]
    fn of_hashes_with_sha256() {
        assert_eq!(Digest::of(b"abc").hex(), ABC);
    }

    #[test]
    fn both_written_forms_parse_to_one_digest() {
        let digest = Digest::of(b"abc");
        assert_eq!(Digest::parse(ABC), Ok(digest));
        assert_eq!(Digest::parse(&format!("sha256:{ABC}")), Ok(digest));
        assert_eq!(ABC.parse::<Digest>(), Ok(digest));
    }

    #[test]
    fn display_writes_the_prefixed_form_and_round_trips() {
        let digest = Digest::of(b"abc");
        assert_eq!(digest.to_string(), format!("sha256:{ABC}"));
        assert_eq!(format!("{digest:?}"), format!("sha256:{ABC}"));
        assert_eq!(digest.to_string().parse(), Ok(digest));
        assert_eq!(Digest::parse(&digest.hex()), Ok(digest));
    }

    #[test]
    fn upper_case_hex_is_read_and_written_back_in_lower_case() {
        let upper = format!("sha256:{}", ABC.to_uppercase());
        let digest = Digest::parse(&upper).expect("upper-case hex digits are accepted");
        assert_eq!(digest, Digest::of(b"abc"));
        assert_eq!(digest.to_string(), format!("sha256:{ABC}"));
    }

    #[test]
    fn other_forms_are_refused_saying_what_is_wrong() {
        let short = format!("sha256:{}", &ABC[..62]);
        assert_eq!(problem(&short), Problem::Length(62));
        assert_eq!(problem(&format!("{ABC}00")), Problem::Length(66));
        assert_eq!(problem(""), Problem::Length(0));
        assert_eq!(problem("sha256:"), Problem::Length(0));
        assert_eq!(problem(&format!("{}zz", &ABC[..62])), Problem::NotHex('z'));
        assert_eq!(problem(&format!(" {ABC}")), Problem::NotHex(' '));
        assert_eq!(
            problem(&format!("sha256:sha256:{ABC}")),
            Problem::NotHex('s')
        );
        assert_eq!(
            problem(&format!("sha512:{ABC}")),
            Problem::Algorithm("sha512".into())
        );
        assert_eq!(
            problem(&format!("SHA256:{ABC}")),
            Problem::Algorithm("SHA256".into())
        );
    }

    #[test]
    fn the_error_quotes_the_text_and_says_what_a_digest_looks_like() {
        let error = Digest::parse("sha256:12").unwrap_err();
        assert_eq!(
            error.to_string(),
            "\"sha256:12\" is not a sha256 digest: 2 hex digits; expected sha256:<64 hex digits> or the 64 hex digits alone"
        );
        let error = Digest::parse("md5:ab\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "\"md5:ab\\n\" is not a sha256 digest: the algorithm is \"md5\", not \"sha256\"; expected sha256:<64 hex digits> or the 64 hex digits alone"
        );
    }
}
