//! `egress-operator`: the operator binary and its command line.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
