//! `egress-operator`: the operator binary and its command line.

use std::process::ExitCode;

fn main() -> ExitCode {
    // SIGPIPE stays ignored, as Rust sets it: with its default action, a write to a socket whose
    // peer went away (a kube-apiserver or a hypervisor killed mid-request) killed the operator
    // without a word. Like other command-line tools, end quietly instead when the reader of stdout
    // goes away (`inspect … | head`): that write's panic exits as SIGPIPE would have, silently.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            // 128 + SIGPIPE, what a shell reports for a command its pipe ended.
            std::process::exit(141);
        }
        default_hook(info);
    }));
    egress_operator::cli::main()
}
