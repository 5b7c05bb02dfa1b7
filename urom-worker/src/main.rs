//! `urom-worker`: see the library documentation, or run `urom-worker --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = urom_worker::Args::parse();
    match urom_worker::run(args.into()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("urom-worker: {e}");
            ExitCode::FAILURE
        }
    }
}
