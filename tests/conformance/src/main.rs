//! `genesis-conformance`: see the library's `cli` module for the flags.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(genesis_conformance::cli::main(&args));
}
