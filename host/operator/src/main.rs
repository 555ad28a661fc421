//! `egress-operator`: the operator binary and its command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    egress_operator::cli::main()
}
