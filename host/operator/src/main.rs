//! `egress-operator`: the operator binary and its command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    // Like other command-line tools, end quietly when the reader of stdout goes away
    // (`inspect … | head`) instead of panicking on the write: Rust ignores SIGPIPE by default.
    // SAFETY: called first thing, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    egress_operator::cli::main()
}
